"""The operator lifecycle of the route: install, drain, roll back; readiness follows it.

Traffic is admitted only while a route is SERVING. Installing first prepares the new plan
(planning and building its artifacts) while the current route keeps serving. Over a serving
route whose workers can hold a second plan generation, the install is make-before-break: the
new plan is loaded and warmed beside the serving one as a new plan generation (which fences
every lease of the old one), new requests move to it in one step, the old route finishes what
it admitted within the drain timeout, and its generation is then unloaded. A failure before
the switch leaves the old route serving, untouched; a worker that cannot hold both plans fails
the install closed (INSUFFICIENT_MEMORY_FOR_OVERLAP) unless the operator explicitly allowed
break-before-make: drain and retire the current route first, then load the new one. Rolling
back reinstalls the previous plan exactly as it was stored (same placement, same verified
artifacts, no re-planning) the same way, again as a fresh generation.
A SERVING route whose stage died, stopped or was unloaded reports DEGRADED with the reason.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

import structlog

from libs.common.kinds import Backend, DType
from libs.service.errors import Aborted, FailedPrecondition, FornaxError
from services.orchestrator.engine.drift import RouteCalibration
from services.orchestrator.engine.multiroute import MultiRouteEngine
from services.orchestrator.engine.route_slot import RouteSlot
from services.orchestrator.engine.serving import ServingEngine
from services.orchestrator.route.host_change import RemovedRoute

_log = structlog.get_logger()
# A stage worker's refusal to hold two plan generations (services/stage_worker/overlap.py).
OVERLAP_REFUSED = "INSUFFICIENT_MEMORY_FOR_OVERLAP"
# How many removed replica routes the status remembers, latest last.
REMOVED_ROUTES_KEPT = 16


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
    # The plan generation that keeps serving while this one is loaded and warmed beside it;
    # "" = none (workers unload whatever they hold first). Set by the RouteManager.
    serving_generation: str = field(default="", compare=False)
    # The operator's explicit consent to drain and unload the serving route first when the
    # workers cannot hold both plans (INSUFFICIENT_MEMORY_FOR_OVERLAP); never assumed.
    allow_break_before_make: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class StageInfo:
    index: int
    worker_address: str
    layer_start: int
    layer_end: int
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
    # One route's engine, or the front of a set of replica routes (`members`).
    engine: ServingEngine | MultiRouteEngine
    # Per stage: "" when ready, else its condition ("unreachable", "not loaded", ...).
    stage_conditions: Callable[[], tuple[str, ...]] | None = None
    # Unloads this route's plan generation from its workers (leaving any other loaded); None
    # for routes that hold nothing outside this process. A route that has one can be replaced
    # make-before-break: the new plan loads beside it on the same workers.
    retire: Callable[[], Awaitable[None]] | None = None
    # Replica routes served at once (route/replica_routes.py); empty for a single route.
    members: tuple[InstalledRoute, ...] = ()


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
    # Each replica route's own status, route order; empty when one route serves.
    routes: tuple[RouteStatus, ...] = ()
    # Replica routes taken out of the serving set (drained, or lost past the rejoin timeout), latest last.
    removed: tuple[RemovedRoute, ...] = ()


Installer = Callable[[InstallRequest], Awaitable[InstalledRoute]]
_Outcome = TypeVar("_Outcome")


class Publish(Protocol):
    """Makes `route` the set new requests go to, recording the routes it leaves out (`removed`)."""

    def __call__(self, route: InstalledRoute, removed: Sequence[RemovedRoute] = ()) -> None: ...


# Changes the serving set of replica routes: gets the serving set and `publish`
# (route/host_drain.py, route/added_routes.py, route/rejoin_watch.py).
RouteChange = Callable[[InstalledRoute, Publish], Awaitable[_Outcome]]
# Plans and builds without touching the stage workers; returns the request with `stored` set.
Preparer = Callable[[InstallRequest], Awaitable[InstallRequest]]


class RouteManager:
    def __init__(self, slot: RouteSlot, installer: Installer, drain_timeout_s: float = 60.0,
                 prepare: Preparer | None = None, removed: Sequence[RemovedRoute] = ()):
        """`removed`: routes taken out before this process started (route/resume.py), for the status."""
        self._slot = slot
        self._installer = installer
        self._prepare = prepare
        self._drain_timeout_s = drain_timeout_s
        self._lock = asyncio.Lock()
        self._state = RouteState.EMPTY
        self._current: InstalledRoute | None = None
        self._previous: InstallRequest | None = None
        self._failure = ""
        self._removed: tuple[RemovedRoute, ...] = tuple(removed)[-REMOVED_ROUTES_KEPT:]

    @property
    def current(self) -> InstalledRoute | None:
        """The route (or set of replica routes) serving now, if any."""
        return self._current

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
            calibration=current.engine.route_calibration() if current else None,
            routes=tuple(_member_status(m, state) for m in current.members) if current else (),
            removed=self._removed)

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
            await self._make_before_break(old, request)
            return self.status()

    async def change_routes(self, what: str, change: RouteChange[_Outcome]) -> _Outcome:
        """Runs `change` on the serving route under the lifecycle lock (no install, drain or
        rollback meanwhile). Refused with NO_ROUTE unless a route serves."""
        async with self._exclusive(what):
            if self._current is None or self._state is not RouteState.SERVING:
                raise FailedPrecondition(f"cannot {what}: no route serves", reason="NO_ROUTE")
            return await change(self._current, self._publish)

    async def replan(self, installer: Installer, prepare: Preparer | None, request: InstallRequest) -> RouteStatus:
        """Plans `request` afresh onto another set of workers (`installer` and `prepare` reach
        them), make-before-break over a serving route, and keeps them for later installs. On
        failure the workers stay the ones before, and so does a route that still serves."""
        async with self._exclusive("re-plan"):
            prior = self._installer, self._prepare
            self._installer, self._prepare = installer, prepare
            try:
                await self._install(replace(request, stored=None))
            except BaseException:
                self._installer, self._prepare = prior
                raise
            return self.status()

    async def close(self) -> None:
        async with self._lock:
            if self._current is not None:
                await self._retire(self._current)
                self._current = None
            self._slot.engine = None

    # ----- internals -----

    def _publish(self, route: InstalledRoute, removed: Sequence[RemovedRoute] = ()) -> None:
        self._current = route
        self._slot.engine = route.engine
        self._removed = (*self._removed, *removed)[-REMOVED_ROUTES_KEPT:]

    def _exclusive(self, what: str) -> asyncio.Lock:
        if self._lock.locked():  # never queue lifecycle operations behind a long install
            raise Aborted(f"cannot {what}: another lifecycle operation is running",
                          reason="LIFECYCLE_BUSY")
        return self._lock

    async def _install(self, request: InstallRequest) -> None:
        old, prior = self._current, (self._state, self._failure)
        serving = old is not None and prior[0] is RouteState.SERVING and not old.engine.degraded_reason
        # A serving route keeps serving (and says so) while its successor is made beside it.
        self._state, self._failure = (RouteState.SERVING if serving else RouteState.INSTALLING), ""
        if self._prepare is not None and request.stored is None:
            try:  # the current route keeps serving while the new plan is made and built
                request = await self._prepare(request)
            except BaseException as exc:
                self._state, self._failure = prior if old is not None else (
                    RouteState.FAILED, str(exc) or type(exc).__name__)
                raise
        if serving and old is not None and old.retire is not None:
            try:
                await self._make_before_break(old, request)
                return
            except FornaxError as exc:
                self._state, self._failure = prior  # the old route serves on, untouched
                if not (request.allow_break_before_make and exc.reason == OVERLAP_REFUSED):
                    raise
                _log.warning("break_before_make", reason=exc.reason, detail=exc.message)
            except BaseException:
                self._state, self._failure = prior
                raise
            self._state = RouteState.INSTALLING
        request = replace(request, serving_generation="")
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

    async def _make_before_break(self, old: InstalledRoute, request: InstallRequest) -> None:
        """Loads and warms `request` beside the serving `old` route (on the same workers or
        others), points new traffic at it in one step, lets `old` finish what it admitted
        (bounded; what outlives the drain ends with a terminal error), then unloads it.
        A failure before the switch raises with `old` untouched and serving."""
        installed = await self._installer(replace(request, serving_generation=old.plan.plan_generation_id))
        self._current, self._previous = installed, old.request
        self._slot.engine = installed.engine  # the switch: new requests go to the new route
        self._state, self._failure = RouteState.SERVING, ""
        _log.info("route_switched", retiring=old.plan.plan_generation_id,
                  serving=installed.plan.plan_generation_id)
        await self._finish(old)
        if old.retire is not None:
            try:
                await old.retire()
            except Exception as exc:  # noqa: BLE001  (the new route serves; only memory stays held)
                _log.warning("generation_retire_failed", generation=old.plan.plan_generation_id,
                             error=f"{type(exc).__name__}: {exc}"[:300])

    async def _retire(self, route: InstalledRoute) -> None:
        """Finishes in-flight work (cancelling what outlives the timeout), then closes."""
        self._slot.engine = None
        await self._drain(route.engine, self._drain_timeout_s)
        await route.engine.close(release_timeout_s=self._drain_timeout_s)

    async def _finish(self, route: InstalledRoute) -> None:
        """Retires a route that no longer receives traffic: every admitted stream completes
        within the drain timeout; what outlives it ends with a terminal error (cancelled)."""
        # Still admitting while it empties: a caller that picked this engine just before the
        # swap is served here rather than refused.
        try:
            await asyncio.wait_for(route.engine.wait_idle(), self._drain_timeout_s)
        except TimeoutError:
            _log.warning("retiring_route_drain_timeout", generation=route.plan.plan_generation_id,
                         live_requests=route.engine.live_requests)
        route.engine.stop_admitting("the route is retiring")
        await route.engine.close(release_timeout_s=self._drain_timeout_s)

    @staticmethod
    async def _drain(engine: ServingEngine | MultiRouteEngine, timeout_s: float) -> bool:
        engine.stop_admitting("the route is draining")
        try:
            await asyncio.wait_for(engine.wait_idle(), timeout_s)
        except TimeoutError:
            return False
        return True


def _member_status(route: InstalledRoute, set_state: RouteState) -> RouteStatus:
    """A replica route of a set: the set's lifecycle state, DEGRADED where this route lost a stage."""
    engine = route.engine
    degraded = engine.degraded_reason
    state = RouteState.DEGRADED if set_state in (RouteState.SERVING, RouteState.DEGRADED) and degraded else (
        RouteState.SERVING if set_state is RouteState.DEGRADED else set_state)
    return RouteStatus(
        state=state, plan=route.plan, stages=route.stages, inflight_requests=engine.live_requests,
        previous=None, failure=degraded or "",
        stage_conditions=route.stage_conditions() if route.stage_conditions else (),
        calibration=engine.route_calibration())
