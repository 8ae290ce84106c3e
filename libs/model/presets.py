"""Architecture presets for generated test checkpoints, as Hugging Face `config.json` dicts.

- tiny: a few hundred kB, for tests (q_lora null, greedy routing, default RoPE).
- tiny-lora-yarn: tiny with q_lora_rank set, group_limited_greedy routing, yarn RoPE in the
  legacy `rope_scaling` spelling, tied embeddings and a routed scaling factor.
- small: about 250M parameters.
- lite: the dimensions of DeepSeek-V2-Lite (about 15.7B parameters).
"""

from __future__ import annotations

from typing import Any

_COMMON: dict[str, Any] = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "rms_norm_eps": 1e-6,
    "moe_layer_freq": 1,
    "norm_topk_prob": False,
    "routed_scaling_factor": 1.0,
    "topk_method": "greedy",
    "n_group": None,
    "topk_group": None,
    "tie_word_embeddings": False,
    "use_cache": True,
    "initializer_range": 0.02,
    "torch_dtype": "bfloat16",
}

_TINY: dict[str, Any] = {
    "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
    "kv_lora_rank": 32, "q_lora_rank": None, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16,
    "v_head_dim": 16, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 2,
    "first_k_dense_replace": 1, "max_position_embeddings": 2048,
    "rope_theta": 10000.0, "rope_scaling": None,
}

_TINY_LORA_YARN: dict[str, Any] = {
    **_TINY,
    "q_lora_rank": 48, "n_shared_experts": 1, "topk_method": "group_limited_greedy",
    "n_group": 4, "topk_group": 2, "num_experts_per_tok": 3, "routed_scaling_factor": 1.5,
    "tie_word_embeddings": True, "max_position_embeddings": 8192,
    "rope_scaling": {
        "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8,
    },
}

_SMALL: dict[str, Any] = {
    "vocab_size": 16384, "hidden_size": 1024, "intermediate_size": 2816, "moe_intermediate_size": 704,
    "num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 8,
    "kv_lora_rank": 256, "q_lora_rank": None, "qk_rope_head_dim": 32, "qk_nope_head_dim": 64,
    "v_head_dim": 64, "n_routed_experts": 16, "num_experts_per_tok": 4, "n_shared_experts": 2,
    "first_k_dense_replace": 1, "max_position_embeddings": 4096,
    "rope_theta": 10000.0, "rope_scaling": None,
}

_LITE: dict[str, Any] = {
    "vocab_size": 102400, "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
    "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
    "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
    "v_head_dim": 128, "n_routed_experts": 64, "num_experts_per_tok": 6, "n_shared_experts": 2,
    "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "max_position_embeddings": 163840,
    "rope_theta": 10000.0,
    "rope_scaling": {
        "type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
        "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707,
    },
}

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": _TINY,
    "tiny-lora-yarn": _TINY_LORA_YARN,
    "small": _SMALL,
    "lite": _LITE,
}


def preset_config(name: str, bos_token_id: int, eos_token_id: int) -> dict[str, Any]:
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    return {**_COMMON, **PRESETS[name], "bos_token_id": bos_token_id, "eos_token_id": eos_token_id}
