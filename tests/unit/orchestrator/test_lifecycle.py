from __future__ import annotations

import asyncio

import pytest

from libs.service.errors import Aborted, FailedPrecondition, Unavailable
from services.orchestrator.engine.domain import GenerationRequest, ServedModel, StageLayout
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

SERVED = ServedModel("tiny", 256, 420, (StageLayout(0, 2, 10), StageLayout(2, 4, 10)))
A = InstallRequest("/ckpt/a", 2, "numpy", "fp32")
B = InstallRequest("/ckpt/b", 2, "numpy", "bf16")


class FakeInstaller:
    def __init__(self, text_context):
        self.text = text_context
        self.installed: list[InstalledRoute] = []
        self.fail_next = False
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, request: InstallRequest) -> InstalledRoute:
        await self.gate.wait()
        if self.fail_next:
            self.fail_next = False
            raise FailedPrecondition("stage 1 failed to load", reason="STAGE_LOAD")
        generation = f"gen-{len(self.installed)}"
        route = InstalledRoute(request, PlanIdentity("plan", "hash", generation), (),
                               ServingEngine(FakePipeline(2), SERVED, self.text))
        self.installed.append(route)
        return route


async def _collect(stream):
    return [o async for o in stream]


def req(rid: str, max_tokens: int = 4) -> GenerationRequest:
    return GenerationRequest(rid, (5, 6, 7), max_tokens)


def test_install_drain_rollback(text_context):
    async def main():
        slot, installer = RouteSlot(), FakeInstaller(text_context)
        manager = RouteManager(slot, installer, drain_timeout_s=30)
        assert manager.status().state is RouteState.EMPTY
        first = await manager.install(A)
        a_engine = slot.engine
        stream = a_engine.submit(req("a1", 50))
        await stream.next()
        reader = asyncio.ensure_future(_collect(stream))
        second = await manager.install(B)  # drains A: its request still completes
        a_events = await reader
        with pytest.raises(Unavailable):
            a_engine.submit(req("a2"))
        drained = await manager.drain()
        with pytest.raises(Unavailable) as refused:
            slot.engine.submit(req("b1"))
        rolled = await manager.rollback()
        events = [o async for o in slot.engine.submit(req("c1"))]
        await manager.close()
        return first, second, a_events, drained, refused.value, rolled, events, installer

    first, second, a_events, drained, refused, rolled, events, installer = asyncio.run(main())
    assert first.state is RouteState.SERVING and first.previous is None
    assert a_events[-1].completion_tokens == 50
    assert second.previous == A
    assert drained.state is RouteState.DRAINED
    assert refused.reason == "NOT_ADMITTING"
    assert rolled.state is RouteState.SERVING
    assert [r.request for r in installer.installed] == [A, B, A]
    assert rolled.plan.plan_generation_id == "gen-2"  # a fresh generation fences old leases
    assert rolled.previous == B
    assert events[-1].completion_tokens == 4


def test_failed_install_is_reported_and_rollback_recovers(text_context):
    async def main():
        slot, installer = RouteSlot(), FakeInstaller(text_context)
        manager = RouteManager(slot, installer)
        with pytest.raises(FailedPrecondition):
            await manager.rollback()
        await manager.install(A)
        installer.fail_next = True
        with pytest.raises(FailedPrecondition):
            await manager.install(B)
        failed = manager.status()
        no_route = slot.engine
        recovered = await manager.rollback()
        await manager.close()
        return failed, no_route, recovered

    failed, no_route, recovered = asyncio.run(main())
    assert failed.state is RouteState.FAILED and "stage 1 failed" in failed.failure
    assert no_route is None
    assert recovered.state is RouteState.SERVING


def test_lifecycle_operations_never_queue(text_context):
    async def main():
        installer = FakeInstaller(text_context)
        installer.gate.clear()
        manager = RouteManager(RouteSlot(), installer)
        pending = asyncio.ensure_future(manager.install(A))
        await asyncio.sleep(0)
        with pytest.raises(Aborted) as info:
            await manager.install(B)
        assert manager.status().state is RouteState.INSTALLING
        installer.gate.set()
        await pending
        await manager.close()
        return info.value

    assert asyncio.run(main()).reason == "LIFECYCLE_BUSY"


def test_drain_times_out_while_a_reader_stalls(text_context):
    async def main():
        slot = RouteSlot()
        manager = RouteManager(slot, FakeInstaller(text_context))
        await manager.install(A)
        stream = slot.engine.submit(req("slow", 1000))
        await stream.next()
        status = await manager.drain(timeout_s=0.05)
        stream.cancel()
        await manager.close()
        return status

    status = asyncio.run(main())
    assert status.state is RouteState.DRAINING
    assert status.inflight_requests == 1
