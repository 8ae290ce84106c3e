"""A host drains out of the serving replica routes: the routes that hold it stop admitting,
finish or hand their greedy streams to a route that stays (same tokens as an uninterrupted
run, no client error), are unloaded, and the routes left serve and are stored; a refused
drain keeps the serving set untouched. Routes added on workers that joined are installed
before they join the set, the serving routes untouched; a failed add keeps the set."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from libs.service.errors import FailedPrecondition, InvalidArgument, NotFound
from services.orchestrator.engine.domain import FinishReason, SamplingParams
from services.orchestrator.engine.multiroute import MultiRouteEngine
from services.orchestrator.engine.route_slot import RouteSlot
from services.orchestrator.engine.serving import ServingEngine
from services.orchestrator.route.added_routes import add_routes
from services.orchestrator.route.host_drain import HostDrainOutcome, drain_host, largest_gap_s
from services.orchestrator.route.lifecycle import InstallRequest, RouteManager
from services.orchestrator.route.replica_routes import replica_installer
from tests.unit.orchestrator.fakes import FakePipeline
from tests.unit.orchestrator.test_replica_routes import GroupInstaller
from tests.unit.orchestrator.test_serving import collect, engine, req

REQUEST = InstallRequest("/ckpt", 4, None, "fp32")


class Stored:
    """Records each stored set as (routes left, the removed routes' hosts and reasons)."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[tuple[str, ...], ...], tuple[tuple[str, str], ...]]] = []

    def __call__(self, remaining, removed) -> str:
        self.calls.append((remaining, tuple((r.host, r.reason.value) for r in removed)))
        return "/state/route_set.json"


async def _installed(text_context, groups):
    members = {g: GroupInstaller(text_context, g, []) for g in groups}
    slot = RouteSlot()
    manager = RouteManager(slot, replica_installer(groups, members.__getitem__))
    await manager.install(REQUEST)
    return manager, slot, members


async def _drain(manager: RouteManager, worker: str, timeout_s: float, store: Stored) -> HostDrainOutcome:
    return await manager.change_routes("drain a host", lambda current, publish: drain_host(
        current, publish, worker=worker, timeout_s=timeout_s, store=store))


def _tokens(events) -> list[int]:
    return [t for e in events for t in e.token_ids]


async def _reference(text_context, requests) -> dict[str, list[int]]:
    eng = engine(text_context, FakePipeline(2))
    results = await asyncio.gather(*(collect(eng.submit(r)) for r in requests))
    return {r.request_id: _tokens(events) for r, events in zip(requests, results, strict=True)}


def test_an_idle_host_leaves_and_the_route_without_it_serves_alone_and_is_stored(text_context):
    async def main():
        manager, slot, members = await _installed(text_context, ((0, 1), (2, 3)))
        store = Stored()
        outcome = await _drain(manager, "w2", 5.0, store)
        late = await collect(slot.engine.submit(req("late", max_tokens=4)))
        return outcome, slot, members, store, manager.status(), late

    outcome, slot, members, store, status, late = asyncio.run(asyncio.wait_for(main(), 30))
    assert outcome.decision.leaving == (("w2", "w3"),)
    assert (outcome.finished, outcome.handed_off, outcome.ended) == (0, 0, 0)
    assert isinstance(slot.engine, ServingEngine)  # one route left serves as a single route
    assert members[(2, 3)].retired == 1 and members[(0, 1)].retired == 0
    assert store.calls == [((("w0", "w1"),), (("w2", "HOST_DRAINED"),))] and outcome.stored == "/state/route_set.json"
    assert [s.worker_address for s in status.stages] == ["w0", "w1"] and status.routes == ()
    assert [(r.route, r.reason.value, r.host) for r in status.removed] == [(("w2", "w3"), "HOST_DRAINED", "w2")]
    assert late[-1].finish_reason is FinishReason.LENGTH


def test_greedy_streams_on_a_leaving_route_are_handed_over_with_identical_tokens(text_context):
    requests = [req(f"g{i}", max_tokens=24) for i in range(6)]

    async def main():
        reference = await _reference(text_context, requests)
        manager, slot, _ = await _installed(text_context, ((0, 1), (2, 3), (4, 5)))
        streams = [slot.engine.submit(r) for r in requests]
        firsts = [await s.next() for s in streams]  # every stream is decoding
        outcome = await _drain(manager, "w1", 0.0, Stored())  # no time to finish: all handed over
        rest = await asyncio.gather(*(collect(s) for s in streams))
        return reference, firsts, rest, outcome, slot

    reference, firsts, rest, outcome, slot = asyncio.run(asyncio.wait_for(main(), 30))
    assert outcome.handed_off == 2 and outcome.ended == 0 and outcome.finished == 0
    assert outcome.largest_gap_s > 0  # measured: last token on the leaving route to the first after
    for r, first, events in zip(requests, firsts, rest, strict=True):
        assert events[-1].finish_reason is FinishReason.LENGTH and not events[-1].error
        assert _tokens([first, *events]) == reference[r.request_id]  # nothing lost, nothing doubled
    assert isinstance(slot.engine, MultiRouteEngine) and len(slot.engine.engines) == 2


def test_a_leaving_route_that_finishes_within_the_timeout_hands_nothing_over(text_context):
    async def main():
        manager, slot, _ = await _installed(text_context, ((0, 1), (2, 3)))
        streams = [slot.engine.submit(req(f"f{i}", max_tokens=6)) for i in range(4)]
        outcome = await _drain(manager, "w3", 10.0, Stored())
        return outcome, await asyncio.gather(*(collect(s) for s in streams))

    outcome, results = asyncio.run(asyncio.wait_for(main(), 30))
    assert (outcome.finished, outcome.handed_off, outcome.ended) == (2, 0, 0)
    assert all(events[-1].finish_reason is FinishReason.LENGTH for events in results)


def test_a_sampled_stream_still_running_at_the_timeout_ends_unavailable(text_context):
    sampled = replace(req("s0", max_tokens=24), sampling=SamplingParams(temperature=0.7, seed=3))

    async def main():
        manager, slot, _ = await _installed(text_context, ((0, 1), (2, 3)))
        streams = [slot.engine.submit(r) for r in (req("g0", max_tokens=24), sampled)]
        for stream in streams:
            await stream.next()
        outcome = await _drain(manager, "w1", 0.0, Stored())
        return outcome, await asyncio.gather(*(collect(s) for s in streams))

    outcome, results = asyncio.run(asyncio.wait_for(main(), 30))
    assert outcome.handed_off + outcome.ended == 1  # the leaving route held one of the two
    ended = [events[-1] for events in results if events[-1].finish_reason is FinishReason.UNAVAILABLE]
    assert len(ended) == outcome.ended and all("draining" in (e.error or "") for e in ended)


@pytest.mark.parametrize(("groups", "worker", "error", "reason"), [
    (((0, 1), (2, 3)), "w9", NotFound, "HOST_NOT_SERVING"),
])
def test_a_refused_drain_keeps_the_serving_set(text_context, groups, worker, error, reason):
    async def main():
        manager, slot, members = await _installed(text_context, groups)
        before = slot.engine
        with pytest.raises(error) as refused:
            await _drain(manager, worker, 1.0, store := Stored())
        return refused.value, before, slot, members, store

    refused, before, slot, members, store = asyncio.run(main())
    assert refused.reason == reason
    assert slot.engine is before and all(m.retired == 0 for m in members.values())
    assert all(e.admitting for e in before.engines) and store.calls == []


def test_a_single_route_is_refused_as_not_replica_routes(text_context):
    async def main():
        manager = RouteManager(RouteSlot(), GroupInstaller(text_context, (0, 1), []))
        await manager.install(REQUEST)
        with pytest.raises(FailedPrecondition) as refused:
            await _drain(manager, "w0", 1.0, Stored())
        return refused.value

    assert asyncio.run(main()).reason == "NOT_REPLICA_ROUTES"


def test_a_drain_with_no_route_serving_is_refused(text_context):
    async def main():
        manager = RouteManager(RouteSlot(), GroupInstaller(text_context, (0, 1), []))
        with pytest.raises(FailedPrecondition) as refused:
            await _drain(manager, "w0", 1.0, Stored())
        return refused.value

    assert asyncio.run(main()).reason == "NO_ROUTE"


def test_the_largest_gap_is_the_longest_wait_for_a_handed_off_streams_next_token():
    class Route:
        def __init__(self, tokens: dict[str, int]) -> None:
            self.tokens = tokens

        def stream_ids(self):
            return tuple(self.tokens)

        def last_token_ns(self, rid):
            return self.tokens.get(rid)

    routes = [Route({"a": 3_000_000_000}), Route({"b": 1_500_000_000, "c": 7})]
    last = {"a": 1_000_000_000, "b": 1_000_000_000, "gone": 5}
    assert asyncio.run(largest_gap_s(routes, last, 1.0)) == 2.0  # "gone" finished: left out
    assert asyncio.run(largest_gap_s([Route({"a": 1})], {"a": 1}, 0.05)) == 0.0  # no new token in time


# ----- routes added on workers that joined -----


async def _add(manager: RouteManager, added, member):
    return await manager.change_routes("add routes", lambda current, publish: add_routes(
        current, publish, added=added, member=member))


def _member(text_context, log: list, fail: bool = False):
    def member(route):
        installer = GroupInstaller(text_context, tuple(int(w[1:]) for w in route), log, fail)
        log.append(installer)
        return installer

    return member


def test_an_added_route_joins_the_set_after_it_is_installed_and_the_serving_routes_are_untouched(text_context):
    async def main():
        manager, slot, members = await _installed(text_context, ((0, 1), (2, 3)))
        before = slot.engine
        streams = [slot.engine.submit(req(f"a{i}", max_tokens=12)) for i in range(4)]
        log: list = []
        added = await _add(manager, [("w4",)], _member(text_context, log))
        after = [slot.engine.submit(req(f"b{i}", max_tokens=4)) for i in range(6)]
        results = await asyncio.gather(*(collect(s) for s in [*streams, *after]))
        return added, before, slot, members, manager.status(), results

    added, before, slot, members, status, results = asyncio.run(asyncio.wait_for(main(), 30))
    assert added == (("w4",),)
    assert isinstance(slot.engine, MultiRouteEngine) and len(slot.engine.engines) == 3
    assert slot.engine.engines[:2] == before.engines  # the serving routes are the same engines
    assert [[s.worker_address for s in r.stages] for r in status.routes] == [["w0", "w1"], ["w2", "w3"], ["w4"]]
    assert all(m.retired == 0 for m in members.values())
    assert all(events[-1].finish_reason is FinishReason.LENGTH for events in results)  # nothing lost
    assert slot.engine.engines[2].live_requests == 0


def test_a_route_that_fails_to_install_is_unloaded_and_the_set_is_kept(text_context):
    async def main():
        manager, slot, _ = await _installed(text_context, ((0, 1), (2, 3)))
        before = slot.engine
        log: list = []
        calls = iter([False, True])
        with pytest.raises(FailedPrecondition):
            await _add(manager, [("w4",), ("w5",)], lambda route: _member(text_context, log, next(calls))(route))
        return before, slot, log

    before, slot, log = asyncio.run(main())
    assert slot.engine is before
    installers = [x for x in log if isinstance(x, GroupInstaller)]
    assert installers[0].retired == 1  # the first added route was loaded, then unloaded


@pytest.mark.parametrize(("added", "error", "reason"), [
    ([("w1",)], FailedPrecondition, "WORKER_SERVES_A_ROUTE"),
    ([("w4", "w4")], InvalidArgument, "ROUTE_WORKERS_INVALID"),
    ([], InvalidArgument, "ROUTE_WORKERS_INVALID"),
])
def test_added_routes_that_cannot_be_are_refused_before_anything_loads(text_context, added, error, reason):
    async def main():
        manager, slot, _ = await _installed(text_context, ((0, 1), (2, 3)))
        log: list = []
        with pytest.raises(error) as refused:
            await _add(manager, added, _member(text_context, log))
        return refused.value, log

    refused, log = asyncio.run(main())
    assert refused.reason == reason and log == []


def test_a_single_route_with_an_added_one_becomes_a_set(text_context):
    async def main():
        slot = RouteSlot()
        manager = RouteManager(slot, GroupInstaller(text_context, (0, 1), []))
        await manager.install(REQUEST)
        await _add(manager, [("w2", "w3")], _member(text_context, []))
        return slot, manager.status()

    slot, status = asyncio.run(main())
    assert isinstance(slot.engine, MultiRouteEngine)
    assert [[s.worker_address for s in r.stages] for r in status.routes] == [["w0", "w1"], ["w2", "w3"]]
