"""At startup a fleet orchestrator installs the stored routes in place of FORNAX_ROUTE_GROUPS:
each on its stored workers with their configured weights (a joined worker the fleet's), one
route alone as itself; the marker of a change in flight is cleared, and what was removed
before the restart is in the status."""

from __future__ import annotations

from services.orchestrator.config import OrchestratorConfig
from services.orchestrator.engine.route_slot import RouteSlot
from services.orchestrator.resume_setup import resume_at_startup, resumed_installer
from services.orchestrator.route.host_change import RemovalReason, RemovedRoute
from services.orchestrator.route.lifecycle import RouteManager
from services.orchestrator.route.route_set_store import CHANGE_FILE, RouteSetJournal
from services.orchestrator.server import choose_installer, choose_preparer

WORKERS = ("10.0.0.1:7", "10.0.0.2:7", "10.0.0.3:7", "10.0.0.4:7")


def _config(tmp_path) -> OrchestratorConfig:
    return OrchestratorConfig.from_env([], {
        "FORNAX_STAGE_WORKERS": ",".join(WORKERS), "FORNAX_PLANNER_ADDR": "127.0.0.1:1",
        "FORNAX_ARTIFACT_BUILDER_ADDR": "127.0.0.1:2", "FORNAX_ROUTE_GROUPS": "0,1;2,3",
        "FORNAX_WORKER_WEIGHTS": "fp32,fp32,q8_0,q8_0", "FORNAX_HOP_BOUNDARY_DTYPES": "bf16",
        "FORNAX_STATE_DIR": str(tmp_path)})


def _calls(into: list):
    def on(workers, hops, weights):
        into.append((workers, hops, weights.worker_policies))

        async def installer(request):
            raise AssertionError("not installed in this test")

        return installer

    return on


def test_stored_routes_install_on_their_workers_with_their_weights(tmp_path):
    cfg, calls = _config(tmp_path), []
    resumed_installer(cfg, (WORKERS[2:], ("10.0.0.9:7",)), _calls(calls))
    assert [(w, p) for w, _, p in calls] == [(WORKERS[2:], ("q8_0", "q8_0")), (("10.0.0.9:7",), ())]
    assert len(calls[0][1]) == 1 and calls[1][1] == ()  # one boundary dtype per hop


def test_one_stored_route_installs_as_itself_and_nothing_plans_on_the_configured_workers(tmp_path, monkeypatch):
    cfg, calls = _config(tmp_path), []
    monkeypatch.setattr("services.orchestrator.server.fleet_route_installer", lambda cfg, *a: _calls(calls)(*a))
    choose_installer(cfg, (WORKERS[:2],))
    assert [w for w, _, _ in calls] == [WORKERS[:2]]
    assert choose_preparer(cfg, resumed=True) is None


def test_a_restart_resumes_the_committed_set_and_clears_the_change_in_flight(tmp_path):
    cfg = _config(tmp_path)
    drained = RemovedRoute(WORKERS[2:], RemovalReason.HOST_DRAINED, WORKERS[3], "drained")
    journal = RouteSetJournal(tmp_path, WORKERS)
    journal((WORKERS[:2],), (drained,))
    journal.begin("add routes")  # then the process died
    decision, resumed_journal = resume_at_startup(cfg)
    assert decision.routes == (WORKERS[:2],) and decision.rolled_back == "add routes"
    assert not (tmp_path / CHANGE_FILE).exists() and resumed_journal.generation == 1
    manager = RouteManager(RouteSlot(), choose_installer(cfg, decision.routes), 1.0, None, decision.removed)
    assert manager.status().removed == (drained,)


def test_without_a_stored_set_the_configured_groups_install(tmp_path, monkeypatch):
    cfg, calls = _config(tmp_path), []
    monkeypatch.setattr("services.orchestrator.server.fleet_route_installer", lambda cfg, *a: _calls(calls)(*a))
    decision, journal = resume_at_startup(cfg)
    assert decision.routes == () and journal.generation == 0
    choose_installer(cfg, decision.routes)
    assert [w for w, _, _ in calls] == [WORKERS[:2], WORKERS[2:]]
