"""DeepSeek-V2 architecture config parsed from a checkpoint's `config.json`.

Accepts both RoPE spellings: the legacy `rope_theta` + `rope_scaling` pair and the newer
`rope_parameters` dict, with `type` or `rope_type` naming the scaling kind.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libs.model.errors import ConfigError

SUPPORTED_ARCHITECTURES = ("DeepseekV2ForCausalLM",)
SUPPORTED_ROPE_TYPES = ("default", "yarn")
SUPPORTED_TOPK_METHODS = ("greedy", "group_limited_greedy")


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True


@dataclass(frozen=True)
class DeepseekV2Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    kv_lora_rank: int
    q_lora_rank: int | None
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    first_k_dense_replace: int
    rope: RopeConfig
    moe_layer_freq: int = 1
    topk_method: str = "greedy"
    n_group: int | None = None
    topk_group: int | None = None
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = False
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048
    hidden_act: str = "silu"
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def routing_groups(self) -> tuple[int, int]:
        """(n_group, topk_group) of group-limited routing; parse_config validated both."""
        if self.n_group is None or self.topk_group is None:
            raise ConfigError("group-limited routing needs n_group and topk_group")
        return self.n_group, self.topk_group

    def is_moe_layer(self, layer_index: int) -> bool:
        return (
            self.n_routed_experts > 0
            and layer_index >= self.first_k_dense_replace
            and layer_index % self.moe_layer_freq == 0
        )

    def softmax_scale(self) -> float:
        """Attention softmax scale, including yarn's mscale_all_dim correction."""
        scale = self.qk_head_dim ** -0.5
        rope = self.rope
        if rope.rope_type != "default" and rope.mscale_all_dim:
            m = yarn_mscale(rope.factor, rope.mscale_all_dim)
            scale = scale * m * m
        return scale


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def load_config(checkpoint_dir: str | Path) -> DeepseekV2Config:
    """From the directory's config.json, or from a `.gguf` file's metadata (`gguf_source`)."""
    if Path(checkpoint_dir).suffix == ".gguf" and Path(checkpoint_dir).is_file():
        from libs.model.gguf_source import config_from_metadata, read_gguf

        metadata, tensors = read_gguf(str(checkpoint_dir))
        return parse_config(config_from_metadata(metadata, {t.name for t in tensors}))
    path = Path(checkpoint_dir) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"no config.json in checkpoint dir {checkpoint_dir}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
    return parse_config(raw)


def parse_config(raw: dict[str, Any]) -> DeepseekV2Config:
    _check_architecture(raw)
    if raw.get("scoring_func", "softmax") != "softmax":
        raise ConfigError(f"scoring_func {raw['scoring_func']!r} is not supported (DeepSeek-V2 routes with softmax)")
    n_routed = int(raw.get("n_routed_experts") or 0)
    cfg = DeepseekV2Config(
        vocab_size=_req_int(raw, "vocab_size"),
        hidden_size=_req_int(raw, "hidden_size"),
        intermediate_size=_req_int(raw, "intermediate_size"),
        moe_intermediate_size=int(raw.get("moe_intermediate_size") or 0),
        num_hidden_layers=_req_int(raw, "num_hidden_layers"),
        num_attention_heads=_req_int(raw, "num_attention_heads"),
        kv_lora_rank=_req_int(raw, "kv_lora_rank"),
        q_lora_rank=_opt_int(_req_key(raw, "q_lora_rank")),
        qk_rope_head_dim=_req_int(raw, "qk_rope_head_dim"),
        qk_nope_head_dim=_req_int(raw, "qk_nope_head_dim"),
        v_head_dim=_req_int(raw, "v_head_dim"),
        n_routed_experts=n_routed,
        num_experts_per_tok=int(raw.get("num_experts_per_tok") or 0),
        n_shared_experts=int(raw.get("n_shared_experts") or 0),
        first_k_dense_replace=int(raw.get("first_k_dense_replace") or 0),
        rope=parse_rope(raw),
        moe_layer_freq=int(raw.get("moe_layer_freq") or 1),
        topk_method=str(raw.get("topk_method") or "greedy"),
        n_group=_opt_int(raw.get("n_group")),
        topk_group=_opt_int(raw.get("topk_group")),
        routed_scaling_factor=float(raw.get("routed_scaling_factor") or 1.0),
        norm_topk_prob=bool(raw.get("norm_topk_prob") or False),
        rms_norm_eps=float(raw.get("rms_norm_eps") or 1e-6),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings") or False),
        max_position_embeddings=int(raw.get("max_position_embeddings") or 2048),
        hidden_act=str(raw.get("hidden_act") or "silu"),
        attention_bias=bool(raw.get("attention_bias") or False),
        bos_token_id=_first_id(raw.get("bos_token_id")),
        eos_token_id=_first_id(raw.get("eos_token_id")),
    )
    _validate(cfg)
    return cfg


