"""Whether a worker can hold a second plan generation beside the one it serves.

A new plan is loaded beside the serving one before that one retires, so for a while the worker
holds both ranges' weights and both KV reserves. This module decides, from figures alone,
whether that fits; the caller gathers the figures (file sizes, KV limits, /proc/meminfo, the
cgroup or configured memory limit) and refuses the load with the returned reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from libs.service.errors import FailedPrecondition

REASON = "INSUFFICIENT_MEMORY_FOR_OVERLAP"


@dataclass(frozen=True)
class Footprint:
    """What one loaded (or about to be loaded) stage range may hold resident."""

    weight_bytes: int
    kv_reserve_bytes: int  # the stage's KV limit: what its admissions may grow to
    kv_used_bytes: int = 0  # KV already allocated (counted in the host's used memory)

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_reserve_bytes


@dataclass(frozen=True)
class MemoryFacts:
    host_available_bytes: int  # MemAvailable: what the host can still give without swapping
    limit_bytes: int  # the worker's memory limit (configured, else its cgroup's); 0 = none


def overlap_refusal(serving: Footprint, new: Footprint, memory: MemoryFacts) -> FailedPrecondition | None:
    """None when both ranges fit; otherwise the refusal, naming every figure it compared.

    Two bounds must hold:
    - host: the new range's weights and KV reserve, plus the serving range's KV reserve it has
      not allocated yet, fit in what the host has available now (the serving range's weights
      and allocated KV are already resident, so no longer counted as available);
    - limit: both ranges' weights and KV reserves together fit in the worker's memory limit.
    """
    serving_headroom = max(0, serving.kv_reserve_bytes - serving.kv_used_bytes)
    host_need = new.total_bytes + serving_headroom
    both = serving.total_bytes + new.total_bytes
    figures = (f"serving range {serving.weight_bytes} weight bytes + {serving.kv_reserve_bytes} KV reserve "
               f"({serving.kv_used_bytes} in use); new range {new.weight_bytes} weight bytes + "
               f"{new.kv_reserve_bytes} KV reserve")
    if host_need > memory.host_available_bytes:
        return FailedPrecondition(
            f"cannot hold two plan generations: the host has {memory.host_available_bytes} bytes available, "
            f"the overlap needs {host_need} more ({figures})", reason=REASON, field="spec.layer_range")
    if memory.limit_bytes and both > memory.limit_bytes:
        return FailedPrecondition(
            f"cannot hold two plan generations: both ranges need {both} bytes, the worker's memory limit is "
            f"{memory.limit_bytes} ({figures})", reason=REASON, field="spec.layer_range")
    return None
