"""A deepseek2 GGUF as a checkpoint source: artifacts built from it keep every tensor's stored
type and bytes, compute what the same checkpoint's (dequantized) weights compute, carry the
tokenizer and chat template from its metadata, and bad files are refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest

from libs.artifacts.conversions import conversion_summary
from libs.artifacts.verify import verify_artifact
from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from libs.model.config import load_config
from libs.model.gguf_source import read_gguf
from libs.service.errors import FornaxError
from libs.text.tokenizer import ProjectTokenizer
from libs.weights.policy import MAX_FORMATS
from services.artifact_builder.build import BuildOptions, build_stage_artifacts
from services.artifact_builder.snapshot import inspect_checkpoint
from services.artifact_builder.staging import even_layer_ranges, plan_from_ranges
from tests.support.gguf_files import (
    f32_types,
    llama_like_types,
    mixed_types,
    write_gguf,
    write_reference_checkpoint,
)
from tests.unit.artifact_builder.test_weight_policies import _logits

TEXTS = ["Hello world, the fox.", "<|im_start|>user\nHi there!<|im_end|>\n", "  spaces\tand 123 numbers"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    write_checkpoint(CheckpointRequest("tiny", root))
    return root


def build(source, out, stages=1, backend="numpy", policy="fp32"):
    inspection = inspect_checkpoint(source)
    cfg = inspection.config
    plan = plan_from_ranges(even_layer_ranges(cfg.num_hidden_layers, stages))
    options = BuildOptions(out, "fp32", weights_policy=policy, stage_backends=(backend,) * stages)
    *_, result = build_stage_artifacts(inspection, plan, options)
    return inspection, [verify_artifact(s.artifact_dir) for s in result.stages]


def _two_stage_logits(verified, cfg):
    """Stage 0's hidden states into stage 1, as a 2-stage route runs them."""
    from libs.model.executor import StageBatch, StageExecutor, StageSpec
    from libs.model.kernels import make_kernels
    from libs.model.kv_store import kv_slice
    from libs.model.weights import load_stage_weights

    tokens = np.array([3, 17, 99, 250, 7], np.int32)
    ident = (kv_slice("r", "l", 0, 0, 0, len(tokens)),)
    hidden = None
    for index, stage in enumerate(verified):
        m = stage.manifest
        start, end = m.layers.layer_start, m.layers.layer_end
        weights = load_stage_weights(stage.artifact_dir, cfg, start, end, index == 0, index == len(verified) - 1)
        ex = StageExecutor(cfg, StageSpec(start, end, index == 0, index == len(verified) - 1),
                           make_kernels("numpy", cfg, weights))
        batch = (StageBatch(slices=ident, token_ids=tokens, all_logits=True) if index == 0
                 else StageBatch(slices=ident, hidden=hidden, all_logits=True))
        out = ex.execute(batch)
        hidden = out.hidden
    return out.logits


@pytest.mark.parametrize("split_kv_b", [True, False], ids=["attn_k_b+attn_v_b", "attn_kv_b"])
def test_an_f32_gguf_computes_exactly_what_its_checkpoint_computes(tiny, tmp_path, split_kv_b):
    gguf = tmp_path / "tiny-f32.gguf"
    write_gguf(tiny, gguf, f32_types, split_kv_b=split_kv_b)
    inspection, (stage,) = build(gguf, tmp_path / "out")
    cfg = load_config(stage.artifact_dir)
    assert cfg == load_config(tiny)
    assert stage.manifest.weights_policy == "gguf"
    by_name = {t.name: t.weight_format for t in stage.manifest.tensors}
    assert {f.format for f in by_name.values()} == {"fp32"}
    kv_b = by_name["model.layers.0.self_attn.kv_b_proj.weight"]
    assert ("attn_k_b" in kv_b.conversion) == split_kv_b
    assert by_name["model.layers.1.mlp.experts.3.up_proj.weight"].quantizer == "source bytes"
    from_gguf, _ = _logits(stage.artifact_dir, cfg)
    reference, _ = _logits(tiny, cfg)
    np.testing.assert_array_equal(from_gguf, reference)


def test_a_quantized_gguf_keeps_its_bytes_and_computes_its_dequantized_reference(tiny, tmp_path):
    gguf = tmp_path / "tiny-q8.gguf"
    reference = write_gguf(tiny, gguf, llama_like_types)
    _check_kept_and_exact(tiny, tmp_path, gguf, reference)


