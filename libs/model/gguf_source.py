"""A `deepseek2` GGUF file seen as a Hugging Face `DeepseekV2ForCausalLM` checkpoint.

What llama.cpp's `convert_hf_to_gguf.py` does to the checkpoint, and how it is undone here:

- Names: `token_embd`, `blk.N.attn_q`, `blk.N.ffn_gate_exps`, ... (the table below) stand for
  the Hugging Face names the loader and the artifact builder use. Nothing is permuted for
  deepseek2 (the converter's DeepseekV2Model has no q/k permutation).
- Shapes: GGUF lists dimensions innermost first (`ne`); a tensor's row-major shape is `ne`
  reversed, which is the Hugging Face [out, in] shape. The stored rows are the Hugging Face rows
  in the same GGUF block layouts `libs.weights.formats` holds, so each tensor's bytes are used
  as stored.
- Experts: each layer's routed experts are merged into one 3-D tensor per projection
  ([experts, out, in]); expert `e` is the e-th contiguous slab of its bytes.
- kv_b_proj: older files keep it as `attn_kv_b`; current converters split each head's rows into
  `attn_k_b` (the first qk_nope_head_dim rows, transposed to [heads, kv_lora_rank, nope]) and
  `attn_v_b` ([heads, v_head_dim, kv_lora_rank]). A transposed quantized tensor cannot be
  regrouped as rows, so kv_b_proj is reassembled from both parts' decoded values
  (`compose_kv_b`), exactly; the builder records that conversion.
- Config: from the `deepseek2.*` keys (`config_from_metadata`). A file without
  `deepseek2.attention.key_length_mla` is an older one whose key/value lengths are per head.

Every refusal names what it refused, with a stable reason.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from libs.model.errors import CheckpointError, ConfigError
from libs.model.layout import EMBED, FINAL_NORM, LM_HEAD

ARCHITECTURE = "deepseek2"
# GGUF types whose block layout `libs.weights.formats` holds (llama.cpp's Q8_0 and Q4_K_M presets
# write these, with their fallbacks; Q4_0 and Q6_K too).
ACCEPTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q5_0", "Q5_1", "Q4_0", "Q4_K", "Q6_K")
KV_B_COMPOSED = "kv_b_proj from attn_k_b (transposed) and attn_v_b"


class GgufArchitectureError(ConfigError):
    default_reason = "GGUF_ARCHITECTURE_UNSUPPORTED"


class GgufMetadataError(ConfigError):
    """A required key is absent (GGUF_METADATA_MISSING) or holds a value not accepted."""

    default_reason = "GGUF_METADATA_INVALID"


class GgufTensorTypeError(CheckpointError):
    default_reason = "GGUF_TENSOR_TYPE_UNSUPPORTED"


class GgufTensorError(CheckpointError):
    """A tensor the architecture does not have, or one of the wrong shape or rank."""

    default_reason = "GGUF_TENSOR_UNEXPECTED"


@dataclass(frozen=True)
class GgufTensor:
    """One tensor as the file stores it: row-major shape (`ne` reversed), absolute byte range."""

    name: str
    gguf_type: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class MappedTensor:
    """A Hugging Face tensor: a byte range of the file, or (kv_b_proj) composed of `parts`."""

    name: str
    gguf_type: str
    shape: tuple[int, ...]          # the Hugging Face shape
    offset: int = 0
    nbytes: int = 0
    parts: tuple[GgufTensor, ...] = ()  # (attn_k_b, attn_v_b) when composed

    @property
    def composed(self) -> bool:
        return bool(self.parts)


# GGUF name (after `blk.N.`) -> Hugging Face name (after `model.layers.N.`).
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q_a.weight": "self_attn.q_a_proj.weight",
    "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight",
    "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attn_kv_b.weight": "self_attn.kv_b_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
}
_MERGED_EXPERTS = {"ffn_gate_exps.weight": "gate_proj", "ffn_up_exps.weight": "up_proj",
                   "ffn_down_exps.weight": "down_proj"}
_GLOBAL_NAMES = {"token_embd.weight": EMBED, "output_norm.weight": FINAL_NORM, "output.weight": LM_HEAD}
_SPLIT_KV_B = ("attn_k_b.weight", "attn_v_b.weight")
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")


def is_gguf_file(path: str | Path) -> bool:
    """A checkpoint given as a `.gguf` file (a checkpoint directory is not one)."""
    return Path(path).suffix == ".gguf" and Path(path).is_file()


def require_architecture(metadata: Mapping[str, Any]) -> None:
    arch = metadata.get("general.architecture")
    if arch != ARCHITECTURE:
        raise GgufArchitectureError(f"GGUF architecture {arch!r} is not supported (only {ARCHITECTURE!r})")


def require_types(tensors: list[GgufTensor]) -> None:
    for t in tensors:
        if t.gguf_type not in ACCEPTED_TYPES:
            raise GgufTensorTypeError(
                f"tensor {t.name} is stored as {t.gguf_type}; accepted: {', '.join(ACCEPTED_TYPES)}")


def map_tensors(tensors: list[GgufTensor], cfg_raw: Mapping[str, Any]) -> list[MappedTensor]:
    """The file's tensors under their Hugging Face names, in file order (experts split)."""
    require_types(tensors)
    out: list[MappedTensor] = []
    split: dict[int, dict[str, GgufTensor]] = {}
    for t in tensors:
        if t.name in _GLOBAL_NAMES:
            out.append(MappedTensor(_GLOBAL_NAMES[t.name], t.gguf_type, t.shape, t.offset, t.nbytes))
            continue
        match = _BLOCK.match(t.name)
        if match is None:
            raise GgufTensorError(f"tensor {t.name} is not part of a {ARCHITECTURE} model")
        layer, rest = int(match.group(1)), match.group(2)
        prefix = f"model.layers.{layer}."
        if rest in _LAYER_NAMES:
            out.append(MappedTensor(prefix + _LAYER_NAMES[rest], t.gguf_type, t.shape, t.offset, t.nbytes))
        elif rest in _MERGED_EXPERTS:
            out.extend(_split_experts(t, prefix + "mlp.experts.", _MERGED_EXPERTS[rest]))
        elif rest in _SPLIT_KV_B:
            split.setdefault(layer, {})[rest] = t
        else:
            raise GgufTensorError(f"tensor {t.name} is not part of a {ARCHITECTURE} model")
    for layer, parts in sorted(split.items()):
        out.append(_kv_b_of(layer, parts, cfg_raw))
    return out


