"""Serve at once, upgrade live: the reference route serves while graphs compile, the switch is
make-before-break, and a failed compile or switch leaves the reference route serving, loudly."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from libs.model.compile_cache import GraphName, GraphTarget, config_sha256, record_compiled
from libs.model.config import parse_config
from libs.model.presets import preset_config
from libs.service.errors import FailedPrecondition
from services.orchestrator.engine.route_slot import RouteSlot
from services.orchestrator.route.backend_choice import DEFAULT_ROWS, decide, forced
from services.orchestrator.route.background_compile import BackgroundCompiler, CompileSettings, GraphState
from services.orchestrator.route.coldstart import BackendBoard, Chooser, UpgradePhase, serve_then_upgrade
from services.orchestrator.route.lifecycle import InstallRequest, RouteManager, RouteState
from tests.unit.orchestrator.test_backend_choice import TINY_MAX, TINY_NUMPY, scaled, stage
from tests.unit.orchestrator.test_lifecycle import FakeInstaller, req

MAX_REQUEST = InstallRequest("", 2, "max", "fp32")
BUILD = "max test-build"


class ScriptedCompiler(BackgroundCompiler):
    """The real scheduling, with each compile process replaced by a scripted answer."""

    def __init__(self, settings, ranges, fail: set[GraphName] = frozenset()):
        super().__init__(settings, ranges)
        self.fail = fail
        self.release = asyncio.Event()
        self.running: dict[int, int] = {}
        self.peak: dict[int, int] = {}
        self.spawned: list[tuple[GraphName, tuple[int, ...]]] = []

    async def _spawn(self, name, cpus):
        stage = self.graphs[name].stage_index
        self.spawned.append((name, cpus))
        self.running[stage] = self.running.get(stage, 0) + 1
        self.peak[stage] = max(self.peak.get(stage, 0), self.running[stage])
        await self.release.wait()
        self.running[stage] -= 1
        if name in self.fail:
            return {"state": "failed", "error": "mojo: out of memory"}
        return {"state": "done", "seconds": 1.5}


@pytest.fixture()
def checkpoint(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(preset_config("tiny", 0, 1)))
    return tmp_path


def _settings(checkpoint: Path, cpus=((0, 1), (2,))) -> CompileSettings:
    return CompileSettings(str(checkpoint), checkpoint / "cache", BUILD, stage_cpus=cpus)


def recorded(max_figures: dict, asked: list | None = None):
    """A chooser deciding on recorded step times, as the real one does on measured ones."""

    async def choose(request, serving):
        if asked is not None:  # what was asked, and which route served while it was measured
            asked.append((request.backend, serving.state, serving.plan.plan_generation_id))
        return decide("max", (stage(0, TINY_NUMPY, max_figures, (0, 2)), stage(1, TINY_NUMPY, max_figures, (2, 4))),
                      DEFAULT_ROWS)

    return Chooser(True, choose)


async def _forced(request, serving):
    return forced(str(request.backend))


always = Chooser(False, _forced)


def _run(checkpoint: Path, text_context, compiler: ScriptedCompiler, chooser=None):
    request = InstallRequest(str(checkpoint), 2, "max", "fp32")

    async def main():
        slot, installer = RouteSlot(), FakeInstaller(text_context)
        manager = RouteManager(slot, installer, drain_timeout_s=30)
        board = BackendBoard("max")
        released = []

        async def release_reference():
            released.append(manager.status().plan.plan_generation_id)

        upgrade = asyncio.ensure_future(serve_then_upgrade(manager, request, board, lambda _: compiler,
                                                           release_reference, chooser or always))
        while manager.status().state is not RouteState.SERVING:
            await asyncio.sleep(0)
        during = (board.running_backend, board.phase, slot.engine)
        stream = slot.engine.submit(req("through-switch", 40))  # admitted on the reference route
        await stream.next()
        compiler.release.set()
        events = [o async for o in stream]
        await upgrade
        after = [o async for o in slot.engine.submit(req("after", 3))]
        snapshot = board.snapshot()
        await manager.close()
        return during, events, after, board, installer, snapshot, released

    return asyncio.run(main())


def test_serves_on_reference_then_switches_without_losing_a_stream(checkpoint, text_context):
    compiler = ScriptedCompiler(_settings(checkpoint), ((0, 2), (2, 4)))
    during, events, after, board, installer, snapshot, released = _run(checkpoint, text_context, compiler)
    assert during[0] == "numpy" and during[1] is UpgradePhase.SERVING_REFERENCE_WHILE_COMPILING
    assert [r.request.backend for r in installer.installed] == ["numpy", "max"]
    assert events[-1].completion_tokens == 40 and events[-1].error in (None, "")
    assert after[-1].completion_tokens == 3
    assert board.running_backend == "max" and board.phase is UpgradePhase.SERVING_REQUESTED_BACKEND
    assert released == ["gen-1"]  # the reference workers are released only after the switch
    assert all(s["backend"] == "max" for s in snapshot["stages"])
    assert all(g["state"] == "done" and g["compile_seconds"] == 1.5 for g in snapshot["graphs"])
    # every kind once; a 2-CPU stage compiles two at once, a 1-CPU stage one at a time
    assert sorted(n.value for n, _ in compiler.spawned) == sorted(n.value for n in GraphName)
    assert compiler.peak == {0: 2, 1: 1}
    assert {cpus for _, cpus in compiler.spawned} == {(0, 1), (2,)}


def test_failed_compile_keeps_the_reference_route_and_says_why(checkpoint, text_context):
    compiler = ScriptedCompiler(_settings(checkpoint), ((0, 2), (2, 4)), fail={GraphName.FINAL})
    _, events, after, board, installer, snapshot, released = _run(checkpoint, text_context, compiler)
    assert [r.request.backend for r in installer.installed] == ["numpy"]
    assert board.running_backend == "numpy" and board.phase is UpgradePhase.COMPILE_FAILED
    assert "final graph failed: mojo: out of memory" in board.failure
    assert released == []  # still serving on them
    assert snapshot["running_backend"] == "numpy" and snapshot["failure"] == board.failure
    assert after[-1].completion_tokens == 3 and events[-1].completion_tokens == 40


class StageCrashed(Exception):
    """Something no FornaxError names, such as a raw RPC error from a stage."""


@pytest.mark.parametrize("crash", [False, True])
def test_failed_switch_keeps_the_reference_route(checkpoint, text_context, crash):
    compiler = ScriptedCompiler(_settings(checkpoint), ((0, 2), (2, 4)))

    async def main():
        slot, installer = RouteSlot(), FakeInstaller(text_context)
        manager = RouteManager(slot, installer)
        board = BackendBoard("max")
        compiler.release.set()
        original = installer.__call__

        async def fail_max(request):
            if request.backend == "max" and crash:
                raise StageCrashed("INTERNAL: unexpected TypeError in LoadStage")
            if request.backend == "max":
                installer.fail_next = True
            return await original(request)

        manager._installer = fail_max
        await serve_then_upgrade(manager, InstallRequest(str(checkpoint), 2, "max", "fp32"), board,
                                 lambda _: compiler, chooser=always)
        served = [o async for o in slot.engine.submit(req("still", 2))]
        state = manager.status().state
        await manager.close()
        return board, served, state

    board, served, state = asyncio.run(main())
    assert board.phase is UpgradePhase.SWITCH_FAILED and board.running_backend == "numpy"
    assert board.failure == ("StageCrashed: INTERNAL: unexpected TypeError in LoadStage" if crash
                             else "STAGE_LOAD: stage 1 failed to load")
    assert state is RouteState.SERVING and served[-1].completion_tokens == 2


def test_cached_graphs_install_the_requested_backend_directly(checkpoint, text_context):
    settings = _settings(checkpoint)
    cfg_hash = config_sha256(parse_config(preset_config("tiny", 0, 1)))
    for name in GraphName:
        record_compiled(settings.cache_dir, GraphTarget(name, BUILD, "cpu", "float32", cfg_hash), 1.0)
    compiler = ScriptedCompiler(settings, ((0, 2), (2, 4)))
    assert compiler.all_cached()
    assert {g.state for g in compiler.graphs.values()} == {GraphState.CACHED}

    async def main():
        slot, installer = RouteSlot(), FakeInstaller(text_context)
        manager = RouteManager(slot, installer)
        board = BackendBoard("max")
        await serve_then_upgrade(manager, InstallRequest(str(checkpoint), 2, "max", "fp32"), board,
                                 lambda _: compiler, chooser=always)
        await manager.close()
        return board, installer

    board, installer = asyncio.run(main())
    assert [r.request.backend for r in installer.installed] == ["max"]
    assert board.running_backend == "max" and not compiler.spawned


class UnstartableCompiler(ScriptedCompiler):
    async def _spawn(self, name, cpus):
        await self.release.wait()
        raise FileNotFoundError("python: not found")


def test_a_compile_that_cannot_start_keeps_the_reference_route(checkpoint, text_context):
    compiler = UnstartableCompiler(_settings(checkpoint), ((0, 2), (2, 4)))
    _, events, after, board, installer, snapshot, released = _run(checkpoint, text_context, compiler)
    assert [r.request.backend for r in installer.installed] == ["numpy"]
    assert board.phase is UpgradePhase.COMPILE_FAILED and board.running_backend == "numpy"
    assert board.failure == "FileNotFoundError: python: not found"
    assert after[-1].completion_tokens == 3 and events[-1].completion_tokens == 40


def test_measured_slower_max_keeps_the_reference_route_and_says_why(checkpoint, text_context):
    compiler = ScriptedCompiler(_settings(checkpoint), ((0, 2), (2, 4)))
    asked = []
    _, events, after, board, installer, snapshot, released = _run(checkpoint, text_context, compiler,
                                                                  recorded(TINY_MAX, asked))
    # measured once, after the compiles, on the stages the reference route (gen-0) serves
    assert asked == [("max", RouteState.SERVING, "gen-0")]
    assert [r.request.backend for r in installer.installed] == ["numpy"]  # never switched
    assert board.running_backend == "numpy" and board.phase is UpgradePhase.SERVING_REFERENCE_MEASURED_FASTER
    assert released == [] and board.failure == ""
    choice = snapshot["choice"]
    assert choice["backend"] == "numpy" and choice["policy"] == "measured"
    assert choice["reason"].startswith("stayed on numpy: max measured 5.78x slower at stage 0 at 1 row")
    assert [s["index"] for s in choice["stages"]] == [0, 1]
    assert all(s["backend"] == "numpy" for s in snapshot["stages"])
    assert after[-1].completion_tokens == 3 and events[-1].completion_tokens == 40


def test_measured_faster_max_switches(checkpoint, text_context):
    compiler = ScriptedCompiler(_settings(checkpoint), ((0, 2), (2, 4)))
    *_, board, installer, snapshot, released = _run(checkpoint, text_context, compiler,
                                                     recorded(scaled(TINY_NUMPY, 0.8)))
    assert [r.request.backend for r in installer.installed] == ["numpy", "max"]
    assert board.phase is UpgradePhase.SERVING_REQUESTED_BACKEND and released == ["gen-1"]
    assert snapshot["choice"]["backend"] == "max" and snapshot["choice"]["stages"][0]["figures"][0]["rows"] == 1


def test_a_failed_measurement_keeps_the_reference_route_loudly(checkpoint, text_context):
    compiler = ScriptedCompiler(_settings(checkpoint), ((0, 2), (2, 4)))

    async def broken(request, serving):
        raise FailedPrecondition("the worker is executing; compare it idle", reason="STAGE_BUSY")

    *_, board, installer, snapshot, released = _run(checkpoint, text_context, compiler, Chooser(True, broken))
    assert [r.request.backend for r in installer.installed] == ["numpy"]
    assert board.phase is UpgradePhase.MEASURE_FAILED and board.running_backend == "numpy"
    assert board.failure == "STAGE_BUSY: the worker is executing; compare it idle"
    assert snapshot["choice"] is None and released == []


def _cached(checkpoint: Path) -> ScriptedCompiler:
    settings = _settings(checkpoint)
    cfg_hash = config_sha256(parse_config(preset_config("tiny", 0, 1)))
    for name in GraphName:
        record_compiled(settings.cache_dir, GraphTarget(name, BUILD, "cpu", "float32", cfg_hash), 1.0)
    return ScriptedCompiler(settings, ((0, 2), (2, 4)))


def test_cached_graphs_install_the_measured_faster_backend(checkpoint, text_context):
    compiler = _cached(checkpoint)

    async def main():
        slot, installer = RouteSlot(), FakeInstaller(text_context)
        manager = RouteManager(slot, installer)
        board = BackendBoard("max")
        await serve_then_upgrade(manager, InstallRequest(str(checkpoint), 2, "max", "fp32"), board,
                                 lambda _: compiler, chooser=recorded(TINY_MAX))
        await manager.close()
        return board, installer

    board, installer = asyncio.run(main())
    assert [r.request.backend for r in installer.installed] == ["numpy"]
    assert board.running_backend == "numpy" and board.phase is UpgradePhase.SERVING_REFERENCE_MEASURED_FASTER
    assert board.choice is not None and not board.choice.switch and not compiler.spawned


def test_a_switch_without_a_chooser_is_refused(checkpoint, text_context):
    compiler = ScriptedCompiler(_settings(checkpoint), ((0, 2), (2, 4)))

    async def main():
        manager = RouteManager(RouteSlot(), FakeInstaller(text_context))
        await serve_then_upgrade(manager, InstallRequest(str(checkpoint), 2, "max", "fp32"), BackendBoard("max"),
                                 lambda _: compiler)

    with pytest.raises(FailedPrecondition) as err:
        asyncio.run(main())
    assert err.value.reason == "NO_SWITCH_CHOOSER" and not compiler.spawned
