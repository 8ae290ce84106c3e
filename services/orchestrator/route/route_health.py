"""Whether the installed route can serve: each stage's condition, and the verdict.

The pure part (`StageCondition`, `RouteVerdict`, `HealthTracker`, `counts_as_down`) takes
probe outcomes and the data plane's progress and returns a verdict; `RouteHealthMonitor` is
the thin loop that probes every stage on a timer and tells the serving engine when the route
degrades or recovers.

Two signals, because either alone misleads:
- the gRPC health probe answers while a stage is alive, but on a CPU-starved host it can miss
  its 1 s deadline although the stage keeps serving;
- data-plane progress (a RESULT frame with a served sequence) proves that every stage ran a
  batch, since a RESULT comes back only after the last stage; an idle route has none.
A probe that timed out is excused by progress during the same round; a stage that is gone
(connection refused), unloaded, draining or failed is not, and neither is a stage that misses
its probe while the data plane is stalled (work outstanding, nothing back) or idle.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
import structlog

from services.orchestrator.engine.drift import MeasuredService
from services.orchestrator.engine.unavailable import detail_of

_log = structlog.get_logger()


class StageCondition(enum.Enum):
    READY = "ready"
    UNREACHABLE = "unreachable"  # connection refused or reset: the process is gone
    UNRESPONSIVE = "unresponsive"  # the call timed out: stopped, hung or partitioned
    NOT_LOADED = "not loaded"  # alive but without this route's stage (restarted, unloaded)
    DRAINING = "draining"
    FAILED = "failed"


def condition_of_rpc_error(code: grpc.StatusCode) -> StageCondition:
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return StageCondition.UNRESPONSIVE
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return StageCondition.UNREACHABLE
    return StageCondition.READY  # the stage answered, with its own refusal


@dataclass(frozen=True)
class StageProbe:
    index: int
    condition: StageCondition
    # The stage's measured decode service time, when it answered for this route's generation.
    service: MeasuredService | None = None


@dataclass(frozen=True)
class DataPlaneProgress:
    """What the route's data plane did during one probe round (route-wide: a RESULT frame
    with a served sequence returns only after every stage has run its batch)."""

    results: int = 0  # RESULT frames that served at least one sequence
    outstanding: int = 0  # batches submitted and not answered when the round ended


def counts_as_down(condition: StageCondition, progress: DataPlaneProgress) -> bool:
    """Pure: whether one round's probe outcome counts against the stage."""
    if condition is StageCondition.READY:
        return False
    # Starved but progressing: the probe was slow, the data plane was not.
    return not (condition is StageCondition.UNRESPONSIVE and progress.results > 0)


class DataPlaneMeter:
    """Counts the route's batches as they go out and come back; `take` reads one round."""

    def __init__(self) -> None:
        self._results = 0
        self._outstanding = 0

    def submitted(self) -> None:
        self._outstanding += 1

    def answered(self, served: bool) -> None:
        """The batch came back (or failed); `served`: its RESULT served a sequence."""
        self._outstanding -= 1
        self._results += 1 if served else 0

    def take(self) -> DataPlaneProgress:
        """The progress since the previous `take`, and the work outstanding now."""
        results, self._results = self._results, 0
        return DataPlaneProgress(results, self._outstanding)


@dataclass(frozen=True)
class RouteVerdict:
    degraded: bool
    reason: str  # empty when healthy; names stages, never addresses
    conditions: tuple[StageCondition, ...]


@dataclass(frozen=True)
class HealthPolicy:
    interval_s: float = 0.5
    # Consecutive bad probes before a stage counts as down (one slow probe is not a fault),
    # and good probes of every stage before a degraded route counts as recovered.
    failures_to_degrade: int = 2
    successes_to_recover: int = 2


class HealthTracker:
    """Pure: consecutive probe outcomes per stage -> the route's verdict."""

    def __init__(self, num_stages: int, policy: HealthPolicy = HealthPolicy()) -> None:
        self._policy = policy
        self._bad = [0] * num_stages
        self._last = [StageCondition.READY] * num_stages
        self._good_rounds = 0
        self.verdict = RouteVerdict(False, "", tuple(self._last))

    def observe(self, probes: list[StageProbe],
                progress: DataPlaneProgress = DataPlaneProgress()) -> RouteVerdict:
        """One probe round, with the data plane's progress during it."""
        for probe in probes:
            bad = counts_as_down(probe.condition, progress)
            self._bad[probe.index] = self._bad[probe.index] + 1 if bad else 0
            # A slow probe excused by progress is reported as ready: the stage is serving.
            self._last[probe.index] = probe.condition if bad else StageCondition.READY
        down = [i for i, bad in enumerate(self._bad) if bad >= self._policy.failures_to_degrade]
        all_good = all(bad == 0 for bad in self._bad)
        self._good_rounds = self._good_rounds + 1 if all_good else 0
        if down:
            self.verdict = RouteVerdict(True, describe(down, self._last), tuple(self._last))
        elif self.verdict.degraded and self._good_rounds >= self._policy.successes_to_recover:
            self.verdict = RouteVerdict(False, "", tuple(self._last))
        return self.verdict

    def force(self, reason: str) -> RouteVerdict:
        """A failure seen on the data plane degrades at once, without waiting for probes."""
        self._good_rounds = 0
        self.verdict = RouteVerdict(True, reason, tuple(self._last))
        return self.verdict


def describe(down: list[int], conditions: list[StageCondition]) -> str:
    return "; ".join(f"stage {i} is {conditions[i].value}" for i in down)


class RouteHealthMonitor:
    """Probes every stage on a timer; reports verdict changes to `on_change`."""

    def __init__(self, probe: Callable[[], Awaitable[list[StageProbe]]], num_stages: int,
                 on_change: Callable[[RouteVerdict], Awaitable[None]],
                 policy: HealthPolicy = HealthPolicy(),
                 on_degraded_round: Callable[[RouteVerdict], Awaitable[None]] | None = None,
                 progress: Callable[[], DataPlaneProgress] | None = None) -> None:
        """`progress`: the data plane's progress since the previous call (read after each
        round's probes have answered or timed out); without it probes alone decide."""
        self._probe = probe
        self._progress = progress
        self._on_change = on_change
        self._on_degraded_round = on_degraded_round
        self._policy = policy
        self._num_stages = num_stages
        self.tracker = HealthTracker(num_stages, policy)
        self._task: asyncio.Task | None = None

    def reset(self) -> None:
        """A freshly installed route starts healthy."""
        self.tracker = HealthTracker(self._num_stages, self._policy)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None

    async def report_failure(self, reason: str) -> None:
        if not self.tracker.verdict.degraded:
            await self._on_change(self.tracker.force(detail_of(reason)))

    async def _run(self) -> None:
        while True:
            before = self.tracker.verdict
            try:
                probes = await self._probe()
                progress = self._progress() if self._progress is not None else DataPlaneProgress()
                after = self.tracker.observe(probes, progress)
                if after.degraded and not before.degraded:  # what the data plane was doing
                    _log.warning("route_probe_round_down", reason=after.reason,
                                 batches_outstanding=progress.outstanding,
                                 results_in_round=progress.results)
            except Exception:  # a probe that cannot run says nothing about the stages
                _log.warning("route_probe_failed")
                after = before
            try:
                if after.degraded != before.degraded or after.reason != before.reason:
                    await self._on_change(after)
                elif after.degraded and self._on_degraded_round is not None:
                    await self._on_degraded_round(after)
            except Exception:  # the monitor must outlive any one reaction
                _log.exception("route_health_reaction_failed")
            await asyncio.sleep(self._policy.interval_s)
