"""Installs prepare the new plan while the current route still serves; rollback reinstalls
exactly the stored plan, never a fresh one; a degraded route reports DEGRADED."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from services.orchestrator.domain import GenerationRequest
from services.orchestrator.lifecycle import (
    InstalledRoute,
    InstallRequest,
    PlanIdentity,
    RouteManager,
    RouteState,
)
from services.orchestrator.serving import RouteSlot, ServingEngine
from tests.unit.orchestrator.fakes import FakePipeline
from tests.unit.orchestrator.test_lifecycle import SERVED

A = InstallRequest("/ckpt/a", 2, "numpy", "fp32")
B = InstallRequest("/ckpt/b", 2, "numpy", "fp32")


class PlanningFleet:
    """Each prepare makes a new plan (the planner may answer differently each time)."""

    def __init__(self, text_context, slot: RouteSlot):
        self.text, self.slot = text_context, slot
        self.plans_made = 0
        self.loaded: list[str] = []
        self.served_while_preparing: list[bool] = []

    async def prepare(self, request: InstallRequest) -> InstallRequest:
        self.served_while_preparing.append(self.slot.engine is not None)
        self.plans_made += 1
        return replace(request, stored=f"plan-{self.plans_made}")

    async def install(self, request: InstallRequest) -> InstalledRoute:
        self.loaded.append(request.stored)
        engine = ServingEngine(FakePipeline(2), SERVED, self.text)
        return InstalledRoute(request, PlanIdentity(request.stored, "h", f"gen-{len(self.loaded)}"),
                              (), engine, lambda: ("", "not loaded"))


def test_rollback_restores_the_stored_plan_and_prepare_runs_while_serving(text_context):
    async def main():
        slot = RouteSlot()
        fleet = PlanningFleet(text_context, slot)
        manager = RouteManager(slot, fleet.install, prepare=fleet.prepare)
        await manager.install(A)
        await manager.install(B)
        rolled = await manager.rollback()
        slot.engine.degrade("stage 1 is not loaded")
        degraded = manager.status()
        await manager.close()
        return fleet, rolled, degraded

    fleet, rolled, degraded = asyncio.run(main())
    assert fleet.plans_made == 2  # rollback planned nothing
    assert fleet.loaded == ["plan-1", "plan-2", "plan-1"]  # the exact stored plan of A
    assert fleet.served_while_preparing == [False, True]  # B was planned while A served
    assert rolled.state is RouteState.SERVING and rolled.plan.plan_generation_id == "gen-3"
    assert degraded.state is RouteState.DEGRADED and degraded.failure == "stage 1 is not loaded"
    assert degraded.stage_conditions == ("", "not loaded")


def test_a_failed_prepare_leaves_the_current_route_serving(text_context):
    async def main():
        slot = RouteSlot()
        fleet = PlanningFleet(text_context, slot)

        async def failing(request):
            if request.checkpoint_dir == B.checkpoint_dir:
                raise RuntimeError("planner unreachable")
            return await fleet.prepare(request)

        manager = RouteManager(slot, fleet.install, prepare=failing)
        await manager.install(A)
        engine = slot.engine
        try:
            await manager.install(B)
        except RuntimeError:
            pass
        events = [o async for o in slot.engine.submit(GenerationRequest("r", (5, 6, 7), 2))]
        status = manager.status()
        await manager.close()
        return engine, slot, status, events

    engine, slot, status, events = asyncio.run(main())
    assert status.state is RouteState.SERVING and status.failure == ""
    assert events[-1].completion_tokens == 2
