"""Prometheus metrics of a stage worker's data plane and KV."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from libs.model.kv_blocks import PoolStats
from libs.service.counter_mirror import CounterMirror

_TIME_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

COMPUTE = Histogram(
    "fornax_stage_compute_seconds", "Stage layer execution time per batch", ["stage", "phase"], buckets=_TIME_BUCKETS
)
QUEUE = Histogram(
    "fornax_stage_queue_seconds",
    "Time a batch waited for the stage's device",
    ["stage", "phase"],
    buckets=_TIME_BUCKETS,
)
PACK = Histogram("fornax_fnx2_pack_seconds", "Packing the outgoing boundary tensor", ["stage"], buckets=_TIME_BUCKETS)
UNPACK = Histogram(
    "fornax_fnx2_unpack_seconds", "Unpacking the incoming boundary tensor", ["stage"], buckets=_TIME_BUCKETS
)
TRANSFER = Histogram(
    "fornax_fnx2_transfer_seconds", "Next-hop round trip minus the next hop's own queue and execute time",
    ["stage"], buckets=_TIME_BUCKETS,
)
BOUNDARY_BYTES = Counter(
    "fornax_fnx2_boundary_bytes_total", "Boundary tensor payload bytes sent to the next hop (frame headers excluded)",
    ["stage"],
)
KV_BYTES = Gauge("fornax_stage_kv_bytes", "KV cache bytes in use", ["stage"])
KV_SEQUENCES = Gauge("fornax_stage_kv_sequences", "Sequences holding KV", ["stage"])
KV_EPOCH_CHANGES = Counter(
    "fornax_stage_kv_epoch_changes_total", "Successful sequence executions (KV epoch +1)", ["stage"]
)
SEQUENCE_FAILURES = Counter(
    "fornax_stage_sequence_failures_total", "Sequences that failed on this stage", ["stage", "code"]
)
PREFIX_HIT_BLOCKS = Counter(
    "fornax_stage_prefix_hit_blocks_total", "Prompt-prefix blocks found resident at admission", ["stage"]
)
PREFIX_MISSED_BLOCKS = Counter(
    "fornax_stage_prefix_missed_blocks_total", "Prompt-prefix blocks looked up at admission and not resident",
    ["stage"],
)
PREFIX_PUBLISH_REFUSED = Counter(
    "fornax_stage_prefix_publish_refused_total",
    "Releases whose output blocks were not published (no prefix salt, or tokens not extending the prompt)",
    ["stage"],
)
KV_EVICTED_BLOCKS = Counter(
    "fornax_stage_kv_evicted_blocks_total", "Cached (unreferenced) prefix blocks evicted to make room", ["stage"]
)
_POOL_COUNTERS = ((CounterMirror(PREFIX_HIT_BLOCKS), "hit_blocks"),
                  (CounterMirror(PREFIX_MISSED_BLOCKS), "missed_blocks"),
                  (CounterMirror(KV_EVICTED_BLOCKS), "evicted_blocks"))


def record_kv_blocks(label: str, source: str, blocks: PoolStats | None) -> None:
    """Brings the prefix and eviction counters up to a block pool's own totals (`source` names
    the pool, so a reloaded stage's fresh pool counts from zero)."""
    if blocks is None:
        return
    for mirror, field in _POOL_COUNTERS:
        mirror.observe((label,), getattr(blocks, field), source)


LEASE_TOMBSTONES = Gauge(
    "fornax_stage_lease_tombstones", "Per-lease tombstones held (leases from peers without lease_sequence)", ["stage"]
)
LEASE_FENCE_ENTRIES = Gauge(
    "fornax_stage_lease_fence_entries",
    "Everything held to fence ended leases: tombstones, lease-sequence gaps, recent end reasons",
    ["stage"],
)
