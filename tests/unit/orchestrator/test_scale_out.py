"""Scale-out wiring: queued tokens per route on /metrics, RouteManager.replan, and the
--replan-on-change settings and hook."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY

from libs.service.errors import FailedPrecondition, InvalidArgument
from services.orchestrator.config import OrchestratorConfig
from services.orchestrator.engine.multiroute import MultiRouteEngine
from services.orchestrator.engine.route_slot import RouteSlot
from services.orchestrator.replan_setup import check_replan_settings, pool_watcher, replan_hook
from services.orchestrator.route.lifecycle import (
    InstalledRoute,
    InstallRequest,
    PlanIdentity,
    RouteManager,
    StageInfo,
)
from services.orchestrator.route.pool_discovery import StagePool
from services.orchestrator.route.queued_tokens import NAME, publish_queued_tokens, queued_tokens_by_route
from tests.unit.orchestrator.fakes import FakePipeline
from tests.unit.orchestrator.test_lifecycle import A, FakeInstaller
from tests.unit.orchestrator.test_serving import engine, req


def _route(text_context, hosts, pipeline=None) -> InstalledRoute:
    stages = tuple(StageInfo(i, f"{host}:50051", i, i + 1, "") for i, host in enumerate(hosts))
    return InstalledRoute(A, PlanIdentity("p", "h", "g"), stages, engine(text_context, pipeline or FakePipeline(2)))


def _sample(route: str) -> float | None:
    return REGISTRY.get_sample_value(NAME, {"route": route})


def test_queued_tokens_are_exported_per_route_while_the_route_serves(text_context):
    held = FakePipeline(2)
    held.gate.clear()  # the prefill stays in flight: nothing computed yet
    first, second = _route(text_context, ("a", "b"), held), _route(text_context, ("c", "d"))
    both = InstalledRoute(A, PlanIdentity("p", "h", "g"), (),
                          MultiRouteEngine([first.engine, second.engine]), members=(first, second))
    current: list[InstalledRoute | None] = [both]

    async def main():
        stream = first.engine.submit(req("r1", max_tokens=6))  # 3 prompt + 6 output tokens owed
        await asyncio.sleep(0)
        owed = queued_tokens_by_route(both)
        stop = publish_queued_tokens(lambda: current[0])
        scraped = (_sample("a>b"), _sample("c>d"))
        current[0] = None  # the route retired: its series goes with it
        gone = _sample("a>b")
        stop()
        held.gate.set()
        await asyncio.gather(first.engine.close(), second.engine.close(), return_exceptions=True)
        del stream
        return owed, scraped, gone

    owed, scraped, gone = asyncio.run(main())
    assert owed == (("a>b", 9), ("c>d", 0))
    assert scraped == (9.0, 0.0) and gone is None


def test_a_stopped_export_leaves_no_series(text_context):
    stop = publish_queued_tokens(lambda: _route(text_context, ("x",)))
    assert _sample("x") == 0.0
    stop()
    assert _sample("x") is None


class RetiringInstaller(FakeInstaller):
    """Routes that hold a plan generation on their workers: replaced make-before-break."""

    def __init__(self, text_context):
        super().__init__(text_context)
        self.retired: list[str] = []

    async def __call__(self, request):
        route = await super().__call__(request)

        async def retire():
            self.retired.append(route.plan.plan_generation_id)

        route.retire = retire
        return route


def test_replan_installs_on_the_new_workers_make_before_break_and_keeps_them(text_context):
    async def main():
        slot, old, new = RouteSlot(), RetiringInstaller(text_context), RetiringInstaller(text_context)
        manager = RouteManager(slot, old, drain_timeout_s=5)
        await manager.install(A)
        status = await manager.replan(new, None, InstallRequest(A.checkpoint_dir, 3, A.backend, A.boundary_dtype))
        await manager.rollback()  # later installs go through the workers of the re-plan
        await manager.close()
        return status, old, new

    status, old, new = asyncio.run(main())
    assert len(old.installed) == 1 and len(new.installed) == 2
    assert new.installed[0].request.stages == 3
    assert new.installed[0].request.serving_generation == "gen-0"  # loaded beside the serving route
    assert status.state.value == "serving" and status.previous == A
    assert old.retired == ["gen-0"]  # the old route was unloaded only after the switch


def test_a_failed_replan_keeps_the_serving_route_and_its_workers(text_context):
    async def main():
        slot, old, new = RouteSlot(), RetiringInstaller(text_context), RetiringInstaller(text_context)
        manager = RouteManager(slot, old, drain_timeout_s=5)
        await manager.install(A)
        serving = slot.engine
        new.fail_next = True
        with pytest.raises(FailedPrecondition):
            await manager.replan(new, None, A)
        kept = slot.engine is serving and manager.status().state.value == "serving"
        await manager.install(A)
        await manager.close()
        return kept, old, new

    kept, old, new = asyncio.run(main())
    assert kept
    assert len(old.installed) == 2 and new.installed == []


POOLS_ENV = {"FORNAX_STAGE_POOLS": "fx-fornax-stage-worker-gpu:50051", "FORNAX_REPLAN_ON_CHANGE": "1",
             "FORNAX_STAGE_WORKERS": "fx-fornax-stage-worker-gpu-0.fx-fornax-stage-worker-gpu:50051",
             "FORNAX_CHECKPOINT": "/ckpt"}


def test_replan_settings_parse_from_flags_and_env():
    cfg = OrchestratorConfig.from_env(["--replan-on-change", "--replan-settle-s", "5"],
                                      {"FORNAX_STAGE_POOLS": "a:50051, b:7000"})
    route = cfg.route
    assert route.replan_on_change and route.stage_pools == (StagePool("a", 50051), StagePool("b", 7000))
    assert (route.replan_settings().settle_s, route.replan_settings().min_interval_s) == (5.0, 120.0)
    off = OrchestratorConfig.from_env(["--replan-on-change", "0"], {"FORNAX_REPLAN_ON_CHANGE": "1"})
    assert not off.route.replan_on_change
    with pytest.raises(InvalidArgument):
        OrchestratorConfig.from_env([], {"FORNAX_STAGE_POOLS": "no-port"})


@pytest.mark.parametrize(("extra", "reason"), [
    ({"FORNAX_STAGE_POOLS": ""}, "REPLAN_WITHOUT_POOLS"),
    ({"FORNAX_ROUTE_GROUPS": "0;0"}, "REPLAN_WITH_ROUTE_GROUPS"),
    ({"FORNAX_INPROCESS_CHECKPOINT": "/ckpt"}, "REPLAN_INPROCESS"),
])
def test_settings_a_replan_cannot_honour_are_refused(extra, reason):
    with pytest.raises(InvalidArgument) as refused:
        check_replan_settings(OrchestratorConfig.from_env([], {**POOLS_ENV, **extra}))
    assert refused.value.reason == reason


def test_no_watcher_without_the_flag():
    cfg = OrchestratorConfig.from_env([], {k: v for k, v in POOLS_ENV.items() if k != "FORNAX_REPLAN_ON_CHANGE"})
    assert pool_watcher(cfg, RouteManager(RouteSlot(), FakeInstaller(None)), lambda c: (None, None)) is None


def test_the_hook_replans_the_configured_checkpoint_onto_the_discovered_workers(text_context):
    cfg = OrchestratorConfig.from_env([], POOLS_ENV)
    seen: list[tuple[str, ...]] = []
    installer = FakeInstaller(text_context)

    def fleet_of(moved):
        seen.append(moved.route.stage_workers)
        return installer, None

    async def main():
        manager = RouteManager(RouteSlot(), FakeInstaller(text_context), drain_timeout_s=5)
        await replan_hook(cfg, manager, fleet_of)(("w-0.pool:50051", "w-1.pool:50051"))
        await manager.close()

    asyncio.run(main())
    assert seen == [("w-0.pool:50051", "w-1.pool:50051")]
    (installed,) = installer.installed
    assert (installed.request.checkpoint_dir, installed.request.stages) == ("/ckpt", 2)