def test_every_type_a_tiny_row_fits_is_kept_and_computes_its_dequantized_reference(tiny, tmp_path):
    gguf = tmp_path / "tiny-mixed.gguf"
    reference = write_gguf(tiny, gguf, mixed_types)
    _, stored = read_gguf(str(gguf))
    assert {t.gguf_type for t in stored} == {"F32", "F16", "BF16", "Q8_0", "Q5_0", "Q5_1", "Q4_0"}
    _check_kept_and_exact(tiny, tmp_path, gguf, reference, llama_like=False)


def test_half_precision_norms_and_router_are_held_as_float32_and_say_so(tiny, tmp_path):
    gguf = tmp_path / "tiny-f16.gguf"
    reference = write_gguf(tiny, gguf, lambda name, shape: "F16")
    _, (stage,) = build(gguf, tmp_path / "out")
    formats = {t.name: t.weight_format for t in stage.manifest.tensors}
    for name in ("model.norm.weight", "model.layers.1.mlp.gate.weight", "model.layers.0.input_layernorm.weight"):
        held = formats[name]
        assert held.format == "fp32" and held.wanted == "f16" and "float32" in held.conversion
    assert formats["model.layers.0.self_attn.q_proj.weight"].format == "f16"
    cfg = load_config(stage.artifact_dir)
    expected, _ = _logits(write_reference_checkpoint(tiny, reference, tmp_path / "dequantized"), cfg)
    np.testing.assert_array_equal(_logits(stage.artifact_dir, cfg)[0], expected)


def _check_kept_and_exact(tiny, tmp_path, gguf, reference, llama_like=True):
    inspection, stages = build(gguf, tmp_path / "out", stages=2)
    _, stored = read_gguf(str(gguf))
    stored_types = {t.name: t.gguf_type for t in stored}
    blob = gguf.read_bytes()
    formats = {}
    for stage in stages:
        manifest = stage.manifest
        data = (stage.artifact_dir / "model.safetensors").read_bytes()
        header = 8 + int.from_bytes(data[:8], "little")
        for t in manifest.tensors:
            formats[t.name] = t.weight_format
            source = next(s for s in inspection.tensors if s.name == t.source_name)
            if not source.parts:  # every tensor but the composed kv_b_proj: the file's bytes, as stored
                kept = data[header + t.data_begin:header + t.data_end]
                assert kept == blob[source.offset:source.offset + source.nbytes]
                assert t.weight_format.quantizer == "source bytes"
        assert manifest.source.tokenizer_sha256 == inspection.snapshot.tokenizer_sha256
    gate = formats["model.layers.1.mlp.experts.5.gate_proj.weight"]
    assert stored_types["blk.1.ffn_gate_exps.weight"] == gate.source_dtype and gate.format == gate.wanted
    assert formats["model.layers.1.mlp.gate.weight"].format == "fp32"
    if llama_like:  # Q8_0 where rows fit, F16 elsewhere
        assert gate.source_dtype == "Q8_0" and gate.format == "q8_0"
        kv_b = formats["model.layers.2.self_attn.kv_b_proj.weight"]
        assert kv_b.format == "fp32" and "F16" in kv_b.conversion and "Q8_0" in kv_b.conversion
    cfg = load_config(stages[0].artifact_dir)
    ref_dir = write_reference_checkpoint(tiny, reference, tmp_path / "dequantized")
    expected, _ = _logits(ref_dir, cfg)
    np.testing.assert_array_equal(_two_stage_logits(stages, cfg), expected)
    source, _ = _logits(tiny, cfg)
    assert not np.array_equal(expected, source)  # the file's weights are quantized: a different model
    assert (expected.argmax(-1) == source.argmax(-1)).mean() >= 0.8


def test_a_max_build_keeps_the_stored_q8_0_and_converts_only_what_max_reads_outside_a_product(tiny, tmp_path):
    gguf = tmp_path / "tiny-q8.gguf"
    write_gguf(tiny, gguf, llama_like_types)
    _, (stage,) = build(gguf, tmp_path / "out", backend="max")
    formats = {t.name: t.weight_format for t in stage.manifest.tensors}
    assert {f.format for f in formats.values()} <= MAX_FORMATS
    summary = conversion_summary(stage.manifest)
    assert any(line.startswith("4 tensors F32 wanted fp32, held fp32") for line in summary)  # kv_b_proj
    q = formats["model.layers.0.self_attn.q_proj.weight"]
    assert (q.source_dtype, q.wanted, q.format, q.conversion) == ("Q8_0", "q8_0", "q8_0", "")  # the custom op runs it
    assert q.quantizer == "source bytes"
    kept = [f for n, f in formats.items() if f.source_dtype == "F32" and "kv_b_proj" not in n]
    assert kept and all(f.format == "fp32" and not f.conversion for f in kept)


