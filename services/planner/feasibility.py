"""Exact feasibility: which nodes and routes can take part, and why an answer is infeasible.

Each rejected node gets the first failing check, in this order: weight dtype, boundary dtype,
required operations, memory for the smallest stage it could hold (one layer, with its
activation buffers and the node's reserve), the weight formats of its backend's build under
the model's weight policy (a node that reports none passes in exploratory mode only), and in
deployment mode a capability record.
In deployment mode a link that references no route record is rejected too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from libs.common.kinds import DType
from services.planner import domain as d
from services.planner.costs import CostTables, stage_memory
from services.planner.inventory import Inventory, Link, Node, Target
from services.planner.model import ModelDescription

GIB = float(2**30)


@dataclass(frozen=True)
class Infeasible:
    reason: str
    detail: str
    shortfall_bytes: float


def smallest_stage_bytes(tables: CostTables) -> int:
    """Memory of the cheapest one-layer stage, reserve excluded."""
    L = tables.num_layers
    return min(stage_memory(tables, a, a + 1).total_bytes for a in range(L))


def _names(dtypes: tuple[DType, ...]) -> list[str]:
    return [str(dtype) for dtype in dtypes]


def node_rejection(node: Node, model: ModelDescription, target: Target, smallest: int) -> d.Rejection | None:
    """The first failing check; in deployment mode a node must also reference a capability record."""
    if model.weight_dtype not in node.dtypes:
        return d.Rejection(
            node.name, d.MISSING_DTYPE, f"weights are {model.weight_dtype}; node offers {_names(node.dtypes)}"
        )
    if target.boundary_dtype not in node.dtypes:
        return d.Rejection(node.name, d.MISSING_BOUNDARY_DTYPE,
                           f"boundary tensors are {target.boundary_dtype}; node offers {_names(node.dtypes)}")
    missing = [op for op in model.required_operations if op not in node.operations]
    if missing:
        return d.Rejection(
            node.name,
            d.MISSING_OPERATION,
            f"node lacks operations {missing}",
            required=len(model.required_operations),
            available=len(model.required_operations) - len(missing),
        )
    needed = smallest + node.reserve_bytes
    if needed > node.memory_bytes:
        return d.Rejection(
            node.name, d.INSUFFICIENT_MEMORY,
            f"smallest stage needs {needed / GIB:.3f} GiB (reserve {node.reserve_bytes / GIB:.3f} GiB included); "
            f"node has {node.memory_bytes / GIB:.3f} GiB",
            required=needed, available=node.memory_bytes)
    formats = model.formats_for(str(node.backend))
    unsupported = sorted(set(formats) - set(node.weight_formats))
    if formats and unsupported and (node.weight_formats or target.mode == "deployment"):
        offered = list(node.weight_formats) or "none reported"
        return d.Rejection(node.name, d.MISSING_WEIGHT_FORMAT,
                           f"the {model.weights_policy} weights of a {node.backend} stage are in {list(formats)}; "
                           f"node runs {offered} (lacks {unsupported})")
    if target.mode == "deployment" and not any(r.record_type == "capability" for r in node.evidence):
        return d.Rejection(node.name, d.MISSING_EVIDENCE, "deployment mode: the node references no capability record")
    return None


def route_rejections(inventory: Inventory, nodes: tuple[Node, ...]) -> list[d.Rejection]:
    out = []
    index = inventory.link_index()
    for i, a in enumerate(nodes):
        for b in nodes[i + 1:]:
            if (a.name, b.name) not in index:
                out.append(d.Rejection(f"{a.name}->{b.name}", d.NO_ROUTE,
                                       f"no link between {a.name} and {b.name} in either direction"))
    return out


def unevidenced_route_rejections(links: tuple[Link, ...], names: set[str]) -> list[d.Rejection]:
    return [d.Rejection(f"{x.from_node}->{x.to_node}", d.MISSING_EVIDENCE,
                        "deployment mode: the link references no route record")
            for x in links if x.from_node in names and x.to_node in names]


def _memory_shortfall(tables: CostTables, target: Target) -> Infeasible | None:
    """Aggregate bound: k stages need all weights, all KV and k sets of buffers."""
    model, work = tables.model, tables.workload
    order = np.argsort(-tables.usable_bytes, kind="stable")
    usable = tables.usable_bytes[order]
    weights = int(work.layer_weight_bytes.sum()) + model.embedding_bytes + model.head_bytes
    base = weights + int(work.layer_kv_bytes.sum()) + work.logits_bytes
    k_hi = min(target.max_stages, len(usable), model.num_layers)
    best: tuple[int, int, int] | None = None
    for k in range(target.min_stages, k_hi + 1):
        tied_once = model.embedding_bytes if model.tied_embeddings and k == 1 else 0
        required = base - tied_once + k * work.activation_bytes
        gap = required - int(usable[:k].sum())
        if best is None or gap < best[0]:
            best = (gap, k, required)
    if best is None or best[0] <= 0:
        return None
    gap, k, required = best
    return Infeasible(
        d.INSUFFICIENT_MEMORY,
        f"the model needs {required / GIB:.3f} GiB over {k} stage(s) (weights, KV for "
        f"{target.context_tokens} tokens x {target.concurrency} sequences, buffers); the {k} largest "
        f"capable nodes offer {(required - gap) / GIB:.3f} GiB after reserves; short by {gap / GIB:.3f} GiB; "
        + per_host_shortfall([tables.nodes[i].name for i in order[:k]], usable[:k], required),
        float(gap))


def per_host_shortfall(names: list[str], usable: np.ndarray, required: int) -> str:
    """Each host's shortfall at the split in proportion to its usable memory, the split that
    leaves the largest relative shortfall smallest."""
    held = [float(u) for u in usable]
    shares = [float(required) * u / sum(held) for u in held]
    parts = [f"{name} holds {u / GIB:.3f} GiB of its {share / GIB:.3f} GiB share, short by {(share - u) / GIB:.3f} GiB"
             for name, u, share in zip(names, held, shares, strict=True)]
    return "per host at a split in proportion to memory: " + "; ".join(parts)


def _layer_shortfall(tables: CostTables) -> Infeasible | None:
    L = tables.num_layers
    biggest = int(tables.usable_bytes.max())
    sizes = [stage_memory(tables, a, a + 1).total_bytes for a in range(L)]
    worst = int(np.argmax(sizes))
    if sizes[worst] <= biggest:
        return None
    return Infeasible(
        d.LAYER_TOO_LARGE,
        f"a stage holding only layer {worst} needs {sizes[worst] / GIB:.3f} GiB; the largest capable "
        f"node offers {biggest / GIB:.3f} GiB after its reserve",
        float(sizes[worst] - biggest))


def explain_infeasible(tables: CostTables, target: Target, missing_routes: int) -> Infeasible:
    n, L = len(tables.nodes), tables.num_layers
    if target.min_stages > min(n, L):
        return Infeasible(d.STAGE_BOUNDS, f"min_stages {target.min_stages} exceeds the {n} capable node(s) "
                                          f"or the {L} layer(s)", 0.0)
    found = _memory_shortfall(tables, target) or _layer_shortfall(tables)
    if found is not None:
        return found
    return Infeasible(
        d.NO_FEASIBLE_PLACEMENT,
        f"aggregate memory suffices, but no ordered chain of at most {target.max_stages} capable nodes "
        f"with links between consecutive stages holds contiguous layer ranges ({missing_routes} route(s) missing)",
        0.0)
