"""Building stage artifacts: contents, byte identity, manifest, determinism, content addressing."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from libs.artifacts.manifest import LAYER_RANGE_CONVENTION, decode_manifest, manifest_hash
from libs.artifacts.verify import verify_artifact
from libs.common.kinds import DType
from services.artifact_builder.build import BuildOptions, BuildProgress, BuildResult, build_stage_artifacts
from services.artifact_builder.errors import CheckpointChangedError, OutputDirError, PlanInvalidError, TensorLayoutError
from services.artifact_builder.snapshot import inspect_checkpoint
from services.artifact_builder.staging import even_layer_ranges, plan_from_ranges
from tests.unit.artifact_builder.fixtures import write_checkpoint

FP32 = DType.FP32


def build(checkpoint: Path, out: Path, stages: int = 2, dtype: str = FP32, chunk_bytes: int = 1000,
          policy: str = "fp32"):
    inspection = inspect_checkpoint(checkpoint, source="test:tiny", revision="r1")
    plan = plan_from_ranges(even_layer_ranges(inspection.config.num_hidden_layers, stages))
    options = BuildOptions(out, dtype, chunk_bytes, weights_policy=policy)
    events = list(build_stage_artifacts(inspection, plan, options))
    assert isinstance(events[-1], BuildResult)
    return events[-1], events[:-1]


def _source_arrays(root: Path) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for shard in sorted(root.glob("*.safetensors")):
        arrays.update(load_file(str(shard)))
    return arrays


@pytest.mark.parametrize("tied", [False, True])
def test_artifacts_hold_exact_source_bytes(tmp_path, tied):
    root = write_checkpoint(tmp_path / "ck", tied=tied, shards=3)
    result, _ = build(root, tmp_path / "out", stages=3)
    source = _source_arrays(root)
    seen = []
    for stage in result.stages:
        arrays = load_file(str(tmp_path / "out" / f"stage-{stage.stage_index}" / "model.safetensors"))
        for name, array in arrays.items():
            origin = "model.embed_tokens.weight" if name == "lm_head.weight" and tied else name
            assert array.dtype == source[origin].dtype
            assert array.tobytes() == source[origin].tobytes(), name
        seen += list(arrays)
    assert sorted(seen) == sorted(set(source) | ({"lm_head.weight"} if tied else set()))


def test_manifest_records_lineage_layers_boundaries_and_files(tmp_path):
    root = write_checkpoint(tmp_path / "ck", tied=True, shards=2)
    result, _ = build(root, tmp_path / "out", stages=2, dtype=DType.BF16)
    snapshot = inspect_checkpoint(root).snapshot
    first, last = (verify_artifact(s.artifact_dir).manifest for s in result.stages)
    for m in (first, last):
        assert m.source.config_sha256 == snapshot.config_sha256
        assert m.source.tokenizer_sha256 == snapshot.tokenizer_sha256
        assert m.source.chat_template_sha256 == snapshot.chat_template_sha256
        assert m.source.weight_index_sha256 == snapshot.weight_index_sha256
        assert (m.source.source, m.source.revision) == ("test:tiny", "r1")
        assert (m.plan.plan_id, m.plan.plan_hash) == (result.plan_id, result.plan_hash)
        assert m.layers.convention == LAYER_RANGE_CONVENTION and m.stage_count == 2
        assert m.tied_embeddings
    # Only the final stage samples, so only it carries the tokenizer (grammar masks need it).
    assert [f.path for f in first.files] == ["config.json", "model.safetensors"]
    assert [f.path for f in last.files] == ["config.json", "model.safetensors", "tokenizer.json"]
    tokenizer = next(f for f in last.files if f.path == "tokenizer.json")
    assert tokenizer.sha256 == snapshot.tokenizer_sha256
    assert (first.layers.layer_start, first.layers.layer_end) == (0, 2)
    assert (first.boundary_input.kind, first.boundary_input.dtype, first.boundary_input.width) == (
        "TENSOR_KIND_TOKEN_IDS", "ELEMENT_TYPE_INT32", 1)
    assert (first.boundary_output.kind, first.boundary_output.dtype, first.boundary_output.width) == (
        "TENSOR_KIND_ACTIVATION", "ELEMENT_TYPE_BF16", 16)
    assert (last.boundary_input.dtype, last.boundary_output.kind, last.boundary_output.width) == (
        "ELEMENT_TYPE_BF16", "TENSOR_KIND_LOGITS", 64)
    assert last.tied_copies == ("lm_head.weight",) and first.tied_copies == ()
    head = next(t for t in last.tensors if t.name == "lm_head.weight")
    assert head.source_name == "model.embed_tokens.weight"
    assert last.weight_bytes == sum(t.data_end - t.data_begin for t in last.tensors)
    assert (result.stages[1].artifact_dir / "config.json").read_bytes() == (root / "config.json").read_bytes()


def test_build_is_deterministic_across_paths_and_chunk_sizes(tmp_path):
    root = write_checkpoint(tmp_path / "ck", shards=2)
    moved = shutil.copytree(root, tmp_path / "elsewhere" / "ck")
    a, _ = build(root, tmp_path / "out-a", chunk_bytes=64)
    b, _ = build(moved, tmp_path / "out-b", chunk_bytes=1 << 20)
    assert [s.manifest_hash for s in a.stages] == [s.manifest_hash for s in b.stages]
    for sa, sb in zip(a.stages, b.stages, strict=True):
        for name in ("model.safetensors", "manifest.json", "config.json"):
            assert (sa.artifact_dir / name).read_bytes() == (sb.artifact_dir / name).read_bytes()


def test_store_is_content_addressed_and_rebuilds_are_idempotent(tmp_path):
    root = write_checkpoint(tmp_path / "ck")
    out = tmp_path / "out"
    first, _ = build(root, out, stages=2)
    for stage in first.stages:
        assert stage.artifact_dir.name == "sha256-" + stage.manifest_hash.removeprefix("sha256:")
        raw = (stage.artifact_dir / "manifest.json").read_bytes()
        assert manifest_hash(decode_manifest(raw)) == stage.manifest_hash
        assert (out / f"stage-{stage.stage_index}").resolve() == stage.artifact_dir
    again, _ = build(root, out, stages=2)
    assert again == first
    regrouped, _ = build(root, out, stages=4)
    assert sorted(p.name for p in out.glob("stage-*")) == [f"stage-{i}" for i in range(4)]
    shrunk, _ = build(root, out, stages=1)
    assert sorted(p.name for p in out.glob("stage-*")) == ["stage-0"]
    assert len(list((out / "artifacts").iterdir())) == 2 + 4 + 1
    assert not list((out / "artifacts").glob(".tmp-*"))


def test_damaged_store_entry_is_replaced_on_rebuild(tmp_path):
    root = write_checkpoint(tmp_path / "ck")
    result, _ = build(root, tmp_path / "out")
    weights = result.stages[0].artifact_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1])
    build(root, tmp_path / "out")
    verify_artifact(result.stages[0].artifact_dir, expected_manifest_hash=result.stages[0].manifest_hash)


def test_progress_is_monotonic_and_complete(tmp_path):
    root = write_checkpoint(tmp_path / "ck")
    result, progress = build(root, tmp_path / "out", stages=2)
    assert all(isinstance(p, BuildProgress) for p in progress)
    assert [p.tensors_done for p in progress] == list(range(1, len(progress) + 1))
    assert progress[-1].tensors_done == progress[-1].tensors_total
    assert progress[-1].bytes_done == progress[-1].bytes_total == sum(s.weight_bytes for s in result.stages)
    assert [p.stage_index for p in progress] == sorted(p.stage_index for p in progress)


def test_invalid_checkpoint_and_options_are_refused_before_writing(tmp_path):
    def edit(tensors):
        tensors["model.norm.weight"] = np.zeros((3,), np.float32)

    bad = inspect_checkpoint(write_checkpoint(tmp_path / "bad", edit=edit))
    plan = plan_from_ranges(even_layer_ranges(4, 2))
    with pytest.raises(TensorLayoutError):
        list(build_stage_artifacts(bad, plan, BuildOptions(tmp_path / "o1", FP32)))
    assert not (tmp_path / "o1").exists()
    good = inspect_checkpoint(write_checkpoint(tmp_path / "good"))
    with pytest.raises(PlanInvalidError):
        list(build_stage_artifacts(good, plan, BuildOptions(tmp_path / "o2", DType.INT32)))
    blocked = tmp_path / "o3"
    (blocked / "stage-0").mkdir(parents=True)
    with pytest.raises(OutputDirError):
        list(build_stage_artifacts(good, plan, BuildOptions(blocked, FP32)))


def test_generated_bf16_checkpoints_build_and_load_back(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file as load_torch

    from libs.model.checkpoint_gen import CheckpointRequest
    from libs.model.checkpoint_gen import write_checkpoint as generate

    for preset, policy in (("tiny", "bf16"), ("tiny-lora-yarn", "bf16"), ("tiny", "fp32")):
        root = tmp_path / preset
        if not root.exists():
            generate(CheckpointRequest(preset, root, max_shard_bytes=200_000))
        result, _ = build(root, tmp_path / f"out-{preset}-{policy}", stages=3, policy=policy)
        source = {}
        for shard in root.glob("*.safetensors"):
            source.update(load_torch(str(shard)))
        tied = json.loads((root / "config.json").read_text())["tie_word_embeddings"]
        for stage in result.stages:
            for name, tensor in load_torch(str(stage.artifact_dir / "model.safetensors")).items():
                origin = "model.embed_tokens.weight" if tied and name == "lm_head.weight" else name
                # bf16 keeps the source bytes of every matrix; norms and the router (and, under
                # fp32, everything) are float32 of the same values
                kept = policy == "bf16" and tensor.dim() == 2 and not name.endswith("mlp.gate.weight")
                assert tensor.dtype == (torch.bfloat16 if kept else torch.float32), name
                assert torch.equal(tensor.float(), source[origin].float())


def test_untied_artifacts_load_like_the_checkpoint_through_the_model_loader(tmp_path):
    from libs.model.checkpoint_gen import CheckpointRequest
    from libs.model.checkpoint_gen import write_checkpoint as generate
    from libs.model.config import load_config
    from libs.model.weights import load_stage_weights

    root = tmp_path / "tiny"
    generate(CheckpointRequest("tiny", root, max_shard_bytes=200_000))
    result, _ = build(root, tmp_path / "out", stages=2)
    config = load_config(root)
    for stage in result.stages:
        first, last = stage.stage_index == 0, stage.stage_index == 1
        args = (config, stage.layer_start, stage.layer_end, first, last)
        from_artifact = load_stage_weights(stage.artifact_dir, *args)
        from_checkpoint = load_stage_weights(root, *args)
        assert sorted(from_artifact.layers) == sorted(from_checkpoint.layers)
        for layer, expected in from_checkpoint.layers.items():
            actual = from_artifact.layers[layer]
            np.testing.assert_array_equal(actual.input_norm, expected.input_norm)
            np.testing.assert_array_equal(actual.attention.kv_b_proj, expected.attention.kv_b_proj)
            mlp_pair = (actual.moe.experts_down, expected.moe.experts_down) if expected.moe else (
                actual.dense_mlp.down, expected.dense_mlp.down)
            np.testing.assert_array_equal(*mlp_pair)
        for part in ("embed", "final_norm", "lm_head"):
            expected, actual = getattr(from_checkpoint, part), getattr(from_artifact, part)
            assert (expected is None) == (actual is None)
            if expected is not None:
                np.testing.assert_array_equal(actual, expected)


def test_shard_rewritten_after_inspection_is_refused(tmp_path):
    root = write_checkpoint(tmp_path / "ck", shards=2)
    inspection = inspect_checkpoint(root)
    shard = root / "model-00002-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x10
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(0, 12345))
    plan = plan_from_ranges(even_layer_ranges(4, 2))
    with pytest.raises(CheckpointChangedError):
        list(build_stage_artifacts(inspection, plan, BuildOptions(tmp_path / "out", FP32)))
    assert not list((tmp_path / "out").glob("stage-*"))
    assert not list((tmp_path / "out" / "artifacts").iterdir())
