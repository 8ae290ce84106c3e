"""Cost model: per-node, per-layer time and memory tables, and stage/route matrices.

Every time here is a prediction of a simple roofline model, never a measurement:
- a layer takes `max(flops / compute, bytes_read / memory_bandwidth)` on a node;
- a decode microbatch of `r` rows reads the dense weights once, the expected number of
  distinct routed experts that `r` tokens select under uniform routing,
  `E * (1 - (1 - k/E)**r)`, and the KV cache of its rows at the target context;
- packing and unpacking a boundary tensor copy it once at the node's memory bandwidth;
- a route carries one frame per microbatch: serialisation at the link bandwidth plus the
  one-way latency (a lockstep credit, the conservative case).

Memory of a stage is exact bookkeeping: its weights (embeddings on the first stage, final norm
and head on the last), KV for `context_tokens * concurrency`, activation buffers for the
larger of a prefill chunk and a decode microbatch (plus logits on the last stage), and the
node's reserve. Layer ranges are half-open `[layer_start, layer_end)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from libs.model.kv_blocks import blocks_for
from services.planner.inventory import Inventory, Node, Target
from services.planner.model import DTYPE_BYTES, ModelDescription

ACTIVATION_BUFFERS = 4  # inbound, outbound, residual and normed rows, fp32 each


@dataclass(frozen=True)
class Workload:
    """Row counts and per-layer facts the tables are built from (node-independent)."""

    decode_rows: int
    prefill_tokens: int
    context_tokens: int
    concurrency: int
    boundary_row_bytes: int
    layer_weight_bytes: np.ndarray  # (L,) int64
    layer_kv_bytes: np.ndarray  # (L,) int64, KV for context * concurrency
    decode_flops: np.ndarray  # (L,)
    decode_bytes: np.ndarray  # (L,)
    prefill_flops: np.ndarray  # (L,)
    prefill_bytes: np.ndarray  # (L,)
    activation_bytes: int
    logits_bytes: int


@dataclass(frozen=True)
class CostTables:
    model: ModelDescription
    workload: Workload
    nodes: tuple[Node, ...]
    decode_layer_s: np.ndarray  # (n, L)
    prefill_layer_s: np.ndarray  # (n, L)
    usable_bytes: np.ndarray  # (n,) memory minus reserve
    link_decode_s: np.ndarray  # (n, n), inf where no route
    link_prefill_s: np.ndarray  # (n, n)

    @property
    def num_layers(self) -> int:
        return self.model.num_layers


@dataclass(frozen=True)
class StageMemory:
    weight_bytes: int
    kv_bytes: int
    activation_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.activation_bytes


@dataclass(frozen=True)
class StageTime:
    """Predicted time terms of one stage for one microbatch, in seconds."""

    compute_s: float
    pack_s: float
    wire_s: float  # the outbound route of this stage; 0 on the last stage
    unpack_s: float

    @property
    def service_s(self) -> float:
        return self.compute_s + self.pack_s + self.unpack_s


def expected_distinct_experts(experts: int, top_k: int, rows: float) -> float:
    """Distinct experts that `rows` rows each routing to `top_k` of `experts` uniformly reach, expected."""
    if experts == 0 or rows == 0:
        return 0.0
    return experts * (1.0 - (1.0 - top_k / experts) ** rows)


def build_workload(model: ModelDescription, target: Target) -> Workload:
    rows, prefill, ctx = target.microbatch_rows, max(target.prefill_tokens, 1), target.context_tokens
    layers = model.layers
    moe = np.array([x.is_moe for x in layers], dtype=bool)
    dense = np.array([x.dense_weight_bytes for x in layers], dtype=np.float64)
    flops = np.array([x.flops_per_token for x in layers], dtype=np.float64)
    attn = np.array([x.attention_flops_per_context_token for x in layers], dtype=np.float64)
    kv = np.array([x.kv_bytes_per_token for x in layers], dtype=np.int64)
    # fp8 KV: each layer's latent scale per block of the context (stages allocate whole blocks).
    kv_scales = np.array([x.kv_scale_bytes_per_block for x in layers], dtype=np.int64) * blocks_for(ctx)

    def expert_reads(n_rows: int) -> np.ndarray:
        distinct = expected_distinct_experts(model.routed_experts, model.experts_per_token, n_rows)
        return np.where(moe, distinct * model.expert_bytes, 0.0)

    buffer_rows = max(prefill, rows)
    scratch = max(x.scratch_bytes_per_row for x in layers) if layers else 0
    return Workload(
        decode_rows=rows,
        prefill_tokens=prefill,
        context_tokens=ctx,
        concurrency=target.concurrency,
        boundary_row_bytes=model.hidden_size * DTYPE_BYTES[target.boundary_dtype],
        layer_weight_bytes=np.array([x.weight_bytes for x in layers], dtype=np.int64),
        layer_kv_bytes=(kv * ctx + kv_scales) * target.concurrency,
        decode_flops=rows * (flops + attn * ctx),
        decode_bytes=dense + expert_reads(rows) + (kv * ctx + kv_scales) * rows,
        prefill_flops=prefill * flops + attn * prefill * (prefill + 1) / 2,
        prefill_bytes=dense + expert_reads(prefill) + kv * prefill,
        activation_bytes=buffer_rows * (ACTIVATION_BUFFERS * 4 * model.hidden_size + scratch),
        logits_bytes=rows * model.vocab_size * 4,
    )


def _roofline(flops: np.ndarray, nbytes: np.ndarray, nodes: tuple[Node, ...]) -> np.ndarray:
    compute = np.array([n.compute_flops for n in nodes])[:, None]
    bandwidth = np.array([n.memory_bandwidth_bytes_per_s for n in nodes])[:, None]
    return np.maximum(flops[None, :] / compute, nbytes[None, :] / bandwidth)


def _links(inventory: Inventory, nodes: tuple[Node, ...], frame_bytes: int) -> np.ndarray:
    n = len(nodes)
    out = np.full((n, n), np.inf)
    index = inventory.link_index()
    for i, a in enumerate(nodes):
        for j, b in enumerate(nodes):
            link = index.get((a.name, b.name)) if i != j else None
            if link is not None:
                out[i, j] = frame_bytes / link.bandwidth_bytes_per_s + link.latency_ns * 1e-9
    return out


def build_tables(model: ModelDescription, inventory: Inventory, nodes: tuple[Node, ...], target: Target) -> CostTables:
    work = build_workload(model, target)
    return CostTables(
        model=model,
        workload=work,
        nodes=nodes,
        decode_layer_s=_roofline(work.decode_flops, work.decode_bytes, nodes),
        prefill_layer_s=_roofline(work.prefill_flops, work.prefill_bytes, nodes),
        usable_bytes=np.array([n.memory_bytes - n.reserve_bytes for n in nodes], dtype=np.int64),
        link_decode_s=_links(inventory, nodes, work.boundary_row_bytes * work.decode_rows),
        link_prefill_s=_links(inventory, nodes, work.boundary_row_bytes * work.prefill_tokens),
    )


def stage_memory(tables: CostTables, layer_start: int, layer_end: int) -> StageMemory:
    """Exact memory of a stage owning `[layer_start, layer_end)` (the node's reserve excluded)."""
    model, work = tables.model, tables.workload
    first, last = layer_start == 0, layer_end == model.num_layers
    weights = int(work.layer_weight_bytes[layer_start:layer_end].sum())
    weights += model.embedding_bytes if first else 0
    if last:
        weights += model.head_bytes - (model.embedding_bytes if first and model.tied_embeddings else 0)
    activation = work.activation_bytes + (work.logits_bytes if last else 0)
    return StageMemory(weights, int(work.layer_kv_bytes[layer_start:layer_end].sum()), activation)


def _edge_terms(tables: CostTables, node: int, rows: int, *, prefill: bool) -> tuple[float, float, float]:
    """(embedding, head, boundary copy) seconds on one node for `rows` rows."""
    model = tables.model
    spec = tables.nodes[node]
    bw, compute = spec.memory_bandwidth_bytes_per_s, spec.compute_flops
    embed = rows * model.hidden_size * model.dtype_bytes / bw
    head_rows = 1 if prefill else rows  # only the last position of a prefill needs logits
    head = max(head_rows * model.head_flops_per_token / compute, model.head_bytes / bw)
    copy = rows * tables.workload.boundary_row_bytes / bw
    return embed, head, copy


def stage_time(tables: CostTables, node: int, layer_start: int, layer_end: int,
               next_node: int | None, *, prefill: bool = False) -> StageTime:
    work = tables.workload
    rows = work.prefill_tokens if prefill else work.decode_rows
    per_layer = tables.prefill_layer_s if prefill else tables.decode_layer_s
    embed, head, copy = _edge_terms(tables, node, rows, prefill=prefill)
    compute = float(per_layer[node, layer_start:layer_end].sum())
    compute += embed if layer_start == 0 else 0.0
    last = layer_end == tables.num_layers
    compute += head if last else 0.0
    links = tables.link_prefill_s if prefill else tables.link_decode_s
    wire = 0.0 if next_node is None else float(links[node, next_node])
    return StageTime(compute, 0.0 if last else copy, wire, 0.0 if layer_start == 0 else copy)


def decode_service_matrix(tables: CostTables) -> np.ndarray:
    """(n, L+1, L+1): decode service seconds of stage `[a, b)` on node i; inf if a >= b or it doesn't fit."""
    n, L = len(tables.nodes), tables.num_layers
    model, work = tables.model, tables.workload
    a = np.arange(L + 1)[:, None]
    b = np.arange(L + 1)[None, :]
    weights = np.concatenate([[0], np.cumsum(work.layer_weight_bytes + work.layer_kv_bytes)])
    memory = (weights[b] - weights[a]).astype(np.int64) + work.activation_bytes
    memory = memory + np.where(a == 0, model.embedding_bytes, 0)
    tied = model.embedding_bytes if model.tied_embeddings else 0
    memory = memory + np.where(b == L, model.head_bytes + work.logits_bytes - np.where(a == 0, tied, 0), 0)
    out = np.full((n, L + 1, L + 1), np.inf)
    for i in range(n):
        embed, head, copy = _edge_terms(tables, i, work.decode_rows, prefill=False)
        prefix = np.concatenate([[0.0], np.cumsum(tables.decode_layer_s[i])])
        service = prefix[b] - prefix[a] + np.where(a == 0, embed, copy) + np.where(b == L, head, copy)
        ok = (b > a) & (memory <= tables.usable_bytes[i])
        out[i] = np.where(ok, service, np.inf)
    return out
