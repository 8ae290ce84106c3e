"""CPU sets for stage workers sharing one host, so their math libraries do not oversubscribe.

Each worker gets its own contiguous share of the usable CPUs (or one CPU each, round robin,
when there are more workers than CPUs), and its BLAS/OpenMP thread pools are sized to that
share. MAX sizes its pool from the affinity mask; its num_threads option must not be used.
"""

from __future__ import annotations

import math
import os

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def usable_cpus() -> tuple[int, ...]:
    return (
        tuple(sorted(os.sched_getaffinity(0)))
        if hasattr(os, "sched_getaffinity")
        else tuple(range(os.cpu_count() or 1))
    )


def worker_cpu_sets(workers: int, cpus: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Disjoint contiguous shares when possible; otherwise one CPU each, round robin."""
    if workers < 1 or not cpus:
        raise ValueError("need at least one worker and one CPU")
    if workers > len(cpus):
        return [(cpus[i % len(cpus)],) for i in range(workers)]
    base, extra = divmod(len(cpus), workers)
    sets, start = [], 0
    for index in range(workers):
        size = base + (1 if index < extra else 0)
        sets.append(tuple(cpus[start:start + size]))
        start += size
    return sets


def quota_cpus(cpus: tuple[int, ...], quota_cores: float) -> tuple[int, ...]:
    """The CPUs to size thread pools to under a CFS quota: the first ceil(quota) of `cpus` when
    the quota allows fewer cores than there are CPUs, else all of them (0: no quota). A pool
    sized from the affinity mask alone (MAX's) would otherwise run more threads than the quota
    lets run at once, and each parallel op would wait on a throttled thread."""
    if quota_cores <= 0 or math.ceil(quota_cores) >= len(cpus):
        return cpus
    return cpus[: max(1, math.ceil(quota_cores))]


def format_cpu_set(cpus: tuple[int, ...]) -> str:
    return ",".join(str(c) for c in cpus)


def parse_cpu_set(text: str) -> tuple[int, ...]:
    """'0,2-3' -> (0, 2, 3)."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    if not cpus:
        raise ValueError(f"empty CPU set {text!r}")
    return tuple(sorted(cpus))


def worker_env(cpus: tuple[int, ...]) -> dict[str, str]:
    """Environment for a worker pinned to cpus (thread pools sized before numpy loads)."""
    env = {name: str(len(cpus)) for name in THREAD_VARIABLES}
    env["FORNAX_CPU_AFFINITY"] = format_cpu_set(cpus)
    return env
