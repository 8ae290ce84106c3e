"""Serve at once, upgrade live: the startup install when MAX graphs are not compiled yet.

When the route asks for MAX and the compile cache lacks some of its graphs, the route is first
installed on the numpy reference workers (float32, the same math), while every graph compiles
in the background. Once all of them are ready, each stage's worker times the stage's decode step
on both backends on its own host, and the route moves only when MAX measured at least as fast
(`backend_choice`; or when the operator forced it). Then the MAX route is installed and warmed as
a new plan generation beside the serving one, new traffic moves to it, and the reference route
finishes what it admitted (`RouteManager.switch`). A failed compile or measurement, or a slower
MAX, leaves the reference route serving and says so in the board; it never claims MAX. With every
graph already cached the same measured choice picks the backend the route is installed on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from enum import Enum

import structlog

from libs.common.kinds import Backend
from libs.service.errors import FailedPrecondition, describe_failure
from services.orchestrator.route.backend_choice import BackendChoice
from services.orchestrator.route.background_compile import BackgroundCompiler
from services.orchestrator.route.lifecycle import InstallRequest, RouteManager, RouteStatus

_log = structlog.get_logger()
REFERENCE_BACKEND = Backend.NUMPY


class UpgradePhase(Enum):
    INSTALLING = "installing"
    SERVING_REFERENCE_WHILE_COMPILING = "serving_reference_while_compiling"
    MEASURING = "measuring"  # each stage times its decode step on both backends
    SWITCHING = "switching"
    # Serving on the reference backend by choice: MAX measured slower at the route's load.
    SERVING_REFERENCE_MEASURED_FASTER = "serving_reference_measured_faster"
    MEASURE_FAILED = "measure_failed"  # serving on the reference backend, not the one asked for
    SERVING_REQUESTED_BACKEND = "serving_requested_backend"
    COMPILE_FAILED = "compile_failed"  # serving on the reference backend, not the one asked for
    SWITCH_FAILED = "switch_failed"  # serving on the reference backend, not the one asked for
    INSTALL_FAILED = "install_failed"


@dataclass
class BackendBoard:
    """What the route runs now and what is compiling; read by `/v1/models`."""

    requested_backend: str | None  # None: each worker's own backend
    phase: UpgradePhase = UpgradePhase.INSTALLING
    running_backend: str | None = ""  # "" while nothing serves
    failure: str = ""
    compiler: BackgroundCompiler | None = None
    choice: BackendChoice | None = None  # the measured (or forced) switch decision, once made

    def snapshot(self) -> dict[str, object]:
        compiler = self.compiler
        stages = []
        if compiler is not None:
            stages = [{"index": i, "backend": self.running_backend,
                       "graphs": compiler.stage_graph_states(i)}
                      for i in range(len(compiler.stage_ranges))]
        graphs = [] if compiler is None else [
            {"graph": g.name.value, "compiled_by_stage": g.stage_index, "state": g.state.value,
             "compile_seconds": g.seconds, "error": g.error} for g in compiler.graphs.values()]
        return {
            "requested_backend": self.requested_backend, "running_backend": self.running_backend,
            "phase": self.phase.value, "failure": self.failure, "stages": stages, "graphs": graphs,
            "choice": None if self.choice is None else self.choice.snapshot(),
            "compile_seconds_figure": "physical: wall seconds per graph on this host, low priority",
        }


CompilerFactory = Callable[[InstallRequest], BackgroundCompiler]
# Run once the route left the reference workers, e.g. to unload them and free their memory.
AfterSwitch = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Chooser:
    """Decides whether the route runs the requested backend, given the serving reference route:
    measured on the stages' hosts, or forced (`measures` False)."""

    measures: bool
    choose: Callable[[InstallRequest, RouteStatus], Awaitable[BackendChoice]]


