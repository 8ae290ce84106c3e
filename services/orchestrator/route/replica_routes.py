"""Replica routes installed as one: each group of stage workers gets a whole route of its own
(planned, built, loaded, warmed and supervised like a single route), and one
`MultiRouteEngine` serves them all behind the API.

The set is an `InstalledRoute` whose `members` are the routes, so the lifecycle treats it as
it treats one route: make-before-break installs a new set beside a serving one (each route
beside its own predecessor, on the same workers), rollback reinstalls each route's stored
plan, drain and retire act on every route.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

import structlog

from libs.service.errors import InvalidArgument
from services.orchestrator.engine.multiroute import MultiRouteEngine
from services.orchestrator.route.lifecycle import InstalledRoute, Installer, InstallRequest, PlanIdentity

_log = structlog.get_logger()
# Plan identities of a set join its routes' identities, route order, with this separator.
JOIN = ","
# A route's workers as the caller names them: indices into the configured workers, or addresses.
_Group = TypeVar("_Group", tuple[int, ...], tuple[str, ...])


def check_route_groups(groups: Sequence[tuple[int, ...]], workers: int) -> None:
    """At least two non-empty groups of stage-worker indices, no worker in two; a worker in none
    stays idle (the planner may leave a host out of every route). Else ROUTE_GROUPS_INVALID."""
    flat = [i for group in groups for i in group]
    if (len(groups) < 2 or any(not g for g in groups) or len(set(flat)) != len(flat)
            or any(not 0 <= i < workers for i in flat)):
        raise InvalidArgument(
            f"FORNAX_ROUTE_GROUPS {[list(g) for g in groups]} must be at least two groups of the "
            f"{workers} stage workers' indices (0..{workers - 1}), no worker in two",
            reason="ROUTE_GROUPS_INVALID", field="FORNAX_ROUTE_GROUPS")


def replica_installer(groups: Sequence[_Group], member: Callable[[_Group], Installer]) -> Installer:
    """Installs one route per group (`member(group)` installs on that group's workers)."""
    installers = [member(group) for group in groups]

    async def installer(request: InstallRequest) -> InstalledRoute:
        stored = request.stored if isinstance(request.stored, tuple) else (None,) * len(groups)
        serving = (request.serving_generation.split(JOIN) if request.serving_generation
                   else [""] * len(groups))
        if len(serving) != len(groups):  # the serving route is not a set of these groups
            serving = [""] * len(groups)
        routes: list[InstalledRoute] = []
        try:
            for install, group, prior, beside in zip(installers, groups, stored, serving, strict=True):
                routes.append(await install(replace(request, stages=len(group), stored=prior,
                                                    serving_generation=beside)))
        except BaseException:
            await asyncio.gather(*(discard_route(route) for route in routes), return_exceptions=True)
            raise
        return route_set(request, routes)

    return installer


def route_set(request: InstallRequest, routes: Sequence[InstalledRoute]) -> InstalledRoute:
    engine = MultiRouteEngine([route.engine for route in routes])  # type: ignore[misc]

    def conditions() -> tuple[str, ...]:
        return tuple(c for route in routes
                     for c in (route.stage_conditions() if route.stage_conditions else ("",) * len(route.stages)))

    async def retire() -> None:
        await asyncio.gather(*(route.retire() for route in routes if route.retire is not None))

    plan = PlanIdentity(*(JOIN.join(getattr(route.plan, name) for route in routes)
                          for name in ("plan_id", "plan_hash", "plan_generation_id")))
    return InstalledRoute(replace(request, stored=tuple(route.request.stored for route in routes),
                                  serving_generation=""),
                          plan, tuple(s for route in routes for s in route.stages), engine, conditions,
                          retire, members=tuple(routes))


async def discard_route(route: InstalledRoute) -> None:
    """A route of a set that failed to install: close its engine and unload its generation."""
    await route.engine.close(release_timeout_s=0)
    if route.retire is not None:
        await route.retire()
