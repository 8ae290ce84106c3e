"""`fornax host drain`, inside the orchestrator: one stage worker's host leaves the serving
replica routes while the others serve on.

Run under the lifecycle lock (`RouteManager.change_routes`). `decide_drain` names the routes
that hold the host (refusals keep the serving set untouched). Those routes stop taking
requests, every other route keeps admitting; they finish what they admitted within the
timeout. A greedy stream still running then is suspended and handed to a route that stays
(`MultiRouteEngine`'s fail-over: it replays prompt plus emitted tokens, so its client sees a
pause); a stream no route can take, or a sampled one, ends UNAVAILABLE. The routes left are
published as the serving set (one route alone serves as a single route), the new set is
stored, and the leaving routes' generations are unloaded from their workers.

`remove_routes` is that removal, shared with the rejoin timeout (`rejoin_watch.py`), which takes
out a route whose host is gone: each removed route is recorded with its reason and host in the
route status, and counted in `fornax_orchestrator_routes_removed_total{reason}`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import structlog

from libs.service.errors import FailedPrecondition
from services.orchestrator.engine import metrics
from services.orchestrator.engine.multiroute import MultiRouteEngine
from services.orchestrator.engine.serving import ServingEngine
from services.orchestrator.route.host_change import (
    DrainDecision,
    RemovalReason,
    RemovedRoute,
    Route,
    decide_drain,
    route_name,
)
from services.orchestrator.route.lifecycle import InstalledRoute, Publish
from services.orchestrator.route.replica_routes import route_set

_log = structlog.get_logger()
# How long a leaving route's stage releases may take once it is closed; its generation is
# unloaded right after, which frees whatever a release did not reach.
RELEASE_TIMEOUT_S = 5.0
# How long the drain waits for each handed-off stream's first token on its new route, to
# report the largest pause a client saw; a stream that emits nothing in time is left out.
GAP_WAIT_S = 30.0


@dataclass(frozen=True)
class RoutesRemoved:
    """What taking routes out of the serving set did to the requests they held."""

    finished: int  # requests the leaving routes finished themselves within the wait
    handed_off: int  # greedy streams replayed on a route that stays
    ended: int  # streams no route could take (sampled ones, or no room): ended UNAVAILABLE
    stored: str  # where the new route set was stored; "" when nothing was
    # The largest pause a handed-off stream's client saw: its last token on the leaving route
    # to its first on the route that took it (0 when none was handed off or none emitted again).
    largest_gap_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class HostDrainOutcome(RoutesRemoved):
    """What the drain's removal did, and the decision it carried out."""

    decision: DrainDecision


# Stores the routes left (stage worker addresses, stage order) after `removed` left; returns where.
RouteSetStore = Callable[[tuple[Route, ...], tuple[RemovedRoute, ...]], str]


def route_of(route: InstalledRoute) -> Route:
    return tuple(stage.worker_address for stage in route.stages)


async def drain_host(current: InstalledRoute, publish: Publish, *, worker: str,
                     timeout_s: float, store: RouteSetStore) -> HostDrainOutcome:
    if not current.members:
        raise FailedPrecondition("one route serves; a host leaves only a set of replica routes",
                                 reason="NOT_REPLICA_ROUTES")
    routes = [route_of(m) for m in current.members]
    decision = decide_drain(routes, [_engine(m).config.max_live_requests for m in current.members], worker,
                            admitted=current.engine.live_requests)
    leaving = [m for m, r in zip(current.members, routes, strict=True) if r in decision.leaving]
    _log.info("host_drain_started", worker=worker, leaving=[route_name(r) for r in decision.leaving],
              live_requests=sum(m.engine.live_requests for m in leaving))
    removed = tuple(RemovedRoute(r, RemovalReason.HOST_DRAINED, worker, f"host {worker} drained")
                    for r in decision.leaving)
    done = await remove_routes(current, publish, leaving, removed, why=f"host {worker} is draining",
                               wait_s=timeout_s, store=store)
    outcome = HostDrainOutcome(**vars(done), decision=decision)
    _log.info("host_drained", worker=worker, finished=outcome.finished, handed_off=done.handed_off,
              ended=done.ended, largest_gap_s=round(done.largest_gap_s, 3),
              remaining=[route_name(r) for r in decision.remaining])
    return outcome


