"""The operator lifecycle of the route: install, drain, roll back; readiness follows it.

Traffic is admitted only while a route is SERVING. Installing first prepares the new plan
(planning and building its artifacts) while the current route keeps serving, then drains the
current route (its stage workers are about to be reloaded) and loads and warms the new plan
as a new plan generation, which fences every lease of the old one. Rolling back reinstalls
the previous plan exactly as it was stored (same placement, same verified artifacts, no
re-planning), again as a fresh generation, so no in-flight frame is reinterpreted.
A SERVING route whose stage died, stopped or was unloaded reports DEGRADED with the reason.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from libs.common.kinds import Backend, DType
from libs.service.errors import Aborted, FailedPrecondition
from services.orchestrator.drift import RouteCalibration
from services.orchestrator.serving import RouteSlot, ServingEngine


class RouteState(enum.Enum):
    EMPTY = "empty"
    INSTALLING = "installing"
    SERVING = "serving"
    DRAINING = "draining"
    DRAINED = "drained"
    FAILED = "failed"
    DEGRADED = "degraded"


@dataclass(frozen=True)
class InstallRequest:
    checkpoint_dir: str
    stages: int
    backend: Backend | None  # None: each stage runs its own worker's backend
    boundary_dtype: DType  # one of FLOAT_DTYPES
    # The prepared plan and artifacts, once planned and built; installing a request that has
    # one loads exactly that (what rollback relies on). Not part of the request's identity.
    stored: object | None = field(default=None, compare=False)


@dataclass(frozen=True)
class StageInfo:
    index: int
    worker_address: str
    layer_start: int
    layer_end_exclusive: int
    manifest_hash: str


@dataclass(frozen=True)
class PlanIdentity:
    plan_id: str
    plan_hash: str
    plan_generation_id: str


@dataclass
class InstalledRoute:
    request: InstallRequest
    plan: PlanIdentity
    stages: tuple[StageInfo, ...]
    engine: ServingEngine
    # Per stage: "" when ready, else its condition ("unreachable", "not loaded", ...).
    stage_conditions: Callable[[], tuple[str, ...]] | None = None


@dataclass(frozen=True)
class RouteStatus:
    state: RouteState
    plan: PlanIdentity | None
    stages: tuple[StageInfo, ...]
    inflight_requests: int
    previous: InstallRequest | None
    failure: str = ""
    stage_conditions: tuple[str, ...] = ()
    # Measured service against the plan's predictions; None when nothing tracks it.
    calibration: RouteCalibration | None = None


Installer = Callable[[InstallRequest], Awaitable[InstalledRoute]]
# Plans and builds without touching the stage workers; returns the request with `stored` set.
Preparer = Callable[[InstallRequest], Awaitable[InstallRequest]]


class RouteManager:
    def __init__(self, slot: RouteSlot, installer: Installer, drain_timeout_s: float = 60.0,
                 prepare: Preparer | None = None):
        self._slot = slot
        self._installer = installer
        self._prepare = prepare
        self._drain_timeout_s = drain_timeout_s
        self._lock = asyncio.Lock()
        self._state = RouteState.EMPTY
        self._current: InstalledRoute | None = None
        self._previous: InstallRequest | None = None
        self._failure = ""

    def status(self) -> RouteStatus:
        current = self._current
        state, failure = self._state, self._failure
        if state is RouteState.SERVING and current and current.engine.degraded_reason:
            state, failure = RouteState.DEGRADED, current.engine.degraded_reason
        conditions = current.stage_conditions() if current and current.stage_conditions else ()
        return RouteStatus(
            state=state, plan=current.plan if current else None,
            stages=current.stages if current else (),
            inflight_requests=current.engine.live_requests if current else 0,
            previous=self._previous, failure=failure, stage_conditions=conditions,
            calibration=current.engine.calibration() if current and current.engine.calibration else None)

    async def install(self, request: InstallRequest) -> RouteStatus:
        async with self._exclusive("install"):
            await self._install(request)
            return self.status()

    async def rollback(self) -> RouteStatus:
        async with self._exclusive("rollback"):
            if self._previous is None:
                raise FailedPrecondition("there is no previous plan to roll back to",
                                         reason="NO_PREVIOUS_PLAN")
            await self._install(self._previous)
            return self.status()

    async def drain(self, timeout_s: float | None = None) -> RouteStatus:
        """Stops admissions and waits for in-flight work; still DRAINING if it timed out."""
        async with self._exclusive("drain"):
            if self._current is None:
                raise FailedPrecondition("no route is installed", reason="NO_ROUTE")
            self._state = RouteState.DRAINING
            if await self._drain(self._current.engine, timeout_s or self._drain_timeout_s):
                self._state = RouteState.DRAINED
            return self.status()

    async def switch(self, request: InstallRequest) -> RouteStatus:
        """Make before break: installs and warms `request` while the current route keeps
        serving, points new traffic at it, then lets the old route finish what it admitted.
        On failure the current route is untouched and keeps serving."""
        async with self._exclusive("switch"):
            old = self._current
            if old is None or self._state is not RouteState.SERVING:
                raise FailedPrecondition("switch needs a serving route", reason="NO_ROUTE")
            if self._prepare is not None and request.stored is None:
                request = await self._prepare(request)
            installed = await self._installer(request)
            self._current, self._previous = installed, old.request
            self._slot.engine = installed.engine
            await self._finish(old)
            return self.status()

    async def close(self) -> None:
        async with self._lock:
            if self._current is not None:
                await self._retire(self._current)
                self._current = None
            self._slot.engine = None

    # ----- internals -----

    def _exclusive(self, what: str) -> asyncio.Lock:
        if self._lock.locked():  # never queue lifecycle operations behind a long install
            raise Aborted(f"cannot {what}: another lifecycle operation is running",
                          reason="LIFECYCLE_BUSY")
        return self._lock

    async def _install(self, request: InstallRequest) -> None:
        old, prior = self._current, (self._state, self._failure)
        self._state, self._failure = RouteState.INSTALLING, ""
        if self._prepare is not None and request.stored is None:
            try:  # the current route keeps serving while the new plan is made and built
                request = await self._prepare(request)
            except BaseException as exc:
                self._state, self._failure = prior if old is not None else (
                    RouteState.FAILED, str(exc) or type(exc).__name__)
                raise
        if old is not None:
            await self._retire(old)
            self._previous = old.request
        self._current = None
        try:
            installed = await self._installer(request)
        except BaseException as exc:
            self._state = RouteState.FAILED
            self._failure = str(exc) or type(exc).__name__
            raise
        self._current = installed
        self._slot.engine = installed.engine
        self._state = RouteState.SERVING

    async def _retire(self, route: InstalledRoute) -> None:
        """Finishes in-flight work (cancelling what outlives the timeout), then closes."""
        self._slot.engine = None
        await self._drain(route.engine, self._drain_timeout_s)
        await route.engine.close(release_timeout_s=self._drain_timeout_s)

    async def _finish(self, route: InstalledRoute) -> None:
        """Retires a route that no longer receives traffic: every admitted stream completes."""
        # Still admitting while it empties: a caller that picked this engine just before the
        # swap is served here rather than refused.
        try:
            await asyncio.wait_for(route.engine.wait_idle(), self._drain_timeout_s)
        except TimeoutError:
            pass
        await self._drain(route.engine, self._drain_timeout_s)
        await route.engine.close(release_timeout_s=self._drain_timeout_s)

    @staticmethod
    async def _drain(engine: ServingEngine, timeout_s: float) -> bool:
        engine.stop_admitting("the route is draining")
        try:
            await asyncio.wait_for(engine.wait_idle(), timeout_s)
        except TimeoutError:
            return False
        return True