def _split_experts(t: GgufTensor, prefix: str, projection: str) -> list[MappedTensor]:
    if len(t.shape) != 3 or t.nbytes % t.shape[0]:
        raise GgufTensorError(f"tensor {t.name}: merged experts need [experts, out, in], found {list(t.shape)}")
    per = t.nbytes // t.shape[0]
    return [MappedTensor(f"{prefix}{e}.{projection}.weight", t.gguf_type, t.shape[1:], t.offset + e * per, per)
            for e in range(t.shape[0])]


def _kv_b_of(layer: int, parts: dict[str, GgufTensor], cfg_raw: Mapping[str, Any]) -> MappedTensor:
    k_b, v_b = parts.get("attn_k_b.weight"), parts.get("attn_v_b.weight")
    if k_b is None or v_b is None:
        missing = "attn_k_b" if k_b is None else "attn_v_b"
        raise GgufTensorError(f"blk.{layer}.{missing}.weight is missing beside its other half",
                              reason="GGUF_TENSOR_MISSING")
    heads, rank = int(cfg_raw["num_attention_heads"]), int(cfg_raw["kv_lora_rank"])
    nope, v_dim = int(cfg_raw["qk_nope_head_dim"]), int(cfg_raw["v_head_dim"])
    if k_b.shape != (heads, rank, nope) or v_b.shape != (heads, v_dim, rank):
        raise GgufTensorError(
            f"blk.{layer}: attn_k_b {list(k_b.shape)} / attn_v_b {list(v_b.shape)} are not "
            f"[{heads}, {rank}, {nope}] / [{heads}, {v_dim}, {rank}]", reason="GGUF_TENSOR_WRONG_SHAPE")
    same_float = k_b.gguf_type == v_b.gguf_type and k_b.gguf_type in ("F32", "F16", "BF16")
    return MappedTensor(f"model.layers.{layer}.self_attn.kv_b_proj.weight", k_b.gguf_type if same_float else "F32",
                        (heads * (nope + v_dim), rank), parts=(k_b, v_b))


