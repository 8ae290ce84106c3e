"""Tensor names and shapes of a Hugging Face `DeepseekV2ForCausalLM` checkpoint.

Layer ranges are half-open: `layer_start` inclusive, `layer_end` exclusive.
"""

from __future__ import annotations

from dataclasses import dataclass

from libs.model.config import DeepseekV2Config

EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"


@dataclass(frozen=True)
class TensorSpec:
    dtype: str  # safetensors dtype name of the stored tensor, e.g. "BF16"
    shape: tuple[int, ...]


def layer_prefix(layer_index: int) -> str:
    return f"model.layers.{layer_index}."


def attention_tensors(cfg: DeepseekV2Config, layer_index: int) -> dict[str, tuple[int, ...]]:
    p = layer_prefix(layer_index) + "self_attn."
    h, heads = cfg.hidden_size, cfg.num_attention_heads
    shapes: dict[str, tuple[int, ...]] = {}
    if cfg.q_lora_rank is None:
        shapes[p + "q_proj.weight"] = (heads * cfg.qk_head_dim, h)
    else:
        shapes[p + "q_a_proj.weight"] = (cfg.q_lora_rank, h)
        shapes[p + "q_a_layernorm.weight"] = (cfg.q_lora_rank,)
        shapes[p + "q_b_proj.weight"] = (heads * cfg.qk_head_dim, cfg.q_lora_rank)
    shapes[p + "kv_a_proj_with_mqa.weight"] = (cfg.kv_lora_rank + cfg.qk_rope_head_dim, h)
    shapes[p + "kv_a_layernorm.weight"] = (cfg.kv_lora_rank,)
    shapes[p + "kv_b_proj.weight"] = (heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank)
    shapes[p + "o_proj.weight"] = (h, heads * cfg.v_head_dim)
    return shapes


def _swiglu(prefix: str, hidden: int, inner: int) -> dict[str, tuple[int, ...]]:
    return {
        prefix + "gate_proj.weight": (inner, hidden),
        prefix + "up_proj.weight": (inner, hidden),
        prefix + "down_proj.weight": (hidden, inner),
    }


def mlp_tensors(cfg: DeepseekV2Config, layer_index: int) -> dict[str, tuple[int, ...]]:
    p = layer_prefix(layer_index) + "mlp."
    h = cfg.hidden_size
    if not cfg.is_moe_layer(layer_index):
        return _swiglu(p, h, cfg.intermediate_size)
    shapes: dict[str, tuple[int, ...]] = {p + "gate.weight": (cfg.n_routed_experts, h)}
    for e in range(cfg.n_routed_experts):
        shapes.update(_swiglu(f"{p}experts.{e}.", h, cfg.moe_intermediate_size))
    if cfg.n_shared_experts:
        shapes.update(_swiglu(p + "shared_experts.", h, cfg.moe_intermediate_size * cfg.n_shared_experts))
    return shapes


def layer_tensors(cfg: DeepseekV2Config, layer_index: int) -> dict[str, tuple[int, ...]]:
    p = layer_prefix(layer_index)
    shapes: dict[str, tuple[int, ...]] = {p + "input_layernorm.weight": (cfg.hidden_size,)}
    shapes.update(attention_tensors(cfg, layer_index))
    shapes[p + "post_attention_layernorm.weight"] = (cfg.hidden_size,)
    shapes.update(mlp_tensors(cfg, layer_index))
    return shapes


def expected_tensors(cfg: DeepseekV2Config, dtype: str = "BF16") -> dict[str, TensorSpec]:
    """Every tensor of the checkpoint, in checkpoint order (embeddings, layers, norm, head)."""
    shapes: dict[str, tuple[int, ...]] = {EMBED: (cfg.vocab_size, cfg.hidden_size)}
    for i in range(cfg.num_hidden_layers):
        shapes.update(layer_tensors(cfg, i))
    shapes[FINAL_NORM] = (cfg.hidden_size,)
    if not cfg.tie_word_embeddings:
        shapes[LM_HEAD] = (cfg.vocab_size, cfg.hidden_size)
    return {name: TensorSpec(dtype, shape) for name, shape in shapes.items()}


def tensors_for_layers(
    cfg: DeepseekV2Config, layer_start: int, layer_end: int, first: bool, last: bool
) -> list[str]:
    """Tensor names a stage owning layers [layer_start, layer_end) must load.

    The first stage owns the embeddings; the last owns the final norm and the LM head,
    which is the embedding matrix itself when the embeddings are tied.
    """
    if not 0 <= layer_start <= layer_end <= cfg.num_hidden_layers:
        raise ValueError(
            f"layer range [{layer_start}, {layer_end}) outside 0..{cfg.num_hidden_layers}"
        )
    names: list[str] = []
    if first:
        names.append(EMBED)
    for i in range(layer_start, layer_end):
        names.extend(layer_tensors(cfg, i))
    if last:
        names.append(FINAL_NORM)
        head = EMBED if cfg.tie_word_embeddings else LM_HEAD
        if head not in names:
            names.append(head)
    return names


def even_layer_split(num_layers: int, stages: int) -> list[tuple[int, int]]:
    """Contiguous [layer_start, layer_end) ranges, sizes differing by at most one (larger first)."""
    if not 1 <= stages <= num_layers:
        raise ValueError(f"cannot cut {num_layers} layers into {stages} stages")
    base, extra = divmod(num_layers, stages)
    bounds, start = [], 0
    for index in range(stages):
        end = start + base + (1 if index < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds
