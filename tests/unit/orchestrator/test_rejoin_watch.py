"""The rejoin watch over a set of replica routes (fake routes, a fake clock, no waiting): a
route whose host stays gone past the timeout leaves the serving set the way a drain takes a
route out (its streams finish on the route left with the tokens of an uninterrupted run, the
set left is stored, the route is recorded REJOIN_TIMEOUT with its host and counted); a host
back in time keeps its route; a route is never removed when no other route would serve."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from fornax.orchestrator.v1 import orchestrator_pb2 as pb
from libs.service.errors import Aborted
from services.orchestrator.convert import status_to_pb
from services.orchestrator.engine import metrics
from services.orchestrator.engine.domain import FinishReason
from services.orchestrator.engine.multiroute import MultiRouteEngine
from services.orchestrator.engine.route_events import BatchLostRoute, RouteLost
from services.orchestrator.engine.route_slot import RouteSlot
from services.orchestrator.engine.serving import ServingEngine
from services.orchestrator.route.lifecycle import (
    InstalledRoute,
    InstallRequest,
    PlanIdentity,
    RouteManager,
    StageInfo,
)
from services.orchestrator.route.rejoin_timeout import RouteWatch
from services.orchestrator.route.rejoin_watch import RejoinWatcher, remove_lost_routes
from services.orchestrator.route.replica_routes import replica_installer
from tests.unit.orchestrator.fakes import FakePipeline
from tests.unit.orchestrator.test_host_drain import Stored
from tests.unit.orchestrator.test_multiroute import LosablePipeline
from tests.unit.orchestrator.test_serving import collect, engine, req

REQUEST = InstallRequest("/ckpt", 4, None, "fp32")
TIMEOUT_S = 3.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class LosableRoute:
    """Installs a fake route on one group's workers whose host can be lost and brought back."""

    def __init__(self, text_context, group: tuple[int, ...]) -> None:
        self.text, self.group = text_context, group
        self.pipeline = LosablePipeline()
        self.conditions = [""] * len(group)
        self.retired = 0
        self.engine: ServingEngine | None = None

    async def __call__(self, request: InstallRequest) -> InstalledRoute:
        eng = engine(self.text, self.pipeline)

        async def on_failure(event: BatchLostRoute) -> None:  # what the route's supervisor does
            await eng.events.publish(RouteLost(event.reason))

        eng.events.subscribe(BatchLostRoute, on_failure)
        self.engine = eng
        stages = tuple(StageInfo(i, f"w{w}", 2 * i, 2 * i + 2, f"m{w}") for i, w in enumerate(self.group))

        async def retire() -> None:
            self.retired += 1

        return InstalledRoute(request, PlanIdentity(f"plan{self.group[0]}", "h", f"gen{self.group[0]}"),
                              stages, eng, lambda: tuple(self.conditions), retire)

    async def lose_host(self, stage: int) -> None:
        """kill -9 of the stage's worker, kept down: probes find it unreachable, the route degrades."""
        self.pipeline.lose()
        self.conditions[stage] = "unreachable"
        assert self.engine is not None
        if self.engine.degraded_reason is None:
            await self.engine.events.publish(RouteLost(f"stage {stage} is unreachable"))

    def host_back(self) -> None:
        """The worker came back and the route recovered on it."""
        self.pipeline.lost = False
        self.conditions = [""] * len(self.group)
        assert self.engine is not None
        self.engine.recover(FakePipeline(2))


async def _installed(text_context, groups):
    routes = {g: LosableRoute(text_context, g) for g in groups}
    slot = RouteSlot()
    manager = RouteManager(slot, replica_installer(groups, routes.__getitem__))
    await manager.install(REQUEST)
    return manager, slot, routes


@dataclass
class Watched:
    """A set of two fake routes, (0, 1) and (2, 3), under a rejoin watch on a fake clock."""

    manager: RouteManager
    slot: RouteSlot
    routes: dict[tuple[int, ...], LosableRoute]
    clock: Clock
    store: Stored
    watcher: RejoinWatcher


async def _watched(text_context) -> Watched:
    manager, slot, routes = await _installed(text_context, ((0, 1), (2, 3)))
    clock, store = Clock(), Stored()
    return Watched(manager, slot, routes, clock, store, RejoinWatcher(manager, TIMEOUT_S, store, clock))


def _removed_count() -> float:
    return metrics.ROUTES_REMOVED.labels("REJOIN_TIMEOUT")._value.get()


def test_a_route_whose_host_stays_gone_past_the_timeout_leaves_and_is_reported(text_context):
    async def main():
        w = await _watched(text_context)
        await w.routes[(0, 1)].lose_host(1)
        seen = [await w.watcher.check()]  # first seen lost
        w.clock.now += 2.9
        seen.append(await w.watcher.check())  # not yet
        before = _removed_count()
        w.clock.now += 0.1
        seen.append(await w.watcher.check())
        late = await collect(w.slot.engine.submit(req("late", max_tokens=4)))
        return seen, w.slot, w.routes, w.store, w.manager.status(), late, _removed_count() - before

    seen, slot, routes, store, status, late, counted = asyncio.run(asyncio.wait_for(main(), 30))
    assert seen[0] == () and seen[1] == ()
    assert [(r.route, r.reason.value, r.host) for r in seen[2]] == [(("w0", "w1"), "REJOIN_TIMEOUT", "w1")]
    assert "did not come back within 3 s" in seen[2][0].detail
    assert isinstance(slot.engine, ServingEngine) and slot.engine is routes[(2, 3)].engine  # one route left
    assert routes[(0, 1)].retired == 1 and routes[(2, 3)].retired == 0
    assert store.calls == [((("w2", "w3"),), (("w1", "REJOIN_TIMEOUT"),))]
    assert status.removed == seen[2] and counted == 1
    assert late[-1].finish_reason is FinishReason.LENGTH
    message = status_to_pb(status)  # what `fornax status` reads
    assert [(list(r.worker_addresses), r.reason, r.host_worker_address) for r in message.removed_routes] == \
        [(["w0", "w1"], pb.ROUTE_REMOVAL_REASON_REJOIN_TIMEOUT, "w1")]
    from apps.fleet.route_status import RouteReport, removed_line

    rendered = RouteReport("SERVING", "", {}, removed=tuple(map(removed_line, message.removed_routes))).render()
    assert "\nremoved route: REJOIN_TIMEOUT host w1: w0 > w1 (host w1 did not come back within 3 s)" in rendered


def test_greedy_streams_on_the_lost_route_finish_on_the_route_left_with_identical_tokens(text_context):
    requests = [req(f"g{i}", max_tokens=24) for i in range(6)]

    async def main():
        plain = engine(text_context, FakePipeline(2))
        reference = [await collect(plain.submit(r)) for r in requests]
        manager, slot, routes = await _installed(text_context, ((0, 1), (2, 3)))
        clock = Clock()
        watcher = RejoinWatcher(manager, TIMEOUT_S, Stored(), clock)
        streams = [slot.engine.submit(r) for r in requests]
        firsts = [await s.next() for s in streams]  # every stream is decoding
        await routes[(0, 1)].lose_host(1)
        await watcher.check()
        clock.now += TIMEOUT_S
        removed = await watcher.check()
        rest = await asyncio.gather(*(collect(s) for s in streams))
        return reference, firsts, rest, removed

    reference, firsts, rest, removed = asyncio.run(asyncio.wait_for(main(), 30))
    assert len(removed) == 1
    for expected, first, events in zip(reference, firsts, rest, strict=True):
        assert events[-1].finish_reason is FinishReason.LENGTH and not events[-1].error
        assert [t for e in [first, *events] for t in e.token_ids] == [t for e in expected for t in e.token_ids]


def test_a_host_back_before_the_timeout_keeps_its_route(text_context):
    async def main():
        w = await _watched(text_context)
        before = w.slot.engine
        await w.routes[(0, 1)].lose_host(1)
        await w.watcher.check()
        w.clock.now += 2.0
        w.routes[(0, 1)].host_back()
        await w.watcher.check()  # the timer is cancelled
        w.clock.now += 10.0
        removed = await w.watcher.check()
        return removed, before, w.slot, w.store, w.manager.status()

    removed, before, slot, store, status = asyncio.run(asyncio.wait_for(main(), 30))
    assert removed == () and slot.engine is before and store.calls == [] and status.removed == ()
    assert all(e.admitting for e in before.engines)


def test_a_route_is_not_removed_when_no_other_route_would_serve(text_context):
    async def main():
        w = await _watched(text_context)
        before = w.slot.engine
        await w.routes[(0, 1)].lose_host(1)
        await w.routes[(2, 3)].lose_host(0)
        await w.watcher.check()
        w.clock.now += 60.0
        removed = await w.watcher.check()
        return removed, before, w.slot, w.store, w.routes

    removed, before, slot, store, routes = asyncio.run(asyncio.wait_for(main(), 30))
    assert removed == () and slot.engine is before and store.calls == []
    assert all(r.retired == 0 for r in routes.values())  # both keep waiting for their hosts


def test_a_single_route_keeps_waiting_for_its_host(text_context):
    async def main():
        route = LosableRoute(text_context, (0, 1))
        slot = RouteSlot()
        manager = RouteManager(slot, route)
        await manager.install(REQUEST)
        clock, store = Clock(), Stored()
        watcher = RejoinWatcher(manager, TIMEOUT_S, store, clock)
        await route.lose_host(1)
        await watcher.check()
        clock.now += 60.0
        return await watcher.check(), slot.engine is route.engine, store.calls, route.retired

    assert asyncio.run(asyncio.wait_for(main(), 30)) == ((), True, [], 0)


def test_a_removal_refused_by_a_busy_lifecycle_is_made_in_a_later_round(text_context):
    async def main():
        manager, slot, routes = await _installed(text_context, ((0, 1), (2, 3)))
        clock = Clock()
        watcher = RejoinWatcher(manager, TIMEOUT_S, Stored(), clock)
        await routes[(0, 1)].lose_host(1)
        await watcher.check()
        clock.now += TIMEOUT_S
        change = manager.change_routes

        async def busy(what, _change):
            raise Aborted(f"cannot {what}: another lifecycle operation is running", reason="LIFECYCLE_BUSY")

        manager.change_routes = busy  # type: ignore[method-assign]  (a drain holds the lock)
        deferred = await watcher.check()
        manager.change_routes = change  # type: ignore[method-assign]
        return deferred, await watcher.check()

    deferred, removed = asyncio.run(asyncio.wait_for(main(), 30))
    assert deferred == () and [r.host for r in removed] == ["w1"]


def test_a_route_whose_host_came_back_while_the_lock_was_awaited_is_not_removed(text_context):
    async def main():
        manager, slot, _ = await _installed(text_context, ((0, 1), (2, 3)))
        store = Stored()
        stale = RouteWatch(("w0", "w1"), False, "w1", 9.0)  # decided lost; it admits again now
        removed = await manager.change_routes("remove a lost route", lambda current, publish: remove_lost_routes(
            current, publish, lost=[stale], timeout_s=TIMEOUT_S, store=store))
        return removed, slot, store

    removed, slot, store = asyncio.run(asyncio.wait_for(main(), 30))
    assert removed == () and isinstance(slot.engine, MultiRouteEngine) and store.calls == []