def bits_per_weight(tensors: list[GgufTensor]) -> float:
    """The file's stored bits per weight, over every tensor."""
    elements = sum(int(np.prod(t.shape, dtype=np.int64)) for t in tensors)
    return 8.0 * sum(t.nbytes for t in tensors) / max(elements, 1)


def planning_policy(path: str) -> tuple[str, float]:
    """(the weight policy whose bytes are nearest the file's stored bits per weight, those bits):
    how a planner counts a GGUF's bytes, an estimate."""
    from libs.weights.policy import nearest_policy

    bits = bits_per_weight(read_gguf(path)[1])
    return nearest_policy(bits), bits


def compose_kv_b(k_b: np.ndarray, v_b: np.ndarray) -> np.ndarray:
    """kv_b_proj [heads * (nope + v), rank] from attn_k_b [heads, rank, nope] and attn_v_b
    [heads, v, rank]: each head's nope rows (k_b transposed back), then its v rows."""
    heads, rank, _ = k_b.shape
    return np.concatenate([np.swapaxes(k_b, 1, 2), v_b], axis=1).reshape(-1, rank)


# -- config ----------------------------------------------------------------------------------


def _key(metadata: Mapping[str, Any], name: str) -> Any:
    full = f"{ARCHITECTURE}.{name}"
    if full not in metadata:
        raise GgufMetadataError(f"GGUF metadata lacks {full}", reason="GGUF_METADATA_MISSING")
    return metadata[full]


def _int(metadata: Mapping[str, Any], name: str, default: int | None = None) -> int:
    value = metadata.get(f"{ARCHITECTURE}.{name}", default) if default is not None else _key(metadata, name)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise GgufMetadataError(f"GGUF metadata {ARCHITECTURE}.{name} = {value!r} is not a count")
    return int(value)


def _float(metadata: Mapping[str, Any], name: str, default: float | None = None) -> float:
    value = metadata.get(f"{ARCHITECTURE}.{name}", default) if default is not None else _key(metadata, name)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise GgufMetadataError(f"GGUF metadata {ARCHITECTURE}.{name} = {value!r} is not a number")
    # GGUF stores float32: take its shortest decimal, so 1e-06 stays 1e-06.
    return float(str(np.float32(value)))


