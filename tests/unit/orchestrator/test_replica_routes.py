"""A set of replica routes installed as one: each group gets its own route, the lifecycle and
GetPlanStatus show every route with its stages and state, a route that loses a stage shows
DEGRADED while the set keeps SERVING, and a set whose second route fails to install unloads
the first and fails closed."""

from __future__ import annotations

import asyncio

import pytest

from fornax.orchestrator.v1 import orchestrator_pb2 as pb
from libs.service.errors import FailedPrecondition, InvalidArgument
from services.orchestrator.convert import status_to_pb
from services.orchestrator.engine.multiroute import MultiRouteEngine
from services.orchestrator.engine.route_slot import RouteSlot
from services.orchestrator.engine.serving import ServingEngine
from services.orchestrator.route.lifecycle import (
    InstalledRoute,
    InstallRequest,
    PlanIdentity,
    RouteManager,
    RouteState,
    StageInfo,
)
from services.orchestrator.route.replica_routes import check_route_groups, replica_installer
from tests.unit.orchestrator.fakes import FakePipeline
from tests.unit.orchestrator.test_lifecycle import SERVED

REQUEST = InstallRequest("/ckpt", 4, None, "fp32")
GROUPS = ((0, 1), (2, 3))


class GroupInstaller:
    """Installs a fake route on one group's workers; records what it was asked."""

    def __init__(self, text_context, group: tuple[int, ...], log: list, fail: bool = False):
        self.text, self.group, self.log, self.fail = text_context, group, log, fail
        self.retired = 0

    async def __call__(self, request: InstallRequest) -> InstalledRoute:
        self.log.append((self.group, request.stages, request.serving_generation))
        if self.fail:
            raise FailedPrecondition(f"group {self.group} failed to load", reason="STAGE_LOAD")
        stages = tuple(StageInfo(i, f"w{w}", 2 * i, 2 * i + 2, f"m{w}") for i, w in enumerate(self.group))

        async def retire() -> None:
            self.retired += 1

        return InstalledRoute(request, PlanIdentity(f"plan{self.group[0]}", "h", f"gen{self.group[0]}"),
                              stages, ServingEngine(FakePipeline(2), SERVED, self.text),
                              lambda: ("",) * len(stages), retire)


def test_every_route_is_installed_on_its_group_and_shown_with_its_stages_and_state(text_context):
    async def main():
        log: list = []
        members = {g: GroupInstaller(text_context, g, log) for g in GROUPS}
        slot = RouteSlot()
        manager = RouteManager(slot, replica_installer(GROUPS, members.__getitem__))
        status = await manager.install(REQUEST)
        assert isinstance(slot.engine, MultiRouteEngine)
        slot.engine.engines[0].degrade("stage 1 is unreachable")
        degraded = manager.status()
        return log, status, degraded

    log, status, degraded = asyncio.run(main())
    assert log == [((0, 1), 2, ""), ((2, 3), 2, "")]
    assert status.state is RouteState.SERVING
    assert [r.state for r in status.routes] == [RouteState.SERVING, RouteState.SERVING]
    assert [[s.worker_address for s in r.stages] for r in status.routes] == [["w0", "w1"], ["w2", "w3"]]
    assert status.plan is not None and status.plan.plan_generation_id == "gen0,gen2"
    # One route down: the set serves on, the route says why.
    assert degraded.state is RouteState.SERVING
    assert [r.state for r in degraded.routes] == [RouteState.DEGRADED, RouteState.SERVING]
    assert "stage 1 is unreachable" in degraded.routes[0].failure
    message = status_to_pb(degraded)
    assert [r.state for r in message.routes] == [pb.ROUTE_STATE_DEGRADED, pb.ROUTE_STATE_SERVING]
    assert [len(r.stages) for r in message.routes] == [2, 2] and len(message.stages) == 4


