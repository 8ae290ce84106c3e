"""Checkpoint inspection: hashes, header checks against the architecture, malformed inputs."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest

from services.artifact_builder.errors import (
    CheckpointConfigError,
    CheckpointFileMissingError,
    CheckpointNotFoundError,
    IndexInvalidError,
    IndexMissingFileError,
    ShardInvalidError,
    ShardMissingError,
    TensorLayoutError,
)
from services.artifact_builder.snapshot import inspect_checkpoint
from tests.unit.artifact_builder.fixtures import CHAT_TEMPLATE, read_index, write_checkpoint, write_index

DENSE_GATE = "model.layers.0.mlp.gate_proj.weight"
ROUTER = "model.layers.2.mlp.gate.weight"


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_snapshot_hashes_every_file_and_records_lineage(tmp_path):
    root = write_checkpoint(tmp_path / "ck", shards=3)
    inspection = inspect_checkpoint(root, source="hf:example/tiny", revision="abc123")
    snap = inspection.snapshot
    assert inspection.valid and inspection.problems == ()
    assert snap.config_sha256 == _sha(root / "config.json")
    assert snap.tokenizer_sha256 == _sha(root / "tokenizer.json")
    assert snap.chat_template_sha256 == hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest()
    assert snap.weight_index_sha256 == _sha(root / "model.safetensors.index.json")
    assert [s.path for s in snap.shards] == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    for shard in snap.shards:
        assert shard.sha256 == _sha(root / shard.path)
        assert shard.size_bytes == (root / shard.path).stat().st_size
    assert (snap.source, snap.revision) == ("hf:example/tiny", "abc123")
    assert snap.tensor_count == len(read_index(root)["weight_map"])
    assert snap.weight_dtype == "F32" and snap.num_layers == 4


def test_snapshot_id_depends_on_content_not_location(tmp_path):
    root = write_checkpoint(tmp_path / "a")
    moved = shutil.copytree(root, tmp_path / "b")
    first = inspect_checkpoint(root).snapshot.snapshot_id
    assert inspect_checkpoint(moved, source="elsewhere").snapshot.snapshot_id == first
    other = write_checkpoint(tmp_path / "c", seed=1)
    assert inspect_checkpoint(other).snapshot.snapshot_id != first


def test_source_offsets_point_at_tensor_bytes(tmp_path):
    root = write_checkpoint(tmp_path / "ck", shards=1)
    inspection = inspect_checkpoint(root)
    assert inspection.snapshot.weight_index_sha256 == ""
    from safetensors.numpy import load_file

    arrays = load_file(str(root / "model.safetensors"))
    raw = (root / "model.safetensors").read_bytes()
    for tensor in inspection.tensors:
        assert raw[tensor.offset : tensor.offset + tensor.nbytes] == arrays[tensor.name].tobytes()


def test_missing_shard_is_its_own_error(tmp_path):
    root = write_checkpoint(tmp_path / "ck", shards=3)
    (root / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(ShardMissingError) as err:
        inspect_checkpoint(root)
    assert err.value.reason == "CHECKPOINT_SHARD_MISSING"


def test_missing_shard_is_found_even_when_the_index_forgets_it(tmp_path):
    root = write_checkpoint(tmp_path / "ck", shards=3)
    index = read_index(root)
    gone = "model-00003-of-00003.safetensors"
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != gone}
    write_index(root, index)
    (root / gone).unlink()
    with pytest.raises(ShardMissingError):
        inspect_checkpoint(root)


def test_index_pointing_at_a_missing_file_is_its_own_error(tmp_path):
    root = write_checkpoint(tmp_path / "ck", shards=2)
    index = read_index(root)
    index["weight_map"][DENSE_GATE] = "extra-weights.safetensors"
    write_index(root, index)
    with pytest.raises(IndexMissingFileError) as err:
        inspect_checkpoint(root)
    assert err.value.reason == "CHECKPOINT_INDEX_MISSING_FILE"


def test_index_disagreeing_with_shard_headers_is_rejected(tmp_path):
    root = write_checkpoint(tmp_path / "ck", shards=2)
    index = read_index(root)
    name, shard = next(iter(index["weight_map"].items()))
    index["weight_map"][name] = next(v for v in index["weight_map"].values() if v != shard)
    write_index(root, index)
    with pytest.raises(IndexInvalidError):
        inspect_checkpoint(root)
    index["weight_map"][name] = shard
    index["weight_map"]["model.layers.9.phantom.weight"] = shard
    write_index(root, index)
    with pytest.raises(IndexInvalidError, match="no shard holds"):
        inspect_checkpoint(root)


def test_index_escaping_the_checkpoint_is_rejected(tmp_path):
    root = write_checkpoint(tmp_path / "ck", shards=2)
    index = read_index(root)
    index["weight_map"][DENSE_GATE] = "../elsewhere.safetensors"
    write_index(root, index)
    with pytest.raises(IndexInvalidError):
        inspect_checkpoint(root)


def test_wrong_shape_is_reported_and_refused(tmp_path):
    def edit(tensors):
        tensors[ROUTER] = np.zeros((3, 16), dtype=np.float32)

    inspection = inspect_checkpoint(write_checkpoint(tmp_path / "ck", edit=edit))
    assert not inspection.valid
    [problem] = inspection.problems
    assert (problem.name, problem.problem) == (ROUTER, "WRONG_SHAPE")
    assert problem.expected == "F32[4, 16]" and problem.found == "F32[3, 16]"
    with pytest.raises(TensorLayoutError) as err:
        inspection.require_valid()
    assert err.value.reason == "CHECKPOINT_TENSOR_WRONG_SHAPE"


def test_missing_unexpected_and_mistyped_tensors_are_reported(tmp_path):
    def edit(tensors):
        del tensors["model.layers.3.mlp.experts.1.up_proj.weight"]
        tensors["model.layers.3.mlp.experts.9.up_proj.weight"] = np.zeros((8, 16), np.float32)
        tensors["model.norm.weight"] = tensors["model.norm.weight"].astype(np.float16)

    inspection = inspect_checkpoint(write_checkpoint(tmp_path / "ck", edit=edit))
    found = {(p.name, p.problem) for p in inspection.problems}
    assert found == {
        ("model.layers.3.mlp.experts.1.up_proj.weight", "MISSING"),
        ("model.layers.3.mlp.experts.9.up_proj.weight", "UNEXPECTED"),
        ("model.norm.weight", "WRONG_DTYPE"),
    }
    with pytest.raises(TensorLayoutError) as err:
        inspection.require_valid()
    assert err.value.reason == "CHECKPOINT_TENSOR_MISSING"


def test_tied_checkpoint_with_a_stored_head_is_unexpected(tmp_path):
    def edit(tensors):
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()

    inspection = inspect_checkpoint(write_checkpoint(tmp_path / "ck", tied=True, edit=edit))
    assert [(p.name, p.problem) for p in inspection.problems] == [("lm_head.weight", "UNEXPECTED")]


def test_truncated_shard_is_rejected(tmp_path):
    root = write_checkpoint(tmp_path / "ck", shards=2)
    shard = root / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(ShardInvalidError):
        inspect_checkpoint(root)


def test_missing_side_files_and_bad_config(tmp_path):
    with pytest.raises(CheckpointNotFoundError):
        inspect_checkpoint(tmp_path / "absent")
    root = write_checkpoint(tmp_path / "ck")
    (root / "tokenizer.json").unlink()
    with pytest.raises(CheckpointFileMissingError):
        inspect_checkpoint(root)
    root = write_checkpoint(tmp_path / "ck2")
    (root / "tokenizer_config.json").write_text(json.dumps({}))
    with pytest.raises(CheckpointFileMissingError, match="chat template"):
        inspect_checkpoint(root)
    root = write_checkpoint(tmp_path / "ck3")
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(CheckpointConfigError):
        inspect_checkpoint(root)
