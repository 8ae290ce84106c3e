"""Load a stage's tensors from a safetensors checkpoint dir as float32 numpy.

Only the tensors the stage owns are read: a sharded checkpoint's index maps each name to
its shard, and shards holding none of the stage's tensors are never opened.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from libs.model.config import DeepseekV2Config
from libs.model.errors import CheckpointError
from libs.model.layout import EMBED, FINAL_NORM, LM_HEAD, layer_prefix, layer_tensors, tensors_for_layers

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


@dataclass(frozen=True)
class SwiGluWeights:
    gate: np.ndarray  # [inner, hidden]
    up: np.ndarray    # [inner, hidden]
    down: np.ndarray  # [hidden, inner]


@dataclass(frozen=True)
class AttentionWeights:
    q_proj: np.ndarray | None       # [heads*qk_head_dim, hidden] when q_lora_rank is null
    q_a_proj: np.ndarray | None     # [q_lora_rank, hidden]
    q_a_norm: np.ndarray | None     # [q_lora_rank]
    q_b_proj: np.ndarray | None     # [heads*qk_head_dim, q_lora_rank]
    kv_a_proj: np.ndarray           # [kv_lora_rank + rope_dim, hidden]
    kv_a_norm: np.ndarray           # [kv_lora_rank]
    kv_b_proj: np.ndarray           # [heads*(nope+v), kv_lora_rank]
    o_proj: np.ndarray              # [hidden, heads*v_head_dim]

    def query_lora(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(q_a_proj, q_a_norm, q_b_proj) of a layer whose queries go through the q_lora rank."""
        if self.q_a_proj is None or self.q_a_norm is None or self.q_b_proj is None:
            raise CheckpointError("the layer has no q_lora projections")
        return self.q_a_proj, self.q_a_norm, self.q_b_proj


@dataclass(frozen=True)
class MoeWeights:
    router: np.ndarray               # [n_experts, hidden]
    experts_gate: np.ndarray         # [n_experts, inner, hidden]
    experts_up: np.ndarray           # [n_experts, inner, hidden]
    experts_down: np.ndarray         # [n_experts, hidden, inner]
    shared: SwiGluWeights | None


@dataclass(frozen=True)
class LayerWeights:
    input_norm: np.ndarray
    post_attention_norm: np.ndarray
    attention: AttentionWeights
    dense_mlp: SwiGluWeights | None
    moe: MoeWeights | None

    def dense(self) -> SwiGluWeights:
        if self.dense_mlp is None:
            raise CheckpointError("the layer is a MoE layer and has no dense MLP")
        return self.dense_mlp

    def routed(self) -> MoeWeights:
        if self.moe is None:
            raise CheckpointError("the layer is a dense layer and has no experts")
        return self.moe


@dataclass(frozen=True)
class StageWeights:
    """Float32 weights of layers [layer_start, layer_end) plus the first/last-stage extras."""

    layer_start: int
    layer_end: int
    layers: dict[int, LayerWeights]
    embed: np.ndarray | None        # [vocab, hidden] on the first stage (or tied last stage)
    final_norm: np.ndarray | None   # [hidden] on the last stage
    lm_head: np.ndarray | None      # [vocab, hidden] on the last stage (embed when tied)

    def layer(self, layer_index: int) -> LayerWeights:
        try:
            return self.layers[layer_index]
        except KeyError:
            raise CheckpointError(
                f"layer {layer_index} is outside this stage [{self.layer_start}, {self.layer_end})"
            ) from None


def checkpoint_shards(checkpoint_dir: Path) -> dict[str, Path]:
    """Tensor name -> shard file, from the index when sharded or the single file otherwise."""
    index_path = checkpoint_dir / INDEX_NAME
    if index_path.exists():
        weight_map = json.loads(index_path.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index_path} has no weight_map")
        return {name: checkpoint_dir / shard for name, shard in weight_map.items()}
    single = checkpoint_dir / SINGLE_NAME
    if not single.exists():
        raise CheckpointError(f"{checkpoint_dir} has neither {INDEX_NAME} nor {SINGLE_NAME}")
    from libs.model.safetensors_io import read_header

    entries, _ = read_header(single)
    return dict.fromkeys(entries, single)


