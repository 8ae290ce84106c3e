"""Load a stage's tensors from a safetensors checkpoint or stage artifact.

Only the tensors the stage owns are read: a sharded checkpoint's index maps each name to
its shard, and shards holding none of the stage's tensors are never opened.

A stage artifact built with a weight policy carries each tensor's format in its file metadata
(`libs.weights.metadata`): such tensors load as `PackedWeight`s, copy-on-write maps of the file (never written) in
their stored format (bf16 stays bf16, a q4_k block stays a block), after a check of their block
scales. Plain tensors (a Hugging Face checkpoint) load as float32, or, with `policy`, are encoded
in memory exactly as the artifact builder would encode them.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np

from libs.model.config import DeepseekV2Config
from libs.model.errors import CheckpointError
from libs.model.layout import EMBED, FINAL_NORM, LM_HEAD, layer_prefix, layer_tensors, tensors_for_layers
from libs.weights.codecs import check_blocks, encode
from libs.weights.errors import UnknownWeightFormatError
from libs.weights.formats import weight_format
from libs.weights.metadata import decode_formats
from libs.weights.policy import DEFAULT_POLICY, choose
from libs.weights.tensor import PackedWeight, Weight

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


@dataclass(frozen=True)
class SwiGluWeights:
    gate: Weight  # [inner, hidden]
    up: Weight    # [inner, hidden]
    down: Weight  # [hidden, inner]


@dataclass(frozen=True)
class AttentionWeights:
    q_proj: Weight | None           # [heads*qk_head_dim, hidden] when q_lora_rank is null
    q_a_proj: Weight | None         # [q_lora_rank, hidden]
    q_a_norm: np.ndarray | None     # [q_lora_rank]
    q_b_proj: Weight | None         # [heads*qk_head_dim, q_lora_rank]
    kv_a_proj: Weight               # [kv_lora_rank + rope_dim, hidden]
    kv_a_norm: np.ndarray           # [kv_lora_rank]
    kv_b_proj: Weight               # [heads*(nope+v), kv_lora_rank]
    o_proj: Weight                  # [hidden, heads*v_head_dim]

    def query_lora(self) -> tuple[Weight, np.ndarray, Weight]:
        """(q_a_proj, q_a_norm, q_b_proj) of a layer whose queries go through the q_lora rank."""
        if self.q_a_proj is None or self.q_a_norm is None or self.q_b_proj is None:
            raise CheckpointError("the layer has no q_lora projections")
        return self.q_a_proj, self.q_a_norm, self.q_b_proj


@dataclass(frozen=True)
class MoeWeights:
    router: Weight                   # [n_experts, hidden]
    # [n_experts, inner, hidden] arrays when float32, else one packed weight per expert
    experts_gate: Sequence[Weight]
    experts_up: Sequence[Weight]
    experts_down: Sequence[Weight]    # [n_experts, hidden, inner]
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
    """Weights of layers [layer_start, layer_end) plus the first/last-stage extras."""

    layer_start: int
    layer_end: int
    layers: dict[int, LayerWeights]
    embed: Weight | None            # [vocab, hidden] on the first stage (or tied last stage)
    final_norm: np.ndarray | None   # [hidden] on the last stage
    lm_head: Weight | None          # [vocab, hidden] on the last stage (embed when tied)

    def all_weights(self) -> list[Weight]:
        """Every tensor of the stage (for byte counts and format checks)."""
        found: list[Weight] = [w for w in (self.embed, self.final_norm, self.lm_head) if w is not None]
        for layer in self.layers.values():
            found += layer_tensors_of(layer)
        return found

    def formats(self) -> set[str]:
        """The formats of the stage's matrices (2-D and up; norms are always float32)."""
        return {w.fmt.name if isinstance(w, PackedWeight) else "fp32" for w in self.all_weights() if w.ndim >= 2}

    def resident_bytes(self) -> int:
        return sum(int(w.nbytes) for w in self.all_weights())

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
    checkpoint_dir: str | Path, cfg: DeepseekV2Config, layer_start: int, layer_end: int, first: bool, last: bool,
    policy: str = DEFAULT_POLICY, backend: str = "numpy",
) -> StageWeights:
    """The stage's tensors; `policy` encodes plain (float) tensors in memory, as a build for a
    stage of `backend` would."""
    names = tensors_for_layers(cfg, layer_start, layer_end, first, last)
    head_name = EMBED if cfg.tie_word_embeddings else LM_HEAD
    if last and not first and cfg.tie_word_embeddings and _holds_explicit_head(checkpoint_dir):
        # A stage artifact of a tied model carries the head as an explicit lm_head.weight copy
        # of the embeddings (its manifest says so) and no embeddings of its own.
        names = [LM_HEAD if n == EMBED else n for n in names]
        head_name = LM_HEAD
    raw = read_stage_tensors(checkpoint_dir, names, cfg.num_hidden_layers, policy, backend)
    layers = {i: _layer_weights(cfg, i, raw) for i in range(layer_start, layer_end)}
    return StageWeights(
        layer_start=layer_start,
        layer_end=layer_end,
        layers=layers,
        embed=raw.get(EMBED),
        final_norm=_plain(raw, FINAL_NORM) if last else None,
        lm_head=raw.get(head_name) if last else None,
    )


