"""Installs prepare the new plan while the current route still serves; rollback reinstalls
exactly the stored plan, never a fresh one; a degraded route reports DEGRADED."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from libs.service.errors import FailedPrecondition
from services.orchestrator.engine.domain import GenerationRequest
from services.orchestrator.engine.route_slot import RouteSlot
from services.orchestrator.engine.serving import ServingEngine
from services.orchestrator.route.lifecycle import (
    InstalledRoute,
    InstallRequest,
    PlanIdentity,
    RouteManager,
    RouteState,
)
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


class SameWorkers:
    """A fleet whose routes can be replaced beside each other; optionally refusing the overlap."""

    def __init__(self, text_context, refuse_overlap: bool = False, fail_warm: bool = False):
        self.text = text_context
        self.refuse_overlap, self.fail_warm = refuse_overlap, fail_warm
        self.loaded: set[str] = set()
        self.events: list[str] = []
        self.count = 0

    async def install(self, request: InstallRequest) -> InstalledRoute:
        self.count += 1
        generation = f"gen-{self.count}"
        if request.serving_generation:
            assert request.serving_generation in self.loaded
            if self.refuse_overlap:
                raise FailedPrecondition("both ranges need 9 bytes, the worker's memory limit is 1",
                                         reason="INSUFFICIENT_MEMORY_FOR_OVERLAP")
            if self.fail_warm:
                raise FailedPrecondition("warm-up prefill failed", reason="WARMUP_FAILED")
        else:
            self.loaded.clear()
        self.loaded.add(generation)
        self.events.append(f"load {generation} beside {request.serving_generation or 'nothing'}")
        engine = ServingEngine(FakePipeline(2), SERVED, self.text)

        async def retire() -> None:
            self.events.append(f"unload {generation} with {engine.live_requests} live")
            self.loaded.discard(generation)

        return InstalledRoute(request, PlanIdentity(str(request.checkpoint_dir), "h", generation), (), engine,
                              retire=retire)


def test_a_reinstall_loads_beside_the_serving_route_and_retires_it_after_the_switch(text_context):
    async def main():
        slot = RouteSlot()
        fleet = SameWorkers(text_context)
        manager = RouteManager(slot, fleet.install, drain_timeout_s=5)
        await manager.install(A)
        old_engine = slot.engine
        # A stream admitted on the old route before the switch finishes there.
        stream = old_engine.submit(GenerationRequest("early", (5, 6, 7), 3))
        async with stream as events:
            switched = await manager.install(B)
            early = [o async for o in events]
        late = [o async for o in slot.engine.submit(GenerationRequest("late", (5, 6, 7), 2))]
        rolled = await manager.rollback()
        await manager.close()
        return fleet, switched, rolled, early, late, old_engine, slot

    fleet, switched, rolled, early, late, old_engine, slot = asyncio.run(main())
    assert fleet.events == ["load gen-1 beside nothing", "load gen-2 beside gen-1", "unload gen-1 with 0 live",
                            "load gen-3 beside gen-2", "unload gen-2 with 0 live"]
    assert switched.state is RouteState.SERVING and switched.plan.plan_generation_id == "gen-2"
    assert early[-1].completion_tokens == 3 and not early[-1].error
    assert late[-1].completion_tokens == 2
    assert rolled.plan.plan_id == "/ckpt/a" and rolled.plan.plan_generation_id == "gen-3"


@pytest.mark.parametrize("failure", ["refuse_overlap", "fail_warm"])
def test_a_failure_before_the_switch_leaves_the_serving_route_untouched(text_context, failure):
    async def main():
        slot = RouteSlot()
        fleet = SameWorkers(text_context, **{failure: True})
        manager = RouteManager(slot, fleet.install, drain_timeout_s=5)
        await manager.install(A)
        engine = slot.engine
        with pytest.raises(FailedPrecondition) as refused:
            await manager.install(B)
        events = [o async for o in slot.engine.submit(GenerationRequest("r", (5, 6, 7), 2))]
        status = manager.status()
        await manager.close()
        return fleet, engine, slot, status, events, refused.value

    fleet, engine, slot, status, events, refused = asyncio.run(main())
    assert refused.reason in ("INSUFFICIENT_MEMORY_FOR_OVERLAP", "WARMUP_FAILED")
    assert fleet.loaded == {"gen-1"} and fleet.events == ["load gen-1 beside nothing"]
    assert status.state is RouteState.SERVING and status.plan.plan_generation_id == "gen-1"
    assert events[-1].completion_tokens == 2


def test_break_before_make_happens_only_when_the_operator_allowed_it(text_context):
    async def main():
        slot = RouteSlot()
        fleet = SameWorkers(text_context, refuse_overlap=True)
        manager = RouteManager(slot, fleet.install, drain_timeout_s=5)
        await manager.install(A)
        status = await manager.install(replace(B, allow_break_before_make=True))
        await manager.close()
        return fleet, status

    fleet, status = asyncio.run(main())
    assert fleet.events == ["load gen-1 beside nothing", "load gen-3 beside nothing"]
    assert status.state is RouteState.SERVING and status.plan.plan_generation_id == "gen-3"


def test_a_stream_that_outlives_the_drain_ends_with_a_terminal_error_and_the_old_generation_unloads(text_context):
    async def main():
        slot = RouteSlot()
        fleet = SameWorkers(text_context)
        manager = RouteManager(slot, fleet.install, drain_timeout_s=0.3)
        await manager.install(A)
        pipeline = slot.engine.pipeline
        fast = pipeline.submit

        async def slow(batch):  # a slow old route: 1,000 tokens outlast the drain
            await asyncio.sleep(0.02)
            return await fast(batch)

        pipeline.submit = slow
        async with slot.engine.submit(GenerationRequest("long", (5, 6, 7), 1000)) as events:
            await manager.install(B)
            outputs = [o async for o in events]
        return fleet, outputs

    fleet, outputs = asyncio.run(main())
    # Bounded by the drain timeout, not by the stream: the install cut it short.
    assert outputs[-1].finished and outputs[-1].finish_reason.value == "cancelled"
    assert outputs[-1].completion_tokens < 1000
    assert fleet.events[-1].startswith("unload gen-1")