def config_from_metadata(metadata: Mapping[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """A Hugging Face `config.json` dict for the file (see the module docstring)."""
    require_architecture(metadata)
    rope_dim, qk_head, v_dim = _head_dims(metadata)
    _require_softmax_gating(metadata)
    groups, q_lora = _int(metadata, "expert_group_count", 0), _int(metadata, "attention.q_lora_rank", 0)
    tokens = metadata.get("tokenizer.ggml.tokens")
    vocab = _int(metadata, "vocab_size", len(tokens)) if tokens is not None else _int(metadata, "vocab_size")
    raw: dict[str, Any] = {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "hidden_act": "silu",
        "attention_bias": False,
        "torch_dtype": "float32",
        "vocab_size": vocab,
        "hidden_size": _int(metadata, "embedding_length"),
        "intermediate_size": _int(metadata, "feed_forward_length"),
        "moe_intermediate_size": _int(metadata, "expert_feed_forward_length"),
        "num_hidden_layers": _int(metadata, "block_count"),
        "num_attention_heads": _int(metadata, "attention.head_count"),
        "kv_lora_rank": _int(metadata, "attention.kv_lora_rank"),
        "q_lora_rank": q_lora or None,
        "qk_rope_head_dim": rope_dim,
        "qk_nope_head_dim": qk_head - rope_dim,
        "v_head_dim": v_dim,
        "n_routed_experts": _int(metadata, "expert_count"),
        "num_experts_per_tok": _int(metadata, "expert_used_count"),
        "n_shared_experts": _int(metadata, "expert_shared_count", 0),
        "first_k_dense_replace": _int(metadata, "leading_dense_block_count", 0),
        "moe_layer_freq": 1,
        "routed_scaling_factor": _float(metadata, "expert_weights_scale", 1.0),
        "norm_topk_prob": bool(metadata.get(f"{ARCHITECTURE}.expert_weights_norm", False)),
        "topk_method": "group_limited_greedy" if groups > 1 else "greedy",
        "n_group": groups if groups > 1 else None,
        "topk_group": _int(metadata, "expert_group_used_count") if groups > 1 else None,
        "rms_norm_eps": _float(metadata, "attention.layer_norm_rms_epsilon"),
        "max_position_embeddings": _int(metadata, "context_length"),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "rope_theta": _float(metadata, "rope.freq_base", 10000.0),
        "rope_scaling": _rope_scaling(metadata),
        "bos_token_id": _token_id(metadata, "bos"),
        "eos_token_id": _token_id(metadata, "eos"),
    }
    return raw


def _head_dims(metadata: Mapping[str, Any]) -> tuple[int, int, int]:
    """(rope dim, query/key head dim, value head dim): the MLA lengths where the file has them."""
    rope_dim = _int(metadata, "rope.dimension_count")
    if f"{ARCHITECTURE}.attention.key_length_mla" in metadata:
        qk_head, v_dim = _int(metadata, "attention.key_length_mla"), _int(metadata, "attention.value_length_mla")
    else:
        qk_head, v_dim = _int(metadata, "attention.key_length"), _int(metadata, "attention.value_length")
    if qk_head <= rope_dim:
        raise GgufMetadataError(f"key length {qk_head} does not exceed the rope dimension {rope_dim}")
    return rope_dim, qk_head, v_dim


def _require_softmax_gating(metadata: Mapping[str, Any]) -> None:
    gating = metadata.get(f"{ARCHITECTURE}.expert_gating_func", 1)
    if gating != 1:  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX
        raise GgufMetadataError(
            f"{ARCHITECTURE}.expert_gating_func = {gating!r}: only softmax routing (1) is supported")


def config_json_bytes(raw: Mapping[str, Any]) -> bytes:
    """The derived config.json's bytes (one spelling, so its hash names the config)."""
    import json

    return (json.dumps(raw, indent=2, sort_keys=True) + "\n").encode()


def _rope_scaling(metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    kind = metadata.get(f"{ARCHITECTURE}.rope.scaling.type", "none")
    if kind in ("none", None):
        return None
    if kind != "yarn":
        raise GgufMetadataError(f"{ARCHITECTURE}.rope.scaling.type = {kind!r}: only yarn or none are supported")
    # llama.cpp keeps 0.1 * mscale_all_dim; DeepSeek-V2 sets mscale = mscale_all_dim (0 when the
    # file has no multiplier: then neither the rotation nor the softmax is rescaled).
    mscale = float(str(np.float32(_float(metadata, "rope.scaling.yarn_log_multiplier", 0.0) / 0.1)))
    return {
        "type": "yarn",
        "factor": _float(metadata, "rope.scaling.factor"),
        "original_max_position_embeddings": _int(metadata, "rope.scaling.original_context_length"),
        "beta_fast": _float(metadata, "rope.scaling.yarn_beta_fast", 32.0),
        "beta_slow": _float(metadata, "rope.scaling.yarn_beta_slow", 1.0),
        "mscale": mscale,
        "mscale_all_dim": mscale,
    }


def _token_id(metadata: Mapping[str, Any], which: str) -> int | None:
    value = metadata.get(f"tokenizer.ggml.{which}_token_id")
    return None if value is None else int(value)


# -- the file ----------------------------------------------------------------------------------


class GgufUnreadableError(CheckpointError):
    default_reason = "GGUF_UNREADABLE"


def read_gguf(path: str) -> tuple[dict[str, Any], list[GgufTensor]]:
    """The file's metadata (key -> value) and tensors, read with the `gguf` package."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except (ValueError, OSError, KeyError, IndexError) as exc:
        raise GgufUnreadableError(f"{path} is not a readable GGUF file: {exc}") from exc
    metadata = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    tensors = [GgufTensor(t.name, t.tensor_type.name, tuple(int(d) for d in reversed(t.shape)),
                          int(t.data_offset), int(t.n_bytes)) for t in reader.tensors]
    return metadata, tensors
