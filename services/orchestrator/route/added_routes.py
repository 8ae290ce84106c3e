"""`fornax host add --apply`, inside the orchestrator: replica routes added on stage workers
that serve no route (a host that joined), make before break.

Run under the lifecycle lock (`RouteManager.change_routes`). Each added route is installed
(planned, built, loaded, warmed) while the serving routes keep serving, untouched; only then is
the set published with the added routes in it, so a request goes to a route that is ready or is
not placed at all, and stored (`store`: its commit, route/route_set_store.py). A route that
fails to install unloads every added route already loaded and the serving set is kept. Refused
before anything loads: no route, a worker named twice (ROUTE_WORKERS_INVALID), a worker that
serves a route already (WORKER_SERVES_A_ROUTE).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace

import structlog

from libs.service.errors import FailedPrecondition, InvalidArgument
from services.orchestrator.engine.multiroute import MultiRouteEngine
from services.orchestrator.route.host_change import Route, route_name
from services.orchestrator.route.host_drain import RouteSetStore, route_of
from services.orchestrator.route.lifecycle import InstalledRoute, Installer
from services.orchestrator.route.replica_routes import discard_route, route_set

_log = structlog.get_logger()


def check_added(serving: Sequence[Route], added: Sequence[Route]) -> None:
    """Refuses an empty route, a worker in two added routes, or one that serves a route already."""
    flat = [w for route in added for w in route]
    if not added or any(not route for route in added) or len(set(flat)) != len(flat):
        raise InvalidArgument(f"added routes {[route_name(r) for r in added]} must be non-empty, "
                              "no worker in two", reason="ROUTE_WORKERS_INVALID", field="routes")
    busy = sorted(set(flat) & {w for route in serving for w in route})
    if busy:
        raise FailedPrecondition(f"{', '.join(busy)} serve a route already; re-placing serving routes is "
                                 "not built (drain the host first)", reason="WORKER_SERVES_A_ROUTE")


async def add_routes(current: InstalledRoute, publish: Callable[[InstalledRoute], None], *,
                     added: Sequence[Route], member: Callable[[Route], Installer],
                     store: RouteSetStore | None = None) -> tuple[Route, ...]:
    members = current.members or (current,)
    check_added([route_of(m) for m in members], added)
    installed: list[InstalledRoute] = []
    try:
        for route in added:
            request = replace(current.request, stages=len(route), stored=None, serving_generation="")
            installed.append(await member(route)(request))
    except BaseException:
        await asyncio.gather(*(discard_route(r) for r in installed), return_exceptions=True)
        raise
    every = (*members, *installed)
    if isinstance(current.engine, MultiRouteEngine):
        current.engine.detach()  # the set with the added routes hands streams from now on
    publish(route_set(replace(current.request, stages=sum(len(r.stages) for r in every)), every))
    stored = store(tuple(route_of(m) for m in every), ()) if store is not None else ""
    _log.info("routes_added", added=[route_name(r) for r in added], routes=len(every), stored=stored)
    return tuple(added)
