"""`--replan-on-change`: the pool watcher and the re-plan it calls, wired from the settings.

The watcher (route/pool_discovery.py) resolves every FORNAX_STAGE_POOLS headless Service; when
the hysteresis policy (route/replan_policy.py) fires, the hook plans the installed request (or,
with nothing installed, FORNAX_CHECKPOINT's) afresh onto the discovered workers through
`RouteManager.replan`: the same install path as InstallPlan, make-before-break over the
serving route.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from libs.service.errors import FailedPrecondition, InvalidArgument
from services.orchestrator.config import OrchestratorConfig
from services.orchestrator.route.lifecycle import Installer, InstallRequest, Preparer, RouteManager
from services.orchestrator.route.pool_discovery import (
    DnsResolver,
    PoolWatcher,
    ReplanHook,
    Resolver,
    external_workers,
    planned_set,
)
from services.orchestrator.route.replan_policy import ReplanPolicy

# The installer and preparer of a configuration (server.choose_installer, choose_preparer).
FleetOf = Callable[[OrchestratorConfig], tuple[Installer, Preparer | None]]


def check_replan_settings(cfg: OrchestratorConfig) -> None:
    """Refuses settings a re-plan on change cannot honour, naming the variable."""
    route = cfg.route
    if not route.replan_on_change:
        return
    if not route.stage_pools:
        raise InvalidArgument("FORNAX_REPLAN_ON_CHANGE needs FORNAX_STAGE_POOLS (the pools to watch)",
                              reason="REPLAN_WITHOUT_POOLS", field="FORNAX_STAGE_POOLS")
    if cfg.inprocess.checkpoint:
        raise InvalidArgument("in-process stages have no workers to re-plan onto",
                              reason="REPLAN_INPROCESS", field="FORNAX_REPLAN_ON_CHANGE")
    if route.route_groups:
        raise InvalidArgument("FORNAX_ROUTE_GROUPS names worker indices, which a changed worker set "
                              "does not keep; re-plan on change serves one route",
                              reason="REPLAN_WITH_ROUTE_GROUPS", field="FORNAX_ROUTE_GROUPS")


def replan_hook(cfg: OrchestratorConfig, manager: RouteManager, fleet_of: FleetOf) -> ReplanHook:
    async def replan(workers: tuple[str, ...]) -> None:
        moved = replace(cfg, route=replace(cfg.route, stage_workers=workers))
        installer, prepare = fleet_of(moved)
        await manager.replan(installer, prepare, replan_request(cfg, manager, len(workers)))

    return replan


def replan_request(cfg: OrchestratorConfig, manager: RouteManager, stages: int) -> InstallRequest:
    """The installed request over `stages` workers, or FORNAX_CHECKPOINT's with nothing installed."""
    current = manager.current
    if current is not None:
        return replace(current.request, stages=stages)
    if not cfg.route.checkpoint:
        raise FailedPrecondition("nothing is installed and no FORNAX_CHECKPOINT names what to plan",
                                 reason="NO_ROUTE")
    return InstallRequest(cfg.route.checkpoint, stages, cfg.route.backend, cfg.route.boundary_dtype)


def pool_watcher(cfg: OrchestratorConfig, manager: RouteManager, fleet_of: FleetOf,
                 resolver: Resolver | None = None) -> PoolWatcher | None:
    """The watcher when FORNAX_REPLAN_ON_CHANGE is on; the plan it starts from is the one made
    for FORNAX_STAGE_WORKERS."""
    check_replan_settings(cfg)
    route = cfg.route
    if not route.replan_on_change:
        return None
    policy = ReplanPolicy(route.replan_settings(), planned_set(route.stage_pools, route.stage_workers))
    return PoolWatcher(route.stage_pools, resolver or DnsResolver(), policy, replan_hook(cfg, manager, fleet_of),
                       route.discovery_interval_s, external=external_workers(route.stage_pools, route.stage_workers))
