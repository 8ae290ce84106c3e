"""The operator lifecycle of the route: install, drain, roll back; readiness follows it.

Traffic is admitted only while a route is SERVING. Installing drains the current route first
(its stage workers are about to be reloaded), then installs the new plan as a new plan
generation, which fences every lease of the old one. Rolling back reinstalls the previous
plan's request, again as a fresh generation, so no in-flight frame is reinterpreted.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from libs.common.kinds import Backend, DType
from libs.service.errors import Aborted, FailedPrecondition
from services.orchestrator.serving import RouteSlot, ServingEngine


class RouteState(enum.Enum):
    EMPTY = "empty"
    INSTALLING = "installing"
    SERVING = "serving"
    DRAINING = "draining"
    DRAINED = "drained"
    FAILED = "failed"


@dataclass(frozen=True)
class InstallRequest:
    checkpoint_dir: str
    stages: int
    backend: Backend | None  # None: each stage runs its own worker's backend
    boundary_dtype: DType  # one of FLOAT_DTYPES


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


@dataclass(frozen=True)
class RouteStatus:
    state: RouteState
    plan: PlanIdentity | None
    stages: tuple[StageInfo, ...]
    inflight_requests: int
    previous: InstallRequest | None
    failure: str = ""


Installer = Callable[[InstallRequest], Awaitable[InstalledRoute]]


class RouteManager:
    def __init__(self, slot: RouteSlot, installer: Installer, drain_timeout_s: float = 60.0):
        self._slot = slot
        self._installer = installer
        self._drain_timeout_s = drain_timeout_s
        self._lock = asyncio.Lock()
        self._state = RouteState.EMPTY
        self._current: InstalledRoute | None = None
        self._previous: InstallRequest | None = None
        self._failure = ""

    def status(self) -> RouteStatus:
        current = self._current
        return RouteStatus(
            state=self._state, plan=current.plan if current else None,
            stages=current.stages if current else (),
            inflight_requests=current.engine.live_requests if current else 0,
            previous=self._previous, failure=self._failure)

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
        old = self._current
        self._state, self._failure = RouteState.INSTALLING, ""
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

    @staticmethod
    async def _drain(engine: ServingEngine, timeout_s: float) -> bool:
        engine.stop_admitting("the route is draining")
        try:
            await asyncio.wait_for(engine.wait_idle(), timeout_s)
        except asyncio.TimeoutError:
            return False
        return True
