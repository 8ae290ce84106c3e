"""`--rejoin-timeout`, inside the orchestrator: a replica route whose host is gone longer than
the timeout leaves the serving set, the way a host drain takes a route out.

Every health interval the watcher reads each serving route as its supervisor last saw it (the
engine admits or not; each stage's condition from the health probes) and asks the pure core
(`rejoin_timeout.py`) which routes are overdue. It reads rather than subscribes: the set is
rebuilt by drains and adds, and which host is gone is in the probes' stage conditions, not in
the route events. An overdue route is removed under the lifecycle lock
(`RouteManager.change_routes`) by `host_drain.remove_routes`: its greedy streams still suspended
there are handed to the routes that stay, the set left is published and stored, and the route
is recorded as removed with reason REJOIN_TIMEOUT and its host. A route the core keeps (no
other route serves) is logged once and keeps waiting for its host.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from functools import partial

import structlog

from libs.service.errors import FornaxError
from services.orchestrator.route.host_change import RemovalReason, RemovedRoute, Route, route_name
from services.orchestrator.route.host_drain import RouteSetStore, remove_routes, route_of
from services.orchestrator.route.lifecycle import InstalledRoute, Publish, RouteManager
from services.orchestrator.route.rejoin_timeout import (
    LostSince,
    RouteObservation,
    RouteWatch,
    decide_rejoin,
)
from services.orchestrator.route.route_health import HealthPolicy, StageCondition

_log = structlog.get_logger()
# Stage conditions that mean the stage's host is gone (not merely restarted or draining).
GONE = frozenset({StageCondition.UNREACHABLE.value, StageCondition.UNRESPONSIVE.value})
CHECK_INTERVAL_S = HealthPolicy.interval_s


def observe(route: InstalledRoute) -> RouteObservation:
    """The route as its supervisor last saw it: admitting or not, and the first gone stage's worker."""
    conditions = route.stage_conditions() if route.stage_conditions else ()
    gone = [s.worker_address for s, c in zip(route.stages, conditions, strict=False) if c in GONE]
    return RouteObservation(route_of(route), route.engine.admitting, gone[0] if gone else "")


class RejoinWatcher:
    def __init__(self, manager: RouteManager, timeout_s: float, store: RouteSetStore,
                 clock: Callable[[], float] = time.monotonic, interval_s: float = CHECK_INTERVAL_S) -> None:
        self._manager = manager
        self._timeout_s = timeout_s
        self._store = store
        self._clock = clock
        self._interval_s = interval_s
        self._lost = LostSince()
        self._kept_told: set[Route] = set()  # kept routes already logged, until they serve again

    async def run(self) -> None:
        while True:
            try:
                await self.check()
            except Exception:  # the watch must outlive any one round
                _log.exception("rejoin_watch_round_failed")
            await asyncio.sleep(self._interval_s)

    async def check(self) -> tuple[RemovedRoute, ...]:
        """One round: watch the serving routes, remove those overdue; returns what was removed."""
        current = self._manager.current
        if current is None:
            return ()
        watches = self._lost.observe(self._clock(), [observe(r) for r in current.members or (current,)])
        decision = decide_rejoin(watches, self._timeout_s)
        self._tell_kept(decision.kept, decision.why_kept)
        if not decision.drop:
            return ()
        try:
            return await self._manager.change_routes("remove a lost route", partial(
                remove_lost_routes, lost=decision.drop, timeout_s=self._timeout_s, store=self._store))
        except FornaxError as exc:  # another lifecycle change runs, or none serves: next round
            _log.info("rejoin_timeout_removal_deferred", reason=exc.reason, detail=exc.message)
            return ()

    def _tell_kept(self, kept: Sequence[RouteWatch], why: str) -> None:
        routes = {w.route for w in kept}
        if routes - self._kept_told:
            _log.warning("rejoin_timeout_route_kept", routes=[route_name(r) for r in routes], why=why)
        self._kept_told = routes


async def remove_lost_routes(current: InstalledRoute, publish: Publish, *, lost: Sequence[RouteWatch],
                             timeout_s: float, store: RouteSetStore) -> tuple[RemovedRoute, ...]:
    """Under the lifecycle lock: removes the `lost` routes still in the set and still not
    admitting (a host that came back meanwhile keeps its route), while another route serves."""
    members = {route_of(m): m for m in current.members}
    still = [w for w in lost if w.route in members and not members[w.route].engine.admitting]
    leaving = [members[w.route] for w in still]
    if not leaving or not any(m.engine.admitting for m in current.members if m not in leaving):
        return ()
    removed = tuple(RemovedRoute(w.route, RemovalReason.REJOIN_TIMEOUT, w.gone_host,
                                 f"host {w.gone_host} did not come back within {timeout_s:g} s")
                    for w in still)
    done = await remove_routes(current, publish, leaving, removed, why=removed[0].detail, wait_s=0.0, store=store)
    for route in removed:
        _log.warning("route_removed_rejoin_timeout", route=route_name(route.route), host=route.host,
                     timeout_s=timeout_s, handed_off=done.handed_off, ended=done.ended, stored=done.stored)
    return removed
