"""A route and its serving engine talk through typed events, never through assigned callbacks:
the engine acts on RouteLost / RouteRecovered / NewPipeline / CalibrationObserved and reports
BatchLostRoute, EngineClosing, RequestsSuspended and EngineServing."""

from __future__ import annotations

import asyncio

import pytest

from libs.service.errors import Unavailable
from services.orchestrator.engine.domain import FinishReason
from services.orchestrator.engine.drift import Calibration, RouteCalibration
from services.orchestrator.engine.route_events import (
    BatchLostRoute,
    CalibrationObserved,
    EngineClosing,
    EngineServing,
    NewPipeline,
    RequestsSuspended,
    RouteEvents,
    RouteLost,
    RouteRecovered,
)
from services.orchestrator.engine.unavailable import route_unavailable
from tests.unit.orchestrator.fakes import FakePipeline
from tests.unit.orchestrator.test_serving import collect, engine, req


def test_publish_awaits_every_handler_of_that_event_type_in_order():
    seen: list[str] = []

    async def slow(event: RouteLost) -> None:
        await asyncio.sleep(0)
        seen.append(f"async:{event.reason}")

    async def main():
        bus = RouteEvents()
        bus.subscribe(RouteLost, slow)
        bus.subscribe(RouteLost, lambda e: seen.append(f"sync:{e.reason}"))
        bus.subscribe(RouteRecovered, lambda e: seen.append("recovered"))
        await bus.publish(RouteLost("stage 1 is down"))
        return bus.subscribed(RouteLost), bus.subscribed(EngineClosing)

    assert asyncio.run(main()) == (True, False)
    assert seen == ["async:stage 1 is down", "sync:stage 1 is down"]


def test_notify_refuses_a_coroutine_handler_instead_of_dropping_it():
    async def handler(event: RouteLost) -> None:
        raise AssertionError("never awaited")

    bus = RouteEvents()
    bus.subscribe(RouteLost, handler)
    with pytest.raises(TypeError, match="RouteLost is delivered synchronously"):
        bus.notify(RouteLost("x"))


def test_the_engine_degrades_and_recovers_on_the_routes_events(text_context):
    async def main():
        eng = engine(text_context, FakePipeline(2))
        served_again: list[EngineServing] = []
        eng.events.subscribe(EngineServing, served_again.append)
        await eng.events.publish(RouteLost("stage 1 is unresponsive"))
        with pytest.raises(Unavailable) as refused:
            eng.submit(req("refused"))
        await eng.events.publish(RouteRecovered())
        events = await collect(eng.submit(req("after")))
        await eng.close()
        return eng, refused.value, events, served_again

    eng, refused, events, served_again = asyncio.run(asyncio.wait_for(main(), 10))
    assert refused.reason == "ROUTE_UNAVAILABLE" and "stage 1 is unresponsive" in refused.message
    assert events[-1].finish_reason is FinishReason.LENGTH
    assert served_again == [EngineServing()]


def test_a_new_pipeline_replays_suspended_streams_on_it_and_suspension_is_announced(text_context):
    class Losable(FakePipeline):
        lost = False

        async def submit(self, batch):
            if self.lost and batch.phase.value == "decode":
                raise route_unavailable("stage 0 is unreachable")
            return await super().submit(batch)

    async def main():
        reference = await collect(engine(text_context, FakePipeline(2)).submit(req("g", max_tokens=12)))
        first = Losable(2)
        eng = engine(text_context, first)
        suspended: list[int] = []
        eng.events.subscribe(RequestsSuspended, lambda e: suspended.append(e.count))

        async def lost(event: BatchLostRoute) -> None:  # what the route's supervisor does
            await eng.events.publish(RouteLost(event.reason))
        eng.events.subscribe(BatchLostRoute, lost)
        stream = eng.submit(req("g", max_tokens=12))
        head = [await stream.next()]
        first.lost = True
        while not suspended:
            await asyncio.sleep(0)
        replacement = FakePipeline(2)
        await eng.events.publish(NewPipeline(replacement))
        rest = await collect(stream)
        return reference, head + rest, eng.pipeline is replacement, suspended

    reference, events, swapped, suspended = asyncio.run(asyncio.wait_for(main(), 10))
    tokens = [t for e in events for t in e.token_ids]
    assert swapped and suspended[0] == 1
    assert tokens == [t for e in reference for t in e.token_ids]


def test_the_engine_reports_calibration_as_observed_and_announces_its_close(text_context):
    calibration = RouteCalibration(Calibration.UNCALIBRATED, "no prediction", "declared", 0.25, ())

    async def main():
        eng = engine(text_context, FakePipeline(2))
        before = eng.route_calibration()
        closing: list[EngineClosing] = []

        async def on_close(event: EngineClosing) -> None:
            closing.append(event)
        eng.events.subscribe(EngineClosing, on_close)
        eng.events.notify(CalibrationObserved(calibration))
        after = eng.route_calibration()
        await eng.close()
        return before, after, closing

    before, after, closing = asyncio.run(main())
    assert before is None and after is calibration
    assert closing == [EngineClosing()]


def test_no_engine_attribute_is_a_callback_slot_for_others_to_assign(text_context):
    async def main():
        return engine(text_context, FakePipeline(2))

    eng = asyncio.run(main())
    assert [name for name in vars(eng) if name.startswith("on_")] == []


def test_a_detached_replica_set_no_longer_hands_streams_between_its_routes(text_context):
    from services.orchestrator.engine.multiroute import MultiRouteEngine

    async def main():
        a, b = engine(text_context, FakePipeline(2)), engine(text_context, FakePipeline(2))
        multi = MultiRouteEngine([a, b])
        attached = (a.events.subscribed(RequestsSuspended), b.events.subscribed(EngineServing))
        multi.detach()
        return attached, (a.events.subscribed(RequestsSuspended), b.events.subscribed(EngineServing))

    attached, detached = asyncio.run(main())
    assert attached == (True, True) and detached == (False, False)
