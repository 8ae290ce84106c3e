"""Small builders for planner tests."""

from __future__ import annotations

from apps.bench.planner import ALL_OPERATIONS, synthetic_config, synthetic_model
from services.planner.inventory import EvidenceRef, Inventory, Link, Node

GIB = 2**30

__all__ = ["ALL_OPERATIONS", "GIB", "synthetic_config", "synthetic_model", "node", "full_mesh", "tiny_model"]


def tiny_model(layers: int = 6, experts: int = 8, top_k: int = 2, **kw):
    kw.setdefault("hidden", 256)
    kw.setdefault("moe_intermediate", 128)
    kw.setdefault("vocab", 1024)
    return synthetic_model(layers, experts, top_k, **kw)


def node(name: str, *, memory_gib: float = 64.0, compute: float = 100e12, bandwidth: float = 1e12,
         reserve_gib: float = 0.0, dtypes=("bf16", "fp32"), operations=ALL_OPERATIONS,
         evidence: tuple[EvidenceRef, ...] = ()) -> Node:
    return Node(name=name, backend="max", memory_bytes=int(memory_gib * GIB), compute_flops=compute,
                memory_bandwidth_bytes_per_s=bandwidth, dtypes=tuple(dtypes), operations=tuple(operations),
                build="test-build", reserve_bytes=int(reserve_gib * GIB), evidence=evidence)


def full_mesh(*nodes: Node, bandwidth: float = 10e9, latency_ns: int = 10_000, **kw) -> Inventory:
    links = tuple(Link(a.name, b.name, bandwidth, latency_ns)
                  for i, a in enumerate(nodes) for b in nodes[i + 1:])
    return Inventory(nodes=tuple(nodes), links=links, **kw)