def test_a_set_whose_second_route_fails_unloads_the_first_and_fails_closed(text_context):
    async def main():
        log: list = []
        members = {GROUPS[0]: GroupInstaller(text_context, GROUPS[0], log),
                   GROUPS[1]: GroupInstaller(text_context, GROUPS[1], log, fail=True)}
        slot = RouteSlot()
        manager = RouteManager(slot, replica_installer(GROUPS, members.__getitem__))
        with pytest.raises(FailedPrecondition):
            await manager.install(REQUEST)
        return members, manager.status(), slot

    members, status, slot = asyncio.run(main())
    assert members[GROUPS[0]].retired == 1
    assert status.state is RouteState.FAILED and slot.engine is None


def test_a_new_set_loads_each_route_beside_its_own_predecessor(text_context):
    async def main():
        log: list = []
        members = {g: GroupInstaller(text_context, g, log) for g in GROUPS}
        manager = RouteManager(RouteSlot(), replica_installer(GROUPS, members.__getitem__), drain_timeout_s=5)
        await manager.install(REQUEST)
        await manager.install(REQUEST)
        return log, members

    log, members = asyncio.run(main())
    assert log[2:] == [((0, 1), 2, "gen0"), ((2, 3), 2, "gen2")]
    assert all(m.retired == 1 for m in members.values())


@pytest.mark.parametrize("groups", [((0, 1),), ((0, 1), (1, 2, 3)), ((0, 1), (2, 9)), ((0, 1), ())])
def test_groups_must_be_two_or_more_disjoint_routes_of_known_workers(groups):
    with pytest.raises(InvalidArgument) as refused:
        check_route_groups(groups, 4)
    assert refused.value.reason == "ROUTE_GROUPS_INVALID"
    check_route_groups(((0, 2), (1, 3)), 4)
    check_route_groups(((0, 2), (1,)), 4)  # worker 3 idle


def test_fornax_status_names_every_route_its_state_and_stages(text_context):
    from apps.fleet.route_status import RouteReport, replica_line

    async def main():
        members = {g: GroupInstaller(text_context, g, []) for g in GROUPS}
        slot = RouteSlot()
        manager = RouteManager(slot, replica_installer(GROUPS, members.__getitem__))
        await manager.install(REQUEST)
        slot.engine.engines[1].degrade("stage 0 is unreachable")
        return status_to_pb(manager.status())

    message = asyncio.run(main())
    lines = tuple(replica_line(r) for r in message.routes)
    assert lines[0] == "SERVING: stage 0 w0 layers 0-2 ok, stage 1 w1 layers 2-4 ok"
    assert lines[1].startswith("DEGRADED (stage 0 is unreachable): stage 0 w2 layers 0-2")
    rendered = RouteReport("SERVING", "", {}, replicas=lines).render()
    assert "\nroute 0: SERVING" in rendered and "\nroute 1: DEGRADED" in rendered


def test_models_and_dashboard_show_every_route_and_a_lost_one_keeps_the_api_ready(text_context):
    import aiohttp

    from services.orchestrator.api.http_api import build_http_app, start_http

    async def main():
        members = {g: GroupInstaller(text_context, g, []) for g in GROUPS}
        slot = RouteSlot()
        await RouteManager(slot, replica_installer(GROUPS, members.__getitem__)).install(REQUEST)
        slot.engine.engines[0].degrade("stage 1 is unreachable")
        runner, port = await start_http(build_http_app(slot), "127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as session:
                base = f"http://127.0.0.1:{port}"
                async with session.get(f"{base}/v1/models") as reply:
                    models = await reply.json()
                async with session.get(f"{base}/dashboard/state") as reply:
                    board = await reply.json()
                async with session.get(f"{base}/health") as reply:
                    health = reply.status
        finally:
            await runner.cleanup()
        return models, board, health

    models, board, health = asyncio.run(main())
    routes = models["data"][0]["fornax"]["routes"]
    assert [(r["state"], r["reason"]) for r in routes] == [("degraded", "stage 1 is unreachable"), ("serving", "")]
    assert [[(s["layer_start"], s["layer_end_exclusive"]) for s in r["stages"]] for r in routes] == [
        [(0, 2), (2, 4)], [(0, 2), (2, 4)]]
    assert [r["state"] for r in board["routes"]] == ["degraded", "serving"]
    assert health == 200  # one route still serves
