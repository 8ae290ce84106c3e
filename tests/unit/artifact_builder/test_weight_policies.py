"""Artifacts built with a weight policy hold each tensor in its format, say so per tensor in
the manifest, load packed (never as float32), and compute exactly what the same policy
applied in memory computes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from libs.artifacts.errors import ArtifactLayoutMismatchError
from libs.artifacts.manifest import MANIFEST_FILE, decode_manifest, encode_manifest, manifest_hash
from libs.artifacts.verify import verify_artifact
from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from libs.model.config import load_config
from libs.model.executor import StageBatch, StageExecutor, StageSpec
from libs.model.kernels import make_kernels
from libs.model.kv_store import kv_slice
from libs.model.weights import load_stage_weights
from libs.weights.errors import WeightBlockInvalidError
from libs.weights.tensor import PackedWeight
from tests.unit.artifact_builder.test_build import build


@pytest.fixture(scope="module")
def small_tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    write_checkpoint(CheckpointRequest("tiny", root))
    return root


def _logits(source, cfg, policy="fp32"):
    weights = load_stage_weights(source, cfg, 0, cfg.num_hidden_layers, True, True, policy=policy)
    ex = StageExecutor(cfg, StageSpec(0, cfg.num_hidden_layers, True, True), make_kernels("numpy", cfg, weights))
    tokens = np.array([3, 17, 99, 250, 7], np.int32)
    batch = StageBatch(slices=(kv_slice("r", "l", 0, 0, 0, len(tokens)),), token_ids=tokens, all_logits=True)
    return ex.execute(batch).logits, weights


@pytest.mark.parametrize("policy", ["bf16", "q8_0", "q4_k_m"])
def test_a_policy_build_loads_packed_and_computes_what_the_policy_computes(small_tiny, tmp_path, policy):
    result, _ = build(small_tiny, tmp_path / "out", stages=1, policy=policy)
    (stage,) = result.stages
    verified = verify_artifact(stage.artifact_dir)
    manifest = verified.manifest
    assert manifest.weights_policy == policy
    by_name = {t.name: t for t in manifest.tensors}
    gate = by_name["model.layers.1.mlp.experts.0.gate_proj.weight"].weight_format
    norm = by_name["model.norm.weight"].weight_format
    assert norm.format == "fp32" and gate.source_dtype == "BF16"
    assert manifest.weight_bytes == (stage.artifact_dir / "model.safetensors").stat().st_size - _header(stage)
    cfg = load_config(small_tiny)
    from_artifact, weights = _logits(stage.artifact_dir, cfg)
    in_memory, _ = _logits(small_tiny, cfg, policy)
    np.testing.assert_array_equal(from_artifact, in_memory)
    packed = weights.layer(1).moe.experts_gate[0]
    assert isinstance(packed, PackedWeight) and packed.fmt.name == gate.format
    assert packed.data.dtype != np.float32
    reference, _ = _logits(small_tiny, cfg)
    # bf16 of a bf16 checkpoint is lossless; a block format changes the model's weights
    assert np.array_equal(from_artifact, reference) == (policy == "bf16")


def _header(stage) -> int:
    raw = (stage.artifact_dir / "model.safetensors").read_bytes()[:8]
    return 8 + int.from_bytes(raw, "little")


def test_q4_k_m_on_tiny_records_llama_cpps_fallbacks(small_tiny, tmp_path):
    result, _ = build(small_tiny, tmp_path / "out", stages=1, policy="q4_k_m")
    manifest = verify_artifact(result.stages[0].artifact_dir).manifest
    formats = {t.name: t.weight_format for t in manifest.tensors}
    down = formats["model.layers.2.mlp.experts.3.down_proj.weight"]  # rows of 32: no 256-block fits
    assert down.wanted in ("q4_k", "q6_k") and down.format in ("q5_0", "q8_0") and "32" in down.fallback
    assert formats["model.embed_tokens.weight"].format == "q8_0"
    assert {f.quantizer for f in formats.values() if f.format == "q8_0"} == {"gguf 0.19.0"}


def test_a_manifest_whose_format_disagrees_with_the_stored_entry_is_refused(small_tiny, tmp_path):
    result, _ = build(small_tiny, tmp_path / "out", stages=1, policy="q8_0")
    artifact = result.stages[0].artifact_dir
    document = json.loads((artifact / MANIFEST_FILE).read_text())
    for tensor in document["tensors"]:
        if tensor["weight_format"]["format"] == "q8_0":
            tensor["weight_format"]["format"] = "q4_0"
            break
    forged = decode_manifest(json.dumps(document).encode())
    copy = tmp_path / "forged"
    copy.mkdir()
    for f in artifact.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    (copy / MANIFEST_FILE).write_bytes(encode_manifest(forged))
    with pytest.raises(ArtifactLayoutMismatchError, match="cannot hold q4_0"):
        verify_artifact(copy, expected_manifest_hash=manifest_hash(forged))


def test_a_block_with_a_non_finite_scale_is_refused_before_load(small_tiny, tmp_path):
    result, _ = build(small_tiny, tmp_path / "out", stages=1, policy="q8_0")
    artifact = result.stages[0].artifact_dir
    manifest = verify_artifact(artifact).manifest
    target = next(t for t in manifest.tensors if t.weight_format.format == "q8_0")
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for f in artifact.iterdir():
        (damaged / f.name).write_bytes(f.read_bytes())
    data = bytearray((damaged / "model.safetensors").read_bytes())
    offset = _header(result.stages[0]) + target.data_begin + 34 * 2  # block 2's f16 scale
    data[offset:offset + 2] = np.array([np.nan], np.float16).tobytes()
    (damaged / "model.safetensors").write_bytes(bytes(data))
    cfg = load_config(small_tiny)
    with pytest.raises(WeightBlockInvalidError, match="block 2 has a non-finite scale"):
        load_stage_weights(damaged, cfg, 0, cfg.num_hidden_layers, True, True)


def test_a_build_for_max_holds_only_what_max_runs_and_records_each_conversion(small_tiny, tmp_path):
    from libs.common.kinds import DType
    from libs.weights.policy import MAX_FORMATS
    from services.artifact_builder.build import BuildOptions, BuildResult, build_stage_artifacts
    from services.artifact_builder.snapshot import inspect_checkpoint
    from services.artifact_builder.staging import plan_from_ranges

    inspection = inspect_checkpoint(small_tiny, "test", "r")
    plan = plan_from_ranges(((0, 2), (2, 4)))
    options = BuildOptions(tmp_path / "out", DType.FP32, weights_policy="q4_k_m", stage_backends=("max", "numpy"))
    result = [e for e in build_stage_artifacts(inspection, plan, options) if isinstance(e, BuildResult)][0]
    on_max, on_numpy = (verify_artifact(s.artifact_dir).manifest for s in result.stages)
    max_formats = {t.weight_format.format for t in on_max.tensors}
    assert max_formats <= MAX_FORMATS and "q5_0" in max_formats  # llama.cpp's fallback, held as stored
    converted = [t.weight_format for t in on_max.tensors if t.weight_format.conversion]
    assert converted and all(f.format in MAX_FORMATS for f in converted)
    embed = next(t.weight_format for t in on_max.tensors if t.name == "model.embed_tokens.weight")
    assert (embed.wanted, embed.format) == ("q8_0", "bf16") and "outside a plain product" in embed.conversion
    assert not any(t.weight_format.conversion for t in on_numpy.tensors)  # numpy runs every format
    assert {t.weight_format.format for t in on_numpy.tensors} & {"q5_0", "q8_0"}
