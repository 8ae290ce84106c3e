"""Prometheus metrics of a stage worker's data plane and KV."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

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
LEASE_TOMBSTONES = Gauge(
    "fornax_stage_lease_tombstones", "Per-lease tombstones held (leases from peers without lease_sequence)", ["stage"]
)
LEASE_FENCE_ENTRIES = Gauge(
    "fornax_stage_lease_fence_entries",
    "Everything held to fence ended leases: tombstones, lease-sequence gaps, recent end reasons",
    ["stage"],
)