def _holds_explicit_head(checkpoint_dir: str | Path) -> bool:
    shards = checkpoint_shards(Path(checkpoint_dir))
    return LM_HEAD in shards and EMBED not in shards


def read_stage_tensors(checkpoint_dir: str | Path, names: list[str], layers: int,
                       policy: str = DEFAULT_POLICY, backend: str = "numpy") -> dict[str, Weight]:
    """Packed tensors as stored; plain ones as float32, or encoded by `policy` when not fp32."""
    from libs.model.safetensors_io import map_tensor, read_header_and_metadata, read_tensors_float32

    out: dict[str, Weight] = {}
    for shard, shard_names in names_by_shard(checkpoint_dir, names).items():
        entries, data_start, metadata = read_header_and_metadata(shard)
        formats = decode_formats(metadata)
        plain = [n for n in shard_names if n not in formats]
        for name in shard_names:
            if name in formats:
                out[name] = _packed(name, *formats[name], map_tensor(shard, name, entries, data_start))
        for name, array in read_tensors_float32(shard, plain).items():
            out[name] = _encoded(name, array, layers, policy, backend)
    return out


def _packed(name: str, fmt_name: str, shape: tuple[int, ...], stored: np.ndarray) -> Weight:
    try:
        fmt = weight_format(fmt_name)
    except UnknownWeightFormatError as exc:
        raise CheckpointError(f"tensor {name}: {exc.message}", reason=exc.reason) from exc
    check_blocks(stored, fmt, name)
    try:
        return PackedWeight(fmt, shape, stored)
    except ValueError as exc:
        raise CheckpointError(f"tensor {name}: {exc}") from exc


def _encoded(name: str, array: np.ndarray, layers: int, policy: str, backend: str) -> Weight:
    fmt = choose(policy, name, tuple(array.shape), layers, backend).fmt
    return array if fmt.name == "fp32" else PackedWeight(fmt, tuple(array.shape), encode(array, fmt))


def read_bf16_aware(checkpoint_dir: str | Path, names: list[str]) -> dict[str, np.ndarray]:
    from libs.model.safetensors_io import read_tensors_float32

    out: dict[str, np.ndarray] = {}
    for shard, shard_names in names_by_shard(checkpoint_dir, names).items():
        out.update(read_tensors_float32(shard, shard_names))
    return out


def names_by_shard(checkpoint_dir: str | Path, names: list[str]) -> dict[Path, list[str]]:
    """The shard holding each tensor, only shards holding some; a missing tensor is an error."""
    shards = checkpoint_shards(Path(checkpoint_dir))
    missing = [n for n in names if n not in shards]
    if missing:
        raise CheckpointError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
    by_shard: dict[Path, list[str]] = defaultdict(list)
    for name in names:
        by_shard[shards[name]].append(name)
    return by_shard


