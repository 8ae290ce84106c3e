"""Policies choose formats per tensor class as llama.cpp's presets do, with its fallbacks."""

from __future__ import annotations

import pytest

from libs.weights.errors import UnknownWeightPolicyError
from libs.weights.policy import choose, use_more_bits

LITE_LAYERS = 27


def fmt(policy, name, shape, layers=LITE_LAYERS):
    return choose(policy, name, shape, layers).fmt.name


def test_norms_and_router_stay_float32_under_every_policy():
    for policy in ("fp32", "bf16", "q8_0", "q4_k_m"):
        assert fmt(policy, "model.layers.3.input_layernorm.weight", (2048,)) == "fp32"
        assert fmt(policy, "model.layers.3.mlp.gate.weight", (64, 2048)) == "fp32"


def test_q4_k_m_on_lite_shapes():
    assert fmt("q4_k_m", "model.layers.5.mlp.experts.9.gate_proj.weight", (1408, 2048)) == "q4_k"
    assert fmt("q4_k_m", "model.layers.5.self_attn.q_proj.weight", (3072, 2048)) == "q4_k"
    assert fmt("q4_k_m", "model.layers.5.self_attn.kv_b_proj.weight", (4096, 512)) == "q6_k"
    assert fmt("q4_k_m", "model.embed_tokens.weight", (102400, 2048)) == "q8_0"
    assert fmt("q4_k_m", "lm_head.weight", (102400, 2048)) == "q8_0"
    # V2-Lite's expert down rows are 1,408 long: not a 256 multiple, so Q4_K -> Q5_0 (llama.cpp)
    choice = choose("q4_k_m", "model.layers.4.mlp.experts.9.down_proj.weight", (2048, 1408), LITE_LAYERS)
    assert (choice.wanted, choice.fmt.name) == ("q4_k", "q5_0")
    assert "1408" in choice.fallback and "q5_0" in choice.fallback
    more = choose("q4_k_m", "model.layers.1.mlp.experts.9.down_proj.weight", (2048, 1408), LITE_LAYERS)
    assert (more.wanted, more.fmt.name) == ("q6_k", "q8_0")


def test_use_more_bits_matches_llama_cpp_for_27_layers():
    picked = [i for i in range(27) if use_more_bits(i, 27)]
    assert picked == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26]


def test_rows_that_fit_no_block_become_f16():
    assert fmt("q8_0", "model.layers.0.self_attn.o_proj.weight", (64, 48)) == "f16"
    assert fmt("bf16", "model.layers.0.self_attn.o_proj.weight", (64, 48)) == "bf16"


def test_unknown_policy_is_refused_with_its_code():
    with pytest.raises(UnknownWeightPolicyError) as info:
        choose("q4_k_s", "lm_head.weight", (8, 256), 4)
    assert info.value.reason == "WEIGHT_POLICY_UNKNOWN"


def test_a_stage_for_max_holds_only_what_max_runs():
    def on_max(name, shape, layers=LITE_LAYERS):
        return choose("q4_k_m", name, shape, layers, backend="max")

    kept = on_max("model.layers.4.mlp.experts.9.gate_proj.weight", (1408, 2048))
    assert (kept.fmt.name, kept.conversion) == ("q4_k", "")
    down = on_max("model.layers.4.mlp.experts.9.down_proj.weight", (2048, 1408))  # q5_0 by fallback
    assert (down.fmt.name, down.conversion) == ("q5_0", "") and down.fallback  # the Mojo custom op runs it
    head = on_max("lm_head.weight", (102400, 2048))
    assert (head.fmt.name, head.conversion) == ("q8_0", "")
    for name, shape in (("model.embed_tokens.weight", (102400, 2048)),
                        ("model.layers.2.self_attn.kv_b_proj.weight", (4096, 512))):
        assert on_max(name, shape).fmt.name == "bf16"  # gathers and per-head products: float
    narrow = on_max("model.layers.2.self_attn.q_a_proj.weight", (48, 64), 4)  # q5_0: no output-dim rule
    assert (narrow.fmt.name, narrow.conversion) == ("q5_0", "")
    assert choose("q4_k_m", "model.layers.4.mlp.experts.9.down_proj.weight", (2048, 1408),
                  LITE_LAYERS).conversion == ""  # numpy runs every format


@pytest.mark.parametrize("stored, shape, held", [
    ("q5_0", (2048, 1408), "q5_0"),   # the Mojo custom op runs Q5_0, Q5_1 and Q8_0 as stored
    ("q5_1", (2048, 2048), "q5_1"),
    ("q8_0", (2048, 2048), "q8_0"),
    ("q4_0", (2048, 64), "q4_0"),     # qmatmul runs it: kept as stored
    ("q6_k", (2048, 2048), "q6_k"),
    ("f16", (2048, 2048), "bf16"),
    ("q5_0", (48, 64), "q5_0"),       # the custom op has no output-dim rule
    ("q4_0", (48, 64), "bf16"),       # qmatmul's output multiple of 32
])
def test_a_stored_gguf_tensor_on_max_is_never_held_in_fewer_bits(stored, shape, held):
    from libs.weights.formats import weight_format
    from libs.weights.policy import keep_stored

    choice = keep_stored(weight_format(stored), "model.layers.3.mlp.up_proj.weight", shape, "max")
    assert choice.fmt.name == held
    assert (choice.conversion == "") == (held == stored)
    assert keep_stored(weight_format(stored), "model.layers.3.mlp.up_proj.weight", shape).fmt.name == stored


def test_every_known_block_format_is_runnable_on_max():
    """No policy or stored format is converted for want of a kernel any more."""
    from libs.weights.formats import FORMATS, weight_format
    from libs.weights.policy import MAX_FORMATS, TensorChoice, for_max

    assert {f for f, fmt in FORMATS.items() if fmt.is_block} <= MAX_FORMATS
    choice = for_max(TensorChoice(weight_format("q5_0"), "q4_k", "fallback"), "model.layers.3.mlp.up_proj.weight",
                     (2048, 1408))
    assert (choice.fmt.name, choice.conversion, choice.fallback) == ("q5_0", "", "fallback")
