"""Replica routes behind one engine front: requests spread over the routes, a route that loses
a stage hands its greedy streams to another route, which replays them to the very tokens of an
uninterrupted run, and only a fleet with no serving route refuses (503 ROUTE_UNAVAILABLE)."""

from __future__ import annotations

import asyncio

import pytest

from libs.service.errors import Unavailable
from services.orchestrator.engine.domain import FinishReason, RequestSliceResult
from services.orchestrator.engine.multiroute import MultiRouteEngine
from services.orchestrator.engine.route_events import BatchLostRoute, NewPipeline, RouteLost
from services.orchestrator.engine.serving import ServingEngine
from services.orchestrator.engine.unavailable import ROUTE_UNAVAILABLE, route_unavailable
from tests.unit.orchestrator.fakes import FakePipeline
from tests.unit.orchestrator.test_serving import SERVED, collect, engine, req


class LosablePipeline(FakePipeline):
    """A fake route that, once `lose()` is called, fails every microbatch as a lost route."""

    def __init__(self, num_stages: int = 2) -> None:
        super().__init__(num_stages)
        self.lost = False
        self.executed = 0

    def lose(self) -> None:
        self.lost = True

    async def submit(self, batch) -> tuple[RequestSliceResult, ...]:
        await asyncio.sleep(0)
        if self.lost:
            raise route_unavailable("stage 1 is unreachable")
        self.executed += 1
        return await super().submit(batch)


def _route(text_context) -> tuple[ServingEngine, LosablePipeline]:
    pipeline = LosablePipeline()
    eng = engine(text_context, pipeline)

    async def on_failure(event: BatchLostRoute) -> None:  # what the route's supervisor does
        await eng.events.publish(RouteLost(event.reason))

    eng.events.subscribe(BatchLostRoute, on_failure)
    return eng, pipeline


def _tokens(events) -> list[int]:
    return [t for e in events for t in e.token_ids]


async def _reference(text_context, requests) -> dict[str, list[int]]:
    eng = engine(text_context, FakePipeline(2))
    streams = [eng.submit(r) for r in requests]
    results = await asyncio.gather(*(collect(s) for s in streams))
    return {r.request_id: _tokens(events) for r, events in zip(requests, results, strict=True)}


def test_requests_spread_over_the_routes_by_queued_tokens(text_context):
    async def main():
        routes = [_route(text_context) for _ in range(2)]
        multi = MultiRouteEngine([e for e, _ in routes])
        streams = [multi.submit(req(f"r{i}", max_tokens=8)) for i in range(6)]
        held = [e.live_requests for e, _ in routes]
        results = await asyncio.gather(*(collect(s) for s in streams))
        await multi.wait_idle()
        return held, results, routes

    held, results, routes = asyncio.run(asyncio.wait_for(main(), 30))
    assert held == [3, 3]
    assert all(events[-1].finish_reason is FinishReason.LENGTH for events in results)
    assert all(p.stages.live_kv() == [0, 0] for _, p in routes)


def test_a_lost_route_hands_its_greedy_streams_to_the_other_with_identical_tokens(text_context):
    requests = [req(f"g{i}", max_tokens=24) for i in range(6)]

    async def main():
        reference = await _reference(text_context, requests)
        (a, pa), (b, _) = _route(text_context), _route(text_context)
        multi = MultiRouteEngine([a, b])
        streams = [multi.submit(r) for r in requests]
        on_a = [r.request_id for r in requests if a.scheduler._requests.get(r.request_id)]
        firsts = [await s.next() for s in streams]  # every stream is decoding
        pa.lose()
        rest = await asyncio.gather(*(collect(s) for s in streams))
        after = multi.submit(req("late", max_tokens=4))  # route a is down: no 503
        late = await collect(after)
        await multi.wait_idle()
        return reference, on_a, firsts, rest, late, a, b, multi

    reference, on_a, firsts, rest, late, a, b, multi = asyncio.run(asyncio.wait_for(main(), 30))
    assert len(on_a) == 3
    for r, first, events in zip(requests, firsts, rest, strict=True):
        assert events[-1].finish_reason is FinishReason.LENGTH and not events[-1].error
        assert _tokens([first, *events]) == reference[r.request_id]  # nothing lost, nothing doubled
    assert late[-1].finish_reason is FinishReason.LENGTH
    assert a.degraded_reason is not None and b.degraded_reason is None
    assert a.live_requests == 0 and multi.snapshot().degraded_reason is None


def test_with_every_route_down_new_requests_are_refused_and_streams_wait_for_a_recovery(text_context):
    requests = [req(f"w{i}", max_tokens=16) for i in range(4)]

    async def main():
        reference = await _reference(text_context, requests)
        (a, pa), (b, pb) = _route(text_context), _route(text_context)
        multi = MultiRouteEngine([a, b])
        streams = [multi.submit(r) for r in requests]
        firsts = [await s.next() for s in streams]
        pa.lose()
        pb.lose()
        while a.degraded_reason is None or b.degraded_reason is None:
            await asyncio.sleep(0)
        with pytest.raises(Unavailable) as refused:
            multi.submit(req("refused"))
        snapshot = multi.snapshot()
        # Route b comes back under a fresh generation (no KV): every stream resumes there.
        await b.events.publish(NewPipeline(FakePipeline(2)))
        rest = await asyncio.gather(*(collect(s) for s in streams))
        return reference, firsts, rest, refused.value, snapshot, a

    reference, firsts, rest, refused, snapshot, a = asyncio.run(asyncio.wait_for(main(), 30))
    assert refused.reason == ROUTE_UNAVAILABLE and "route 0" in refused.message and "route 1" in refused.message
    assert snapshot.degraded_reason is not None
    for r, first, events in zip(requests, firsts, rest, strict=True):
        assert events[-1].finish_reason is FinishReason.LENGTH
        assert _tokens([first, *events]) == reference[r.request_id]
    assert a.live_requests == 0


def test_a_sampled_stream_on_a_lost_route_ends_unavailable_instead_of_moving(text_context):
    from dataclasses import replace

    from services.orchestrator.engine.domain import SamplingParams

    async def main():
        (a, pa), (b, _) = _route(text_context), _route(text_context)
        multi = MultiRouteEngine([a, b])
        sampled = replace(req("s", max_tokens=30), sampling=SamplingParams(temperature=0.7, seed=1))
        stream = multi.submit(sampled)
        assert a.live_requests == 1
        await stream.next()
        pa.lose()
        return await collect(stream), b

    events, b = asyncio.run(asyncio.wait_for(main(), 30))
    assert events[-1].finish_reason is FinishReason.UNAVAILABLE
    assert b.live_requests == 0


def test_replica_routes_need_two_engines(text_context):
    with pytest.raises(Exception) as refused:
        MultiRouteEngine([engine(text_context, FakePipeline(2))])
    assert getattr(refused.value, "reason", "") == "BAD_ROUTE_COUNT"
    assert SERVED.num_stages == 2