def test_the_tokenizer_and_chat_template_come_from_the_metadata_with_their_hashes(tiny, tmp_path):
    gguf = tmp_path / "tiny.gguf"
    write_gguf(tiny, gguf, llama_like_types)
    inspection, (stage,) = build(gguf, tmp_path / "out")
    ours = ProjectTokenizer.from_file(stage.artifact_dir / "tokenizer.json", inspection.snapshot.tokenizer_sha256)
    original = ProjectTokenizer.from_file(tiny / "tokenizer.json")
    for text in TEXTS:
        assert ours.encode(text) == original.encode(text)
    assert ours.special_ids == original.special_ids
    template = json.loads((tiny / "tokenizer_config.json").read_text())["chat_template"]
    import hashlib

    assert inspection.snapshot.chat_template_sha256 == hashlib.sha256(template.encode()).hexdigest()
    assert stage.manifest.source.chat_template_sha256 == inspection.snapshot.chat_template_sha256
    # the same file gives the same derived bytes, so the same snapshot and artifact
    again, (same,) = build(gguf, tmp_path / "out2")
    assert again.snapshot.snapshot_id == inspection.snapshot.snapshot_id
    assert same.manifest_hash == stage.manifest_hash


def _refusal(source) -> FornaxError:
    with pytest.raises(FornaxError) as caught:
        build(source, source.parent / "out")
    return caught.value


def test_another_architecture_is_refused_by_name(tiny, tmp_path):
    gguf = tmp_path / "llama.gguf"
    write_gguf(tiny, gguf, arch="llama")
    err = _refusal(gguf)
    assert err.reason == "GGUF_ARCHITECTURE_UNSUPPORTED" and "'llama'" in err.message


def test_a_missing_or_invalid_metadata_key_is_refused_by_name(tiny, tmp_path):
    gguf = tmp_path / "nokey.gguf"
    write_gguf(tiny, gguf, drop_keys=("attention.kv_lora_rank",))
    err = _refusal(gguf)
    assert err.reason == "GGUF_METADATA_MISSING" and "deepseek2.attention.kv_lora_rank" in err.message
    bad = tmp_path / "sigmoid.gguf"
    write_gguf(tiny, bad, metadata_edits={"expert_gating_func": 2})
    err = _refusal(bad)
    assert err.reason == "GGUF_METADATA_INVALID" and "expert_gating_func" in err.message


def test_an_unsupported_tensor_type_is_refused_naming_tensor_and_type(tiny, tmp_path):
    from gguf import GGMLQuantizationType, GGUFReader

    gguf = tmp_path / "q8.gguf"
    write_gguf(tiny, gguf, llama_like_types)
    # Retag one tensor's type in place (the header's type field) to IQ4_NL (a
    # llama.cpp type no format here holds).
    tensor = next(t for t in GGUFReader(str(gguf)).tensors if t.name == "blk.2.attn_q.weight")
    type_part = tensor.field.parts[-2]  # [name length, name, n_dims, dims, type, offset]
    data = bytearray(gguf.read_bytes())
    offset = tensor.field.offset + sum(p.nbytes for p in tensor.field.parts[:-2])
    assert int(np.frombuffer(data, np.uint32, 1, offset)[0]) == int(type_part[0]) == GGMLQuantizationType.Q8_0
    data[offset:offset + 4] = np.uint32(GGMLQuantizationType.IQ4_NL).tobytes()
    retagged = tmp_path / "retagged.gguf"
    retagged.write_bytes(bytes(data))
    err = _refusal(retagged)
    assert err.reason == "GGUF_TENSOR_TYPE_UNSUPPORTED"
    assert "blk.2.attn_q.weight" in err.message and "IQ4_NL" in err.message


def test_a_weight_policy_is_refused_for_a_gguf(tiny, tmp_path):
    gguf = tmp_path / "tiny.gguf"
    write_gguf(tiny, gguf, llama_like_types)
    with pytest.raises(FornaxError) as caught:
        build(gguf, tmp_path / "out", policy="q4_k_m")
    assert caught.value.reason == "GGUF_WEIGHTS_POLICY"