async def remove_routes(current: InstalledRoute, publish: Publish, leaving: Sequence[InstalledRoute],
                        removed: tuple[RemovedRoute, ...], *, why: str, wait_s: float,
                        store: RouteSetStore) -> RoutesRemoved:
    """Takes `leaving` (members of the serving set `current`, at least one member staying) out:
    they stop admitting, finish within `wait_s` or hand their greedy streams over, the set left
    is published (with `removed` recorded) and stored, then their generations are unloaded."""
    kept = [m for m in current.members if m not in leaving]
    held = sum(m.engine.live_requests for m in leaving)
    for route in leaving:
        route.engine.stop_admitting(why)
    handed_off = ended = 0
    last_tokens: dict[str, int | None] = {}
    if not await _idle_within(leaving, wait_s):
        last_tokens = {rid: _engine(r).last_token_ns(rid) for r in leaving for rid in _engine(r).stream_ids()}
        handed_off, ended = await _hand_over(leaving, why)
    publish(_serving_set(current, kept), removed)
    for gone in removed:
        metrics.ROUTES_REMOVED.labels(gone.reason.value).inc()
    stored = store(tuple(route_of(m) for m in kept), removed)
    await asyncio.gather(*(_unload(route) for route in leaving))
    gap_s = await largest_gap_s([_engine(r) for r in kept], last_tokens, GAP_WAIT_S)
    return RoutesRemoved(held - handed_off - ended, handed_off, ended, stored, gap_s)


def _engine(route: InstalledRoute) -> ServingEngine:
    if not isinstance(route.engine, ServingEngine):
        raise TypeError("a replica route serves through one ServingEngine")
    return route.engine


async def _idle_within(routes: Sequence[InstalledRoute], timeout_s: float) -> bool:
    try:
        await asyncio.wait_for(asyncio.gather(*(r.engine.wait_idle() for r in routes)), timeout_s)
    except TimeoutError:
        return False
    return True


async def _hand_over(routes: Sequence[InstalledRoute], reason: str) -> tuple[int, int]:
    """(handed off, ended): every greedy stream still running is suspended, and the set's
    fail-over hands it to a route that stays; what none takes ends."""
    handed_off = ended = 0
    for route in routes:
        engine = _engine(route)
        suspended, ended_now = await engine.suspend_remaining(reason)
        stranded = engine.end_suspended(reason)
        handed_off += suspended - stranded
        ended += ended_now + stranded
    return handed_off, ended


async def largest_gap_s(routes: Sequence[ServingEngine], last_tokens: dict[str, int | None],
                        wait_s: float) -> float:
    """The largest time from a stream's last token before the hand-over (`last_tokens`) to its
    first one on the route that took it; waits up to `wait_s` for those tokens."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + wait_s
    gaps: dict[str, float] = {}
    while True:
        pending = False
        for engine in routes:
            for rid in set(engine.stream_ids()) & last_tokens.keys() - gaps.keys():
                before, now = last_tokens[rid], engine.last_token_ns(rid)
                if now is not None and (before is None or now > before):
                    gaps[rid] = (now - before) / 1e9 if before is not None else 0.0
                else:
                    pending = True
        if not pending or loop.time() >= give_up:
            return max(gaps.values(), default=0.0)
        await asyncio.sleep(0.01)


def _serving_set(current: InstalledRoute, kept: Sequence[InstalledRoute]) -> InstalledRoute:
    """The routes that stay, as the set new requests go to; one route alone serves as itself."""
    if isinstance(current.engine, MultiRouteEngine):
        current.engine.detach()  # the leaving set hands no more streams; the set left does
    if len(kept) > 1:
        return route_set(replace(current.request, stages=sum(len(r.stages) for r in kept)), kept)
    return kept[0]  # one route alone: no other route to hand streams to


async def _unload(route: InstalledRoute) -> None:
    await route.engine.close(release_timeout_s=RELEASE_TIMEOUT_S)
    if route.retire is not None:
        try:
            await route.retire()
        except Exception as exc:  # noqa: BLE001  (the host is leaving; only its memory stays held)
            _log.warning("drained_route_retire_failed", error=f"{type(exc).__name__}: {exc}"[:300])