async def serve_then_upgrade(manager: RouteManager, request: InstallRequest, board: BackendBoard,
                             compiler_for: CompilerFactory | None,
                             after_switch: AfterSwitch | None = None, chooser: Chooser | None = None) -> None:
    """Installs `request`, on the reference backend first when its MAX graphs are not
    compiled; returns once the route runs the requested backend or has settled short of it.
    With reference workers (`compiler_for`), `chooser` decides whether the requested backend is
    an upgrade; it is required then."""
    if request.backend == REFERENCE_BACKEND or compiler_for is None:
        await _install(manager, request, board)
        return
    if chooser is None:
        raise FailedPrecondition("a switch to another backend needs a chooser (measured or forced)",
                                 reason="NO_SWITCH_CHOOSER")
    compiler = board.compiler = compiler_for(request)
    if compiler.all_cached() and not chooser.measures:  # forced: nothing to measure against
        board.choice = await chooser.choose(request, manager.status())
        await _install(manager, request, board)
        return
    # Measured: the reference route serves first (also while cached graphs load), and the
    # stages are timed on the artifacts it serves.
    compiling = asyncio.get_running_loop().create_task(compiler.run())
    try:
        await _install(manager, replace(request, backend=REFERENCE_BACKEND), board,
                       UpgradePhase.SERVING_REFERENCE_WHILE_COMPILING)
    except BaseException:
        compiling.cancel()
        await compiler.stop()
        raise
    await _upgrade_from_reference(manager, request, board, compiler, compiling, chooser, after_switch)


async def _upgrade_from_reference(manager: RouteManager, request: InstallRequest, board: BackendBoard,
                                  compiler: BackgroundCompiler, compiling: asyncio.Task[bool], chooser: Chooser,
                                  after_switch: AfterSwitch | None) -> None:
    """The reference route serves: wait for the compile, measure, then switch if the
    requested backend is the faster. Whatever goes wrong leaves the reference route serving
    and the board saying why, never claiming the requested backend."""
    try:
        compiled = await compiling
    except Exception as exc:  # noqa: BLE001  (a compile that cannot even start)
        _settle_short(board, UpgradePhase.COMPILE_FAILED, describe_failure(exc))
        return
    if not compiled:
        _settle_short(board, UpgradePhase.COMPILE_FAILED, compiler.failure())
        return
    board.phase = UpgradePhase.MEASURING
    try:
        choice = board.choice = await chooser.choose(request, manager.status())
    except Exception as exc:  # noqa: BLE001  (a worker may fail in ways no FornaxError names)
        _settle_short(board, UpgradePhase.MEASURE_FAILED, describe_failure(exc))
        return
    if not choice.switch:
        board.phase = UpgradePhase.SERVING_REFERENCE_MEASURED_FASTER
        _log.info("backend_switch_declined", backend=choice.backend, reason=choice.reason)
        return
    await _switch_to_requested(manager, request, board, after_switch)


async def _switch_to_requested(manager: RouteManager, request: InstallRequest, board: BackendBoard,
                               after_switch: AfterSwitch | None) -> None:
    board.phase = UpgradePhase.SWITCHING
    try:
        await manager.switch(request)
    except Exception as exc:  # noqa: BLE001  (a stage may fail in ways no FornaxError names)
        _settle_short(board, UpgradePhase.SWITCH_FAILED, describe_failure(exc))
        return
    board.running_backend, board.phase = request.backend, UpgradePhase.SERVING_REQUESTED_BACKEND
    _log.info("backend_switched", backend=request.backend, plan_generation=_generation(manager))
    if after_switch is not None:
        try:
            await after_switch()
        except Exception as exc:  # noqa: BLE001  (the route is fine; only memory stays held)
            _log.warning("reference_release_failed", error=describe_failure(exc))


async def _install(manager: RouteManager, request: InstallRequest, board: BackendBoard,
                   phase: UpgradePhase = UpgradePhase.SERVING_REQUESTED_BACKEND) -> None:
    try:
        await manager.install(request)
    except BaseException as exc:
        board.phase, board.failure = UpgradePhase.INSTALL_FAILED, str(exc) or type(exc).__name__
        raise
    board.running_backend, board.phase = request.backend, phase


def _settle_short(board: BackendBoard, phase: UpgradePhase, why: str) -> None:
    board.phase, board.failure = phase, why
    _log.error("backend_upgrade_failed", phase=phase.value, running_backend=board.running_backend,
               requested_backend=board.requested_backend, error=why)




def _generation(manager: RouteManager) -> str:
    plan = manager.status().plan
    return plan.plan_generation_id if plan else ""
