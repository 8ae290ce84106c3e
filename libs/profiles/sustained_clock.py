"""The clock a stage profile times with: what a call costs a host that stays busy.

A CFS quota of q cores lets a cgroup's processes run q x 100 ms of CPU per 100 ms period and
then stops them until the next period starts. Timed by the wall clock alone, a call costs its
CPU time when it fits in what is left of the period, and that plus the wait to the next period
when it does not; a run of a few periods lands anywhere in between. Measured on this project's
half-core numpy host (AMD EPYC, one numpy decode layer of the tiny checkpoint at 32 rows and 512
tokens of past, runs of 0.3 s): 21-71 ms per call under the quota, 14.4-15.0 ms without it; the
plan built on such figures flipped with them. A route whose stage is the bottleneck keeps it busy,
and then every call pays the quota: CPU time / q.

So on a host with a quota the profile's clock advances, over every interval between two
readings, by the larger of the wall time and the process's CPU time (every thread: the math
threads and any runtime threads the backend keeps) divided by the quota's cores. On a host
without a quota it is the wall clock. Both readings are passed in, so the rule is tested without
timing anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

WALL, SUSTAINED = "wall", "sustained"
Reading = Callable[[], float]


class SustainedClock:
    """Seconds: each interval counts max(wall, cpu / quota_cores)."""

    def __init__(self, quota_cores: float, wall: Reading = time.perf_counter, cpu: Reading = time.process_time):
        if not quota_cores > 0:
            raise ValueError(f"a sustained clock needs a positive CPU quota, got {quota_cores}")
        self.quota_cores = quota_cores
        self._wall, self._cpu = wall, cpu
        self._last_wall, self._last_cpu = wall(), cpu()
        self._elapsed = 0.0

    def __call__(self) -> float:
        wall, cpu = self._wall(), self._cpu()
        self._elapsed += max(wall - self._last_wall, (cpu - self._last_cpu) / self.quota_cores)
        self._last_wall, self._last_cpu = wall, cpu
        return self._elapsed


def profile_clock(quota_cores: float) -> tuple[Reading, str]:
    """The clock a host with `quota_cores` (0: none) times its profile on, and its name."""
    if quota_cores > 0:
        return SustainedClock(quota_cores), SUSTAINED
    return time.perf_counter, WALL


@dataclass(frozen=True)
class Mark:
    wall: float
    cpu: float
    throttled: float


def _never_throttled() -> float:
    return 0.0


class IntervalClock:
    """The same rule for the separate intervals a stage worker times the batches it serves in,
    with one change: an interval shorter than a CFS period that was throttled would count its CPU
    time plus the whole wait for the next period, while the other batches of that period already
    count their CPU time over the quota, which is their share of that wait. So an interval counts
    the larger of its wall time less the time the cgroup spent throttled in it (`throttled`, read
    from the cgroup's `cpu.stat`), and its process CPU time over the quota's cores; on a host without
    a quota, the wall time. A route measured this way and a profile timed on `SustainedClock` agree
    whether the route keeps the host partly or wholly busy. Nothing is shared between intervals,
    so threads may time their own at once."""

    def __init__(self, quota_cores: float = 0.0, wall: Reading = time.perf_counter,
                 cpu: Reading = time.process_time, throttled: Reading = _never_throttled):
        if quota_cores < 0:
            raise ValueError(f"a CPU quota cannot be negative, got {quota_cores}")
        self.quota_cores = quota_cores
        self.timing = SUSTAINED if quota_cores > 0 else WALL
        self._wall, self._cpu, self._throttled = wall, cpu, throttled

    def mark(self) -> Mark:
        if self.quota_cores <= 0:
            return Mark(self._wall(), 0.0, 0.0)
        return Mark(self._wall(), self._cpu(), self._throttled())

    def since(self, mark: Mark) -> float:
        wall = self._wall() - mark.wall
        if self.quota_cores <= 0:
            return wall
        running = wall - (self._throttled() - mark.throttled)
        return max(running, (self._cpu() - mark.cpu) / self.quota_cores)


def describe_timing(timing: str, quota_cores: float) -> str:
    if timing == SUSTAINED:
        return (f"timed as sustained cost: the larger of wall time and process CPU time / the {quota_cores:g}-core "
                "quota")
    return "timed by the wall clock"
