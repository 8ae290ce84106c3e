"""At startup, the replica routes an orchestrator that restarts serves: reads what its state
directory stored, decides (route/resume.py), says so in the log, and installs those routes.

A fleet orchestrator (stage workers configured) with a committed `route_set.json` installs that
set, each route on its stored workers (a worker that joined later gets the fleet's weights, as
`AddRoutes` gave it); one stored route installs as a single route. A change marker left in flight
is cleared after the decision: the change is rolled back.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import structlog

from services.orchestrator.config import OrchestratorConfig
from services.orchestrator.route.host_change import Route
from services.orchestrator.route.lifecycle import Installer
from services.orchestrator.route.replica_routes import replica_installer
from services.orchestrator.route.resume import ResumeDecision, ResumeSource, decide_resume
from services.orchestrator.route.route_set_store import (
    RouteSetJournal,
    clear_change,
    read_change,
    read_route_set,
)

_log = structlog.get_logger()


def resume_at_startup(cfg: OrchestratorConfig) -> tuple[ResumeDecision, RouteSetJournal]:
    """What to serve, and the journal that records the changes from there."""
    route = cfg.route
    state, workers = route.state_dir, route.stage_workers
    if cfg.inprocess.checkpoint or not workers:
        decision = decide_resume(workers, None, None)
        return decision, RouteSetJournal(state, workers)
    try:
        committed, in_flight = read_route_set(state), read_change(state)
    except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
        _log.error("route_set_unreadable", state_dir=state, error=f"{type(exc).__name__}: {exc}"[:300])
        committed, in_flight = None, None
    decision = decide_resume(workers, committed, in_flight)
    clear_change(state)
    if decision.rolled_back:
        _log.warning("route_set_change_rolled_back", change=decision.rolled_back,
                     generation=committed.generation if committed else 0)
    _log.info("route_set_resumed" if decision.source is ResumeSource.STORED else "route_set_configured",
              why=decision.why, removed=len(decision.removed))
    return decision, RouteSetJournal(state, workers, decision.committed)


def resumed_installer(cfg: OrchestratorConfig, routes: tuple[Route, ...],
                      on: Callable[..., Installer]) -> Installer:
    """The stored routes: one route alone installs as itself, more as a replica set."""
    from services.orchestrator.route.install import WeightsChoice

    route = cfg.route

    def member(workers: Route) -> Installer:
        hops = route.hop_boundary_dtypes[:1] * (len(workers) - 1)
        known = route.worker_weights and all(w in route.stage_workers for w in workers)
        weights = tuple(route.worker_weights[route.stage_workers.index(w)] for w in workers) if known else ()
        return on(workers, hops, WeightsChoice(route.weights_policy, weights))

    return member(routes[0]) if len(routes) == 1 else replica_installer(routes, member)
