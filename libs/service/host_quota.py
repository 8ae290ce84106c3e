"""The CPU share a benchmark ran with, read from the OS, so every physical figure names it:
the CPUs this process may use, the cgroup quota (if any) and the load on the host."""

from __future__ import annotations

import os


def cgroup_cpu_quota() -> str:
    """cgroup v2 `cpu.max` as "QUOTA/PERIOD µs", or "unlimited"; "unknown" without cgroup v2."""
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as handle:
            quota, period = handle.read().split()
    except (OSError, ValueError):
        return "unknown"
    return "unlimited" if quota == "max" else f"{quota}/{period} us"


def quota_label() -> str:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    one, five, _ = os.getloadavg()
    return (f"{cpus} usable CPUs, cgroup cpu.max {cgroup_cpu_quota()}, "
            f"load average {one:.1f} (1 min) / {five:.1f} (5 min) when labelled")
