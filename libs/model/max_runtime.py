"""MAX session, per-kind compile and per-layer weight binding. Imports `max` at module load,
so it is imported only after `max_kernels` has set the compile-cache environment."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from max.driver import CPU, Accelerator, Buffer, accelerator_count
from max.dtype import DType
from max.engine import InferenceSession

from libs.model.config import DeepseekV2Config
from libs.model.custom_kernels import CUSTOM_OP_FORMATS, gguf_matmul_package, needs_custom_op
from libs.model.errors import BackendUnavailableError, CheckpointError
from libs.model.max_graphs import (
    LINEAR_WEIGHTS,
    QMATMUL_ENCODINGS,
    GraphKind,
    GraphSpec,
    attention_weight_shapes,
    build_graph,
    expert_weight_names,
    full_precision,
    mlp_weight_shapes,
    runs_custom_op,
)
from libs.model.max_repack import Repacker
from libs.model.safetensors_io import joined_rows
from libs.model.weights import LayerWeights, MoeWeights
from libs.weights.errors import WeightFormatUnsupportedError
from libs.weights.policy import MAX_QMATMUL_OUT_MULTIPLE
from libs.weights.tensor import PackedWeight, Weight, dense

# First-run compile times, shown before a compile that may miss the cache. Measured fully cold
# (empty MAX and Mojo caches, as on a fresh machine) on a 2-core x86 host at load average
# 1.5-1.6 (physical, max 26.7.0, `fornax max warmup`, tiny-lora-yarn preset): embed 30 s,
# final 78 s, dense_layer 149 s, moe_layer 153 s, expert 134 s. Under load 10-15 the small
# preset's moe_layer and expert graphs took 1,067 s and 417 s.
_FIRST_RUN_HINT = {
    GraphKind.EMBED: "under 1 min",
    GraphKind.DENSE_LAYER: "2-5 min",
    GraphKind.MOE_LAYER: "3-18 min",
    GraphKind.FINAL: "1-4 min",
    GraphKind.EXPERT: "2-7 min",
}


def graph_kinds_for(cfg: DeepseekV2Config) -> list[GraphKind]:
    """Every graph kind a whole model of `cfg` needs."""
    kinds = [GraphKind.EMBED, GraphKind.FINAL]
    layers = range(cfg.num_hidden_layers)
    if any(not cfg.is_moe_layer(i) for i in layers):
        kinds.append(GraphKind.DENSE_LAYER)
    if any(cfg.is_moe_layer(i) for i in layers):
        kinds += [GraphKind.MOE_LAYER, GraphKind.EXPERT]
    return kinds


_RUNTIMES: dict[tuple[DeepseekV2Config, str, str, str], Runtime] = {}


def shared_runtime(cfg: DeepseekV2Config, device: str, weight_dtype: str, progress: Callable[[str], None],
                   activations: str = "int8") -> Runtime:
    """One session and one compile per graph kind per process, shared by every stage in it."""
    key = (cfg, device, weight_dtype, activations)
    runtime = _RUNTIMES.get(key)
    if runtime is None:
        runtime = _RUNTIMES[key] = Runtime(cfg, device, weight_dtype, progress, activations)
    return runtime


def kernel_package_for(quant: Quant, activations: str) -> str:
    """The Mojo custom-op package path when a product of `quant` runs a custom op, else "";
    built on first use into the MAX compile-cache dir this process compiles into."""
    from libs.model.max_kernels import default_cache_dir, max_build

    if not any(needs_custom_op(fmt, activations) for _, fmt in quant):
        return ""
    cache = os.environ.get("MODULAR_MAX_CACHE_DIR")
    return str(gguf_matmul_package(Path(cache) if cache else default_cache_dir(os.environ), max_build()))


class Runtime:
    """Owns the session; compiles each graph kind once, binds it once per weight set."""

    def __init__(self, cfg: DeepseekV2Config, device: str, weight_dtype: str, progress: Callable[[str], None],
                 activations: str = "int8") -> None:
        from max.graph import DeviceRef

        self.cfg = cfg
        self.progress = progress
        self.activations = activations
        if device == "gpu":
            if accelerator_count() == 0:
                raise BackendUnavailableError("max device 'gpu' was asked for but no accelerator is present")
            self.device = Accelerator(0)
            self.device_ref = DeviceRef.GPU(0)
        else:
            self.device = CPU()
            self.device_ref = DeviceRef.CPU()
        self.on_host = device == "cpu"
        self.device_description = f"{device}:{self.device.label if hasattr(self.device, 'label') else device}"
        self.weight_dtype = DType.bfloat16 if weight_dtype == "bfloat16" else DType.float32
        self.session = InferenceSession(devices=[self.device])
        self.repacker = Repacker(self.session, self.device, self.device_ref)
        self._compiled: dict[tuple[GraphKind, Quant], Any] = {}
        self.compile_seconds: dict[str, float] = {}

    def layer_kind(self, layer_index: int) -> GraphKind:
        return GraphKind.MOE_LAYER if self.cfg.is_moe_layer(layer_index) else GraphKind.DENSE_LAYER

    def compiled(self, kind: GraphKind, quant: Quant = ()) -> Any:
        """The compiled graph of `kind` whose linear weights `quant` names run in block formats."""
        if (kind, quant) not in self._compiled:
            label = kind.value + "".join(f" {name}:{fmt}" for name, fmt in quant)
            self.progress(  # MAX cannot say beforehand whether its cache holds the graph
                f"max: {label} graph: loading it from the compile cache, or compiling it (a first "
                f"compile on an empty cache dir: {_FIRST_RUN_HINT[kind]} on 2 cores)..."
            )
            start = time.perf_counter()
            package = kernel_package_for(quant, self.activations)
            graph = build_graph(GraphSpec(kind, self.cfg, self.weight_dtype, self.device_ref, quant,
                                          self.activations, package))
            self._compiled[(kind, quant)] = self.session.compile(graph)
            seconds = time.perf_counter() - start
            key = kind.value if not quant else f"{kind.value}[{','.join(sorted({f for _, f in quant}))}]"
            self.compile_seconds[key] = self.compile_seconds.get(key, 0.0) + seconds
            self.progress(f"max: {label} graph ready in {seconds:.1f} s")
        return self._compiled[(kind, quant)]

    def bind(self, kind: GraphKind, registry: dict[str, Weight]) -> BoundModel:
        """A model bound to `registry`; the caller owns it, and dropping it frees the weights.
        Block-format weights are bound in MAX's product layout, repacked once here, where its
        packed product runs them, else as their stored GGUF bytes (see `max_graphs`)."""
        quant = quant_signature(registry, self.activations)
        buffers = {}
        for name, w in registry.items():
            if isinstance(w, PackedWeight) and w.fmt.is_block:
                buffers[name] = self._block_buffer(w.fmt.name, w.shape[0], w.data)
            else:
                array = self.graph_array(w, full=bool(quant) and full_precision(name, len(w.shape)))
                buffers[name] = self._weight_buffer(array.T if name in LINEAR_WEIGHTS else array)
        return BoundModel(self.session.init(self.compiled(kind, quant), weights_registry=buffers), buffers)

    def graph_array(self, w: Weight, full: bool = False) -> np.ndarray:
        """The weight in the graph's stored dtype: float32, or bf16 bit patterns (uint16).

        bf16 weights go in as their stored bits, never through a float32 copy; a float32 tensor
        (a norm, the router) in a bf16 graph is rounded to bf16, unless `full`: a graph with
        block-format products declares those float32 (`GraphSpec.float32_math`). Formats the
        graphs have no kernel for are refused, never widened."""
        if isinstance(w, PackedWeight):
            if w.fmt.name == "bf16" and self.weight_dtype == DType.bfloat16:
                return w.data
            raise WeightFormatUnsupportedError(
                f"the MAX stage runs {self.weight_dtype} graphs; it cannot hold {w.fmt.name} weights here")
        array = np.ascontiguousarray(w, dtype=np.float32)
        return _to_bf16_bits(array) if self.weight_dtype == DType.bfloat16 and not full else array

    def _block_buffer(self, fmt: str, out_dim: int, stored: np.ndarray) -> Any:
        """A block-format weight as the graph binds it: repacked once for MAX's packed product,
        or its stored GGUF bytes where the Mojo custom op runs it (`max_graphs.runs_custom_op`)."""
        if runs_custom_op(fmt, out_dim, self.activations):
            return self._weight_buffer(stored)
        return self.repacker.repack(fmt, stored)

    def _weight_buffer(self, array: np.ndarray) -> Any:
        array = np.ascontiguousarray(array)
        if array.dtype == np.uint16:
            buffer = Buffer.from_numpy(array).view(DType.bfloat16, array.shape)
        else:
            buffer = Buffer.from_numpy(array)
        return buffer if self.on_host else buffer.to(self.device)

    def bind_experts(self, moe: MoeWeights) -> BoundModel:
        """The routed-experts graph bound to one layer's experts, laid out once at load time:
        float experts as [in, out] arrays in the graph's dtype, block-format experts as their
        GGUF rows (gate rows, then up rows: rows are independent in every block format), as
        `_block_buffer` binds them."""
        gate_up_fmt = _expert_format(moe.experts_gate[0], moe.experts_up[0])
        down_fmt = _expert_format(moe.experts_down[0])
        buffers: dict[str, Any] = {}
        for expert in range(len(moe.experts_gate)):
            gate_up_name, down_name = expert_weight_names(expert)
            gate, up, down = moe.experts_gate[expert], moe.experts_up[expert], moe.experts_down[expert]
            if gate_up_fmt:
                buffers[gate_up_name] = self._block_buffer(gate_up_fmt, 2 * self.cfg.moe_intermediate_size,
                                                           _gate_up_rows(gate, up, gate_up_fmt))
            else:  # [2I, H]; bound as [H, 2I]
                buffers[gate_up_name] = self._weight_buffer(
                    np.concatenate([self.graph_array(gate), self.graph_array(up)]).T)
            buffers[down_name] = (self._block_buffer(down_fmt, self.cfg.hidden_size, _block_bytes(down, down_fmt))
                                  if down_fmt else self._weight_buffer(self.graph_array(down).T))
        quant = expert_quant(moe)
        return BoundModel(self.session.init(self.compiled(GraphKind.EXPERT, quant), weights_registry=buffers), buffers)

    def run(self, bound: BoundModel, *arrays: np.ndarray, host_flags: tuple[bool, ...] = ()) -> list[np.ndarray]:
        """Executes with `arrays` on the device and `host_flags` (branch switches, bool scalars)
        on the host. (A 0-d numpy bool cannot go through `Buffer.from_numpy` in max 26.7.)"""
        flags = (Buffer.scalar(bool(flag), DType.bool, CPU()) for flag in host_flags)
        outputs = bound.model.execute(*(self._input(a) for a in arrays), *flags)
        if self.on_host:
            return [out.to_numpy() for out in outputs]
        return [out.to(CPU()).to_numpy() for out in outputs]

    def _input(self, array: np.ndarray) -> Any:
        buffer = Buffer.from_numpy(array)
        return buffer if self.on_host else buffer.to(self.device)

    def run_moe(self, bound: BoundModel, experts: BoundModel, *arrays: np.ndarray,
                host_flags: tuple[bool, ...] = ()) -> list[np.ndarray]:
        """MoE layer graph, then the routed-experts graph once over every expert's rows;
        returns [hidden, new_latent, new_k_rope, expert_ids]."""
        hidden, latent, k_rope, ids, x, weights = self.run(bound, *arrays, host_flags=host_flags)
        rows, routing, used = group_by_expert(ids, weights, self.cfg.n_routed_experts)
        inputs = [hidden, x]
        for expert_rows, expert_weights in zip(rows, routing, strict=True):
            inputs += [expert_rows, expert_weights]
        (hidden,) = self.run(experts, *inputs, host_flags=tuple(used))
        return [hidden, latent, k_rope, ids]


def group_by_expert(ids: np.ndarray, weights: np.ndarray, experts: int
                    ) -> tuple[list[np.ndarray], list[np.ndarray], list[bool]]:
    """Per expert: the rows routed to it (int32, ascending), their routing weights (float32),
    and whether it has any. An expert without rows gets a one-element placeholder (row 0,
    weight 0) that its skipped branch never reads."""
    k = ids.shape[1]
    flat = ids.reshape(-1)
    order = np.argsort(flat, kind="stable")
    bounds = np.searchsorted(flat[order], np.arange(experts + 1))
    flat_weights = weights.reshape(-1).astype(np.float32, copy=False)
    rows, routing, used = [], [], []
    for expert in range(experts):
        picks = order[bounds[expert]:bounds[expert + 1]]
        if picks.size == 0:
            rows.append(np.zeros(1, np.int32))
            routing.append(np.zeros(1, np.float32))
            used.append(False)
            continue
        rows.append((picks // k).astype(np.int32))  # a row picks an expert at most once
        routing.append(np.ascontiguousarray(flat_weights[picks]))
        used.append(True)
    return rows, routing, used


Quant = tuple[tuple[str, str], ...]


def quant_signature(registry: dict[str, Weight], activations: str = "int8") -> Quant:
    """(weight name, block format) of every block-format weight of a registry, sorted; a block
    format MAX has no kernel for is refused here, never widened."""
    found = []
    for name, w in registry.items():
        if isinstance(w, PackedWeight) and w.fmt.is_block:
            fmt = w.fmt.name
            runnable = fmt in CUSTOM_OP_FORMATS and name in LINEAR_WEIGHTS
            if not runnable or (not needs_custom_op(fmt, activations) and w.shape[0] % MAX_QMATMUL_OUT_MULTIPLE):
                raise WeightFormatUnsupportedError(
                    f"MAX cannot run weight {name} {list(w.shape)} in {fmt} (in-graph block formats: "
                    f"{', '.join(CUSTOM_OP_FORMATS)} for linear products; with int8 activations "
                    f"{', '.join(QMATMUL_ENCODINGS)} need an output dim that is a multiple of "
                    f"{MAX_QMATMUL_OUT_MULTIPLE}); build the stage for the max backend")
            found.append((name, fmt))
    return tuple(sorted(found))


def expert_quant(moe: MoeWeights) -> Quant:
    """The routed-experts graph variant a layer's experts need."""
    gate_up = _expert_format(moe.experts_gate[0], moe.experts_up[0])
    down = _expert_format(moe.experts_down[0])
    return tuple(sorted((n, f) for n, f in (("experts_down", down), ("experts_gate_up", gate_up)) if f))


