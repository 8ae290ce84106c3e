"""config.json parsing: both RoPE spellings, yarn, q_lora null/set, validation."""

from __future__ import annotations

import numpy as np
import pytest

from libs.model.config import parse_config
from libs.model.errors import ConfigError
from libs.model.presets import preset_config
from libs.model.rope import apply_rope, rope_tables

YARN = {
    "type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
    "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707,
}


def raw(**overrides):
    return {**preset_config("tiny", 0, 2), **overrides}


def test_legacy_and_new_rope_spellings_parse_to_the_same_config():
    legacy = parse_config(raw(rope_theta=5000.0, rope_scaling=YARN, max_position_embeddings=163840))
    params = {**{k: v for k, v in YARN.items() if k != "type"}, "rope_type": "yarn", "rope_theta": 5000.0}
    new = parse_config(
        {k: v for k, v in raw(max_position_embeddings=163840).items() if k not in ("rope_theta", "rope_scaling")}
        | {"rope_parameters": params}
    )
    assert legacy == new
    assert legacy.rope.rope_type == "yarn" and legacy.rope.theta == 5000.0 and legacy.rope.factor == 40
    assert legacy.rope.original_max_position_embeddings == 4096 and legacy.rope.mscale_all_dim == 0.707


def test_default_rope_and_q_lora_null_or_set():
    cfg = parse_config(raw())
    assert cfg.rope.rope_type == "default" and cfg.rope.theta == 10000.0 and cfg.q_lora_rank is None
    assert parse_config(raw(q_lora_rank=24)).q_lora_rank == 24
    assert cfg.qk_head_dim == cfg.qk_nope_head_dim + cfg.qk_rope_head_dim


def test_absent_q_lora_rank_is_an_error_not_a_guess():
    bad = raw()
    del bad["q_lora_rank"]
    with pytest.raises(ConfigError, match="q_lora_rank"):
        parse_config(bad)


def test_yarn_softmax_scale_includes_mscale_all_dim_squared():
    cfg = parse_config(raw(rope_scaling=YARN, max_position_embeddings=163840))
    m = 0.1 * 0.707 * np.log(40) + 1.0
    assert cfg.softmax_scale() == pytest.approx(cfg.qk_head_dim ** -0.5 * m * m)
    assert parse_config(raw()).softmax_scale() == pytest.approx(cfg.qk_head_dim ** -0.5)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, "unsupported model"),
        ({"topk_method": "noaux_tc"}, "topk_method"),
        ({"topk_method": "group_limited_greedy", "n_group": 3, "topk_group": 1}, "n_group"),
        ({"rope_scaling": {"type": "longrope", "factor": 2}}, "rope type"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"scoring_func": "sigmoid"}, "scoring_func"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ],
)
def test_invalid_configs_are_rejected_with_the_field_named(overrides, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(raw(**overrides))


def test_is_moe_layer_respects_first_dense_and_frequency():
    cfg = parse_config(raw(num_hidden_layers=6, first_k_dense_replace=2, moe_layer_freq=2))
    assert [cfg.is_moe_layer(i) for i in range(6)] == [False, False, True, False, True, False]


@pytest.mark.parametrize("rope_scaling", [None, YARN, {**YARN, "mscale": 1.0, "mscale_all_dim": 0.8, "factor": 4}])
def test_rope_tables_match_transformers(rope_scaling):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2RotaryEmbedding

    values = raw(rope_scaling=rope_scaling, max_position_embeddings=163840)
    hf_cfg = transformers.DeepseekV2Config(**{k: v for k, v in values.items() if k not in ("architectures",)})
    positions = np.array([0, 1, 5, 17, 300, 4095], dtype=np.int64)
    hf = DeepseekV2RotaryEmbedding(hf_cfg)(torch.zeros(1), torch.from_numpy(positions)[None])[0]
    cos, sin = rope_tables(parse_config(values)).cos_sin(positions)
    np.testing.assert_allclose(cos, hf.real.numpy(), rtol=0, atol=2e-6)
    np.testing.assert_allclose(sin, hf.imag.numpy(), rtol=0, atol=2e-6)


def test_apply_rope_rotates_interleaved_pairs():
    x = np.array([[1.0, 0.0, 0.0, 2.0]], dtype=np.float32)
    cos = np.array([[0.0, 1.0]], dtype=np.float32)
    sin = np.array([[1.0, 0.0]], dtype=np.float32)
    np.testing.assert_allclose(apply_rope(x, cos, sin), [[0.0, 1.0, 0.0, 2.0]])
