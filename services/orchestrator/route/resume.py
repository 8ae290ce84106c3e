"""An orchestrator that starts again: which replica routes it serves, from what it stored.

Pure: the caller reads `route_set.json` and `route_set.change.json` (route/route_set_store.py)
and passes them in. The set last committed is served, with the routes added since the start and
without those drained or lost; a change still in flight (its marker starts from the stored
generation: it never committed) is rolled back to that set, since nothing of it was stored. A
set stored for other configured stage workers (another fleet in the same state directory), or
none stored, leaves the configured routes (FORNAX_ROUTE_GROUPS).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from services.orchestrator.route.host_change import RemovedRoute, Route, route_name
from services.orchestrator.route.route_set_store import ChangeInFlight, StoredRouteSet


class ResumeSource(enum.Enum):
    CONFIGURED = "CONFIGURED"  # FORNAX_ROUTE_GROUPS (or the one configured route)
    STORED = "STORED"  # the set last committed to route_set.json


@dataclass(frozen=True)
class ResumeDecision:
    source: ResumeSource
    routes: tuple[Route, ...]  # STORED: the routes to install, stage worker addresses; else ()
    removed: tuple[RemovedRoute, ...]  # routes taken out before the restart, for the status
    rolled_back: str  # the change in flight that never committed, in words; "" when none
    why: str  # why this source, in words for the log
    committed: StoredRouteSet | None  # the set the next change starts from; None when not resumed


def decide_resume(configured_workers: Sequence[str], committed: StoredRouteSet | None,
                  in_flight: ChangeInFlight | None) -> ResumeDecision:
    generation = committed.generation if committed else 0
    rolled_back = in_flight.change if in_flight and in_flight.base_generation >= generation else ""

    def configured(why: str) -> ResumeDecision:
        return ResumeDecision(ResumeSource.CONFIGURED, (), (), rolled_back, why, None)

    if committed is None:
        return configured("no route set is stored")
    if not committed.routes:
        return configured("the stored route set holds no route")
    known = set(configured_workers)
    if committed.configured_workers and tuple(committed.configured_workers) != tuple(configured_workers):
        return configured("the stored route set was stored for other stage workers: "
                          f"{', '.join(committed.configured_workers)}")
    if not committed.configured_workers and any(w not in known for r in committed.routes for w in r):
        return configured("the stored route set names stage workers that are not configured")
    return ResumeDecision(ResumeSource.STORED, committed.routes, committed.removed, rolled_back,
                          f"generation {generation}: {', '.join(route_name(r) for r in committed.routes)}",
                          committed)