def load_stage_weights(
    checkpoint_dir: str | Path, cfg: DeepseekV2Config, layer_start: int, layer_end: int, first: bool, last: bool
) -> StageWeights:
    names = tensors_for_layers(cfg, layer_start, layer_end, first, last)
    head_name = EMBED if cfg.tie_word_embeddings else LM_HEAD
    if last and not first and cfg.tie_word_embeddings and _holds_explicit_head(checkpoint_dir):
        # A stage artifact of a tied model carries the head as an explicit lm_head.weight copy
        # of the embeddings (its manifest says so) and no embeddings of its own.
        names = [LM_HEAD if n == EMBED else n for n in names]
        head_name = LM_HEAD
    raw = read_bf16_aware(checkpoint_dir, names)
    layers = {i: _layer_weights(cfg, i, raw) for i in range(layer_start, layer_end)}
    return StageWeights(
        layer_start=layer_start,
        layer_end=layer_end,
        layers=layers,
        embed=raw.get(EMBED),
        final_norm=raw.get(FINAL_NORM) if last else None,
        lm_head=raw.get(head_name) if last else None,
    )


def _holds_explicit_head(checkpoint_dir: str | Path) -> bool:
    shards = checkpoint_shards(Path(checkpoint_dir))
    return LM_HEAD in shards and EMBED not in shards


def read_bf16_aware(checkpoint_dir: str | Path, names: list[str]) -> dict[str, np.ndarray]:
    from libs.model.safetensors_io import read_tensors_float32

    shards = checkpoint_shards(Path(checkpoint_dir))
    missing = [n for n in names if n not in shards]
    if missing:
        raise CheckpointError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
    by_shard: dict[Path, list[str]] = defaultdict(list)
    for name in names:
        by_shard[shards[name]].append(name)
    out: dict[str, np.ndarray] = {}
    for shard, shard_names in by_shard.items():
        out.update(read_tensors_float32(shard, shard_names))
    return out


def _swiglu(raw: dict[str, np.ndarray], prefix: str) -> SwiGluWeights:
    return SwiGluWeights(
        gate=raw[prefix + "gate_proj.weight"], up=raw[prefix + "up_proj.weight"], down=raw[prefix + "down_proj.weight"]
    )


def _attention(cfg: DeepseekV2Config, p: str, raw: dict[str, np.ndarray]) -> AttentionWeights:
    lora = cfg.q_lora_rank is not None
    return AttentionWeights(
        q_proj=None if lora else raw[p + "q_proj.weight"],
        q_a_proj=raw[p + "q_a_proj.weight"] if lora else None,
        q_a_norm=raw[p + "q_a_layernorm.weight"] if lora else None,
        q_b_proj=raw[p + "q_b_proj.weight"] if lora else None,
        kv_a_proj=raw[p + "kv_a_proj_with_mqa.weight"],
        kv_a_norm=raw[p + "kv_a_layernorm.weight"],
        kv_b_proj=raw[p + "kv_b_proj.weight"],
        o_proj=raw[p + "o_proj.weight"],
    )


def _moe(cfg: DeepseekV2Config, p: str, raw: dict[str, np.ndarray]) -> MoeWeights:
    experts = [_swiglu(raw, f"{p}experts.{e}.") for e in range(cfg.n_routed_experts)]
    return MoeWeights(
        router=raw[p + "gate.weight"],
        experts_gate=np.stack([x.gate for x in experts]),
        experts_up=np.stack([x.up for x in experts]),
        experts_down=np.stack([x.down for x in experts]),
        shared=_swiglu(raw, p + "shared_experts.") if cfg.n_shared_experts else None,
    )


def _layer_weights(cfg: DeepseekV2Config, i: int, raw: dict[str, np.ndarray]) -> LayerWeights:
    p = layer_prefix(i)
    for name, shape in layer_tensors(cfg, i).items():
        if raw[name].shape != shape:
            raise CheckpointError(f"tensor {name} has shape {raw[name].shape}, expected {shape}")
    moe = cfg.is_moe_layer(i)
    return LayerWeights(
        input_norm=raw[p + "input_layernorm.weight"],
        post_attention_norm=raw[p + "post_attention_layernorm.weight"],
        attention=_attention(cfg, p + "self_attn.", raw),
        dense_mlp=None if moe else _swiglu(raw, p + "mlp."),
        moe=_moe(cfg, p + "mlp.", raw) if moe else None,
    )