def parse_rope(raw: dict[str, Any]) -> RopeConfig:
    params = raw.get("rope_parameters")
    if params is None:
        params = dict(raw.get("rope_scaling") or {})
        params.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
    elif not isinstance(params, dict):
        raise ConfigError("rope_parameters must be an object")
    rope_type = str(params.get("rope_type") or params.get("type") or "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ConfigError(f"rope type {rope_type!r} is not supported (supported: {SUPPORTED_ROPE_TYPES})")
    theta = float(params.get("rope_theta") or raw.get("rope_theta") or 10000.0)
    if rope_type == "default":
        return RopeConfig(theta=theta)
    max_pos = int(raw.get("max_position_embeddings") or 2048)
    original = params.get("original_max_position_embeddings") or max_pos
    factor = params.get("factor")
    factor = float(factor) if factor is not None else max_pos / float(original)
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=factor,
        original_max_position_embeddings=int(original),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        mscale=_opt_float(params.get("mscale")),
        mscale_all_dim=_opt_float(params.get("mscale_all_dim")),
        attention_factor=_opt_float(params.get("attention_factor")),
        truncate=bool(params.get("truncate", True)),
    )


def _check_architecture(raw: dict[str, Any]) -> None:
    archs = raw.get("architectures") or []
    model_type = raw.get("model_type")
    if model_type != "deepseek_v2" and not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        raise ConfigError(
            f"unsupported model: model_type={model_type!r} architectures={archs!r}; "
            "expected deepseek_v2 / DeepseekV2ForCausalLM"
        )


def _validate(cfg: DeepseekV2Config) -> None:
    if cfg.hidden_act != "silu":
        raise ConfigError(f"hidden_act {cfg.hidden_act!r} is not supported (only silu)")
    if cfg.attention_bias:
        raise ConfigError("attention_bias=true is not supported")
    if cfg.qk_rope_head_dim % 2:
        raise ConfigError("qk_rope_head_dim must be even")
    if cfg.topk_method not in SUPPORTED_TOPK_METHODS:
        raise ConfigError(f"topk_method {cfg.topk_method!r} not in {SUPPORTED_TOPK_METHODS}")
    if cfg.n_routed_experts and not 0 < cfg.num_experts_per_tok <= cfg.n_routed_experts:
        raise ConfigError("num_experts_per_tok must be in 1..n_routed_experts")
    if cfg.topk_method == "group_limited_greedy":
        if not cfg.n_group or not cfg.topk_group or cfg.n_routed_experts % cfg.n_group:
            raise ConfigError("group_limited_greedy needs n_group dividing n_routed_experts and topk_group")
        if cfg.topk_group > cfg.n_group:
            raise ConfigError("topk_group must not exceed n_group")
        per_group = cfg.n_routed_experts // cfg.n_group
        if cfg.topk_group * per_group < cfg.num_experts_per_tok:
            raise ConfigError("topk_group groups hold fewer experts than num_experts_per_tok")


def _req_int(raw: dict[str, Any], key: str) -> int:
    value = raw.get(key)
    if value is None:
        raise ConfigError(f"config.json lacks required field {key!r}")
    return int(value)


def _req_key(raw: dict[str, Any], key: str) -> Any:
    # Absent and null differ: Hugging Face substitutes a default for an absent key.
    if key not in raw:
        raise ConfigError(f"config.json lacks required field {key!r} (null is allowed)")
    return raw[key]


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _first_id(value: Any) -> int | None:
    if isinstance(value, list):
        return int(value[0]) if value else None
    return None if value is None else int(value)