def _expert_format(*weights: Weight) -> str:
    """The block format of a layer's expert projections ("" when float); gate and up share one."""
    formats = {w.fmt.name if isinstance(w, PackedWeight) and w.fmt.is_block else "" for w in weights}
    if len(formats) != 1:
        raise WeightFormatUnsupportedError(f"an expert's gate and up projections differ in format: {sorted(formats)}")
    fmt = formats.pop()
    if fmt and fmt not in CUSTOM_OP_FORMATS:
        raise WeightFormatUnsupportedError(f"MAX has no in-graph kernel for {fmt} expert weights")
    return fmt


def _gate_up_rows(gate: Weight, up: Weight, fmt: str) -> np.ndarray:
    """An expert's gate rows then its up rows: one map of the artifact where they lie back to
    back in it (the repack reads them in place), else a concatenated copy."""
    gate_bytes, up_bytes = _block_bytes(gate, fmt), _block_bytes(up, fmt)
    if isinstance(gate, PackedWeight) and isinstance(up, PackedWeight):
        joined = joined_rows(gate.data, up.data)
        if joined is not None:
            return joined
    return np.concatenate([gate_bytes, up_bytes])


def _block_bytes(w: Weight, fmt: str) -> np.ndarray:
    if not isinstance(w, PackedWeight) or w.fmt.name != fmt:
        raise WeightFormatUnsupportedError(f"a layer's experts mix formats (expected {fmt} for every expert)")
    return np.ascontiguousarray(w.data)


