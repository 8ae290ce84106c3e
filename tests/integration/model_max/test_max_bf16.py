"""bf16 MAX (bf16 weights, bf16 linear products, float32 norms/softmax/router) against the
float32 numpy reference, checked statistically: greedy top-1 token and routed-expert
agreement over a ragged prefill through the whole model."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("max")

from libs.model.executor import build_ragged_layout  # noqa: E402
from libs.model.kernels import LayerInputs, make_kernels  # noqa: E402
from libs.model.max_kernels import MaxOptions, make_max_kernels  # noqa: E402
from libs.model.rope import rope_tables  # noqa: E402
from tests.unit.model_max.conftest import full_stage, max_checkpoint  # noqa: E402,F401

# five more graphs to compile on a cold cache;
# cold compiles can outlast the default 600 s test timeout on a busy 2-core host.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

TOP1_MIN_AGREEMENT = 0.90    # fraction of rows whose argmax token matches float32
EXPERT_MIN_AGREEMENT = 0.90  # fraction of routed (row, expert) choices shared with float32
ROWS_PER_SEQUENCE = (24, 17, 31, 9)


def run_model(kernels, cfg, token_ids, layout):
    cos, sin = rope_tables(cfg).cos_sin(layout.positions)
    empty_latent = np.zeros((0, cfg.kv_lora_rank), np.float32)
    empty_rope = np.zeros((0, cfg.qk_rope_head_dim), np.float32)
    hidden, experts = kernels.embed(token_ids), []
    for layer in range(cfg.num_hidden_layers):
        out = kernels.decoder_layer(layer, LayerInputs(hidden, cos, sin, empty_latent, empty_rope, layout.mask))
        hidden = out.hidden
        if out.routed_expert_ids is not None:
            experts.append(out.routed_expert_ids)
    return kernels.final(hidden), experts


def expert_agreement(a: np.ndarray, b: np.ndarray) -> float:
    shared = sum(len(set(x) & set(y)) for x, y in zip(a.tolist(), b.tolist(), strict=True))
    return shared / a.size


def test_bf16_agrees_statistically_with_float32(full_stage):  # noqa: F811
    cfg, weights = full_stage
    layout = build_ragged_layout([0] * len(ROWS_PER_SEQUENCE), list(ROWS_PER_SEQUENCE))
    tokens = np.random.default_rng(11).integers(0, cfg.vocab_size, layout.positions.size).astype(np.int32)
    bf16 = make_max_kernels(cfg, weights, "cpu", MaxOptions(weight_dtype="bfloat16"))
    logits16, experts16 = run_model(bf16, cfg, tokens, layout)
    logits32, experts32 = run_model(make_kernels("numpy", cfg, weights), cfg, tokens, layout)
    top1 = float(np.mean(logits16.argmax(-1) == logits32.argmax(-1)))
    agreement = [expert_agreement(a, b) for a, b in zip(experts16, experts32, strict=True)]
    report = f"top1={top1:.3f} experts={[round(x, 3) for x in agreement]}"
    assert top1 >= TOP1_MIN_AGREEMENT, report
    assert min(agreement) >= EXPERT_MIN_AGREEMENT, report
    # bf16 products really ran: the logits differ from float32, just not by much.
    assert 0 < float(np.abs(logits16 - logits32).max()) < 0.5 * float(np.abs(logits32).max()), report


def test_a_bf16_policy_stage_binds_its_stored_bits_and_computes_what_rounding_gives(full_stage, max_checkpoint):  # noqa: F811
    """Weights loaded under the bf16 policy stay bf16 (no float32 copy) and pick bf16 graphs by
    themselves; they compute exactly what float32 weights rounded to bf16 at bind compute."""
    from libs.model.weights import load_stage_weights
    from libs.weights.tensor import PackedWeight

    cfg, weights = full_stage
    packed = load_stage_weights(max_checkpoint, cfg, 0, cfg.num_hidden_layers, True, True, policy="bf16")
    gate = packed.layer(1).moe.experts_gate[0]
    assert isinstance(gate, PackedWeight) and gate.data.dtype == np.uint16
    assert packed.resident_bytes() < 0.6 * weights.resident_bytes()
    layout = build_ragged_layout([0, 0], [7, 5])
    tokens = np.random.default_rng(3).integers(0, cfg.vocab_size, layout.positions.size).astype(np.int32)
    from_bits = make_max_kernels(cfg, packed, "cpu")  # "auto": bf16 graphs, from the weights
    assert from_bits.options.weight_dtype == "bfloat16"
    rounded = make_max_kernels(cfg, weights, "cpu", MaxOptions(weight_dtype="bfloat16"))
    np.testing.assert_array_equal(run_model(from_bits, cfg, tokens, layout)[0],
                                  run_model(rounded, cfg, tokens, layout)[0])


def test_a_block_format_on_a_max_stage_is_refused_not_widened(max_checkpoint):  # noqa: F811
    from libs.model.config import load_config
    from libs.model.weights import load_stage_weights
    from libs.weights.errors import WeightFormatUnsupportedError

    cfg = load_config(max_checkpoint)
    quantized = load_stage_weights(max_checkpoint, cfg, 0, 2, True, False, policy="q8_0")
    with pytest.raises(WeightFormatUnsupportedError) as refused:
        make_max_kernels(cfg, quantized, "cpu")
    assert refused.value.reason == "WEIGHT_FORMAT_UNSUPPORTED" and "q8_0" in refused.value.message