def layer_tensors_of(layer: LayerWeights) -> list[Weight]:
    """Every tensor of a decoder layer, routed experts included."""
    a = layer.attention
    found: list[Weight] = [layer.input_norm, layer.post_attention_norm, a.kv_a_proj, a.kv_a_norm, a.kv_b_proj, a.o_proj]
    found += [w for w in (a.q_proj, a.q_a_proj, a.q_a_norm, a.q_b_proj) if w is not None]
    mlps = [layer.dense_mlp] if layer.dense_mlp is not None else []
    if layer.moe is not None:
        found.append(layer.moe.router)
        for stack in (layer.moe.experts_gate, layer.moe.experts_up, layer.moe.experts_down):
            found += [stack] if isinstance(stack, np.ndarray) else list(stack)
        mlps += [layer.moe.shared] if layer.moe.shared is not None else []
    for mlp in mlps:
        found += [mlp.gate, mlp.up, mlp.down]
    return found


def layer_read_sizes(layer: LayerWeights) -> tuple[int, int, int]:
    """(bytes outside the routed experts, bytes of one routed expert, routed experts)."""
    total = sum(int(w.nbytes) for w in layer_tensors_of(layer))
    if layer.moe is None:
        return total, 0, 0
    m = layer.moe
    count = len(m.experts_gate)
    routed = sum(int(w.nbytes) for stack in (m.experts_gate, m.experts_up, m.experts_down)
                 for w in ([stack] if isinstance(stack, np.ndarray) else stack))
    return total - routed, routed // count, count


def _stack(weights: list[Weight]) -> Sequence[Weight]:
    """One [n, ...] float32 array when every expert is float32; else the packed weights as a tuple."""
    if all(isinstance(w, np.ndarray) for w in weights):
        return cast(Sequence[Weight], np.stack(weights))  # type: ignore[arg-type]
    return tuple(weights)


def _swiglu(raw: dict[str, Weight], prefix: str) -> SwiGluWeights:
    return SwiGluWeights(
        gate=raw[prefix + "gate_proj.weight"], up=raw[prefix + "up_proj.weight"], down=raw[prefix + "down_proj.weight"]
    )


def _attention(cfg: DeepseekV2Config, p: str, raw: dict[str, Weight]) -> AttentionWeights:
    lora = cfg.q_lora_rank is not None
    return AttentionWeights(
        q_proj=None if lora else raw[p + "q_proj.weight"],
        q_a_proj=raw[p + "q_a_proj.weight"] if lora else None,
        q_a_norm=_plain(raw, p + "q_a_layernorm.weight") if lora else None,
        q_b_proj=raw[p + "q_b_proj.weight"] if lora else None,
        kv_a_proj=raw[p + "kv_a_proj_with_mqa.weight"],
        kv_a_norm=_plain(raw, p + "kv_a_layernorm.weight"),
        kv_b_proj=raw[p + "kv_b_proj.weight"],
        o_proj=raw[p + "o_proj.weight"],
    )


def _moe(cfg: DeepseekV2Config, p: str, raw: dict[str, Weight]) -> MoeWeights:
    experts = [_swiglu(raw, f"{p}experts.{e}.") for e in range(cfg.n_routed_experts)]
    return MoeWeights(
        router=raw[p + "gate.weight"],
        experts_gate=_stack([x.gate for x in experts]),
        experts_up=_stack([x.up for x in experts]),
        experts_down=_stack([x.down for x in experts]),
        shared=_swiglu(raw, p + "shared_experts.") if cfg.n_shared_experts else None,
    )


def _layer_weights(cfg: DeepseekV2Config, i: int, raw: dict[str, Weight]) -> LayerWeights:
    p = layer_prefix(i)
    for name, shape in layer_tensors(cfg, i).items():
        if raw[name].shape != shape:
            raise CheckpointError(f"tensor {name} has shape {raw[name].shape}, expected {shape}")
    moe = cfg.is_moe_layer(i)
    return LayerWeights(
        input_norm=_plain(raw, p + "input_layernorm.weight"),
        post_attention_norm=_plain(raw, p + "post_attention_layernorm.weight"),
        attention=_attention(cfg, p + "self_attn.", raw),
        dense_mlp=None if moe else _swiglu(raw, p + "mlp."),
        moe=_moe(cfg, p + "mlp.", raw) if moe else None,
    )


def _plain(raw: dict[str, Weight], name: str) -> np.ndarray:
    """A norm weight: always float32 (every policy keeps norms at full precision)."""
    w = raw[name]
    if isinstance(w, PackedWeight):
        raise CheckpointError(f"tensor {name} is stored as {w.fmt.name}; norm weights must be float32")
    return w