@dataclass(frozen=True)
class BoundModel:
    model: Any
    buffers: dict[str, Any]  # the registry; must live as long as the model


def _to_bf16_bits(array: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (round to nearest even) as uint16."""
    bits = array.view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    return ((bits + rounding) >> 16).astype(np.uint16)


def layer_registry(cfg: DeepseekV2Config, layer_index: int, w: LayerWeights) -> dict[str, Weight]:
    """Graph weight name -> this layer's tensor (see `max_graphs` for names and layouts)."""
    registry = _layer_arrays(cfg, layer_index, w)
    expected = {**attention_weight_shapes(cfg), **mlp_weight_shapes(cfg, cfg.is_moe_layer(layer_index))}
    for name, shape in expected.items():
        actual = None if registry.get(name) is None else registry[name].shape
        if actual != shape:
            raise CheckpointError(f"layer {layer_index} weight {name}: shape {actual}, expected {shape}")
    heads, nope = cfg.num_attention_heads, cfg.qk_nope_head_dim
    kv_b_weight = registry.pop("kv_b_proj")
    if isinstance(kv_b_weight, PackedWeight) and kv_b_weight.fmt.is_block:
        raise WeightFormatUnsupportedError(
            f"layer {layer_index} kv_b_proj is {kv_b_weight.fmt.name}; MAX uses it in batched per-head products and "
            "holds it in a float format (build the stage for the max backend)")
    kv_b = dense(kv_b_weight).reshape(heads, nope + cfg.v_head_dim, cfg.kv_lora_rank)
    registry["kv_b_k"] = np.ascontiguousarray(kv_b[:, :nope, :])
    registry["kv_b_v"] = np.ascontiguousarray(kv_b[:, nope:, :].transpose(0, 2, 1))
    rank = cfg.kv_lora_rank
    registry["kv_b_k_expand"] = np.ascontiguousarray(kv_b[:, :nope, :].reshape(-1, rank).T)
    registry["kv_b_v_expand"] = np.ascontiguousarray(kv_b[:, nope:, :].reshape(-1, rank).T)
    return registry


def _layer_arrays(cfg: DeepseekV2Config, layer_index: int, w: LayerWeights) -> dict[str, Weight]:
    a = w.attention
    registry: dict[str, Weight] = {
        "input_layernorm": w.input_norm,
        "post_attention_layernorm": w.post_attention_norm,
        "kv_a_proj_with_mqa": a.kv_a_proj,
        "kv_a_layernorm": a.kv_a_norm,
        "kv_b_proj": a.kv_b_proj,
        "o_proj": a.o_proj,
    }
    if a.q_proj is not None:
        registry["q_proj"] = a.q_proj
    else:
        q_a_proj, q_a_norm, q_b_proj = a.query_lora()
        registry.update({"q_a_proj": q_a_proj, "q_a_layernorm": q_a_norm, "q_b_proj": q_b_proj})
    if not cfg.is_moe_layer(layer_index):
        mlp = w.dense()
        registry.update({"gate_proj": mlp.gate, "up_proj": mlp.up, "down_proj": mlp.down})
        return registry
    moe = w.routed()
    registry["router"] = moe.router
    if moe.shared is not None:
        registry.update({
            "shared_gate_proj": moe.shared.gate,
            "shared_up_proj": moe.shared.up,
            "shared_down_proj": moe.shared.down,
        })
    return registry
