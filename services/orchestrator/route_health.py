"""Whether the installed route can serve: each stage's condition, and the verdict.

The pure part (`StageCondition`, `RouteVerdict`, `HealthTracker`) takes probe outcomes and
returns a verdict; `RouteHealthMonitor` is the thin loop that probes every stage on a timer
and tells the serving engine when the route degrades or recovers.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
import structlog

from libs.service.errors import Unavailable
from services.orchestrator.drift import MeasuredService

_log = structlog.get_logger()
ROUTE_UNAVAILABLE = "ROUTE_UNAVAILABLE"


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


_PREFIX = "the route is unavailable: "


def route_unavailable(detail: str) -> Unavailable:
    return Unavailable(_PREFIX + detail_of(detail), reason=ROUTE_UNAVAILABLE)


def detail_of(message: str) -> str:
    """The reason without the "route is unavailable" preamble, so it is never doubled."""
    return message.removeprefix(_PREFIX)


@dataclass(frozen=True)
class StageProbe:
    index: int
    condition: StageCondition
    # The stage's measured decode service time, when it answered for this route's generation.
    service: MeasuredService | None = None


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

    def observe(self, probes: list[StageProbe]) -> RouteVerdict:
        for probe in probes:
            healthy = probe.condition is StageCondition.READY
            self._bad[probe.index] = 0 if healthy else self._bad[probe.index] + 1
            self._last[probe.index] = probe.condition
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
                 on_degraded_round: Callable[[RouteVerdict], Awaitable[None]] | None = None) -> None:
        self._probe = probe
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
                after = self.tracker.observe(await self._probe())
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
