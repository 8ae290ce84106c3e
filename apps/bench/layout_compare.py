"""`fornax bench serve --fleet FILE --compare-routes`: the report's arithmetic. Pure.

Two layouts of the same stage hosts are planned and served in one run: one route over every
stage host (a 4-stage route on four hosts) and the best-predicted layout of two equal routes
(two 2-stage routes). This module picks those layouts out of the planner's candidates, says
which one the planner chooses, and compares its predictions with the measured tokens/s:

- `chosen_vs_best_c<N>`: the chosen layout's measured tokens/s ÷ the better measured one's
  (1.0 when the planner chose the faster layout; the target is >= 0.95).
- `planner_picked_faster_c<N>`: the layout the planner predicts faster at level N measured
  faster there; `planner_picked_faster`: so at every level.

The kill bench's figures come from per-stream outcomes: lost (no finish, or an error), 5xx
(answered with a server error status), and the largest inter-token gap of a stream that had a
token before the kill and one after (a replayed stream's pause).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from services.planner import domain as d

SINGLE, REPLICAS = "one_route", "two_routes"


class LayoutPickError(ValueError):
    """The planner's candidates hold no feasible layout of the asked shape."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class LayoutPick:
    """One layout to serve, and the planner's prediction for it (never a measurement)."""

    name: str  # SINGLE or REPLICAS
    description: str  # "1 route: alpha>beta>gamma>delta"
    hosts: tuple[tuple[str, ...], ...]  # each route's host group
    predicted_tok_s: float


def pick_single(candidates: Sequence[d.LayoutCandidate], hosts: int) -> LayoutPick:
    """The one route over every stage host."""
    for c in candidates:
        if c.feasible and c.routes == 1 and len(c.hosts[0]) == hosts:
            return LayoutPick(SINGLE, c.layout, c.hosts, c.tokens_per_s)
    raise LayoutPickError(f"the planner found no feasible single route over the {hosts} stage hosts",
                          "NO_SINGLE_ROUTE")


def pick_equal_pair(candidates: Sequence[d.LayoutCandidate], hosts: int) -> LayoutPick:
    """The best-predicted layout of two routes with the same number of hosts each."""
    pairs = [c for c in candidates if c.feasible and c.routes == 2 and hosts % 2 == 0
             and all(len(group) == hosts // 2 for group in c.hosts)]
    if not pairs:
        raise LayoutPickError(f"the planner found no feasible layout of two {hosts // 2}-host routes",
                              "NO_EQUAL_ROUTE_PAIR")
    best = max(pairs, key=lambda c: c.tokens_per_s)
    return LayoutPick(REPLICAS, best.layout, best.hosts, best.tokens_per_s)


def planner_choice(single: LayoutPick, pair: LayoutPick) -> str:
    """The planner's rule between the two: the higher prediction; fewer routes on a tie
    (declared figures have no spread, so only an equal prediction ties)."""
    return REPLICAS if pair.predicted_tok_s > single.predicted_tok_s * (1 + 1e-9) else SINGLE


def groups_of(pick: LayoutPick, stage_hosts: Sequence[str]) -> tuple[tuple[int, ...], ...]:
    """FORNAX_ROUTE_GROUPS for the layout: indices into the stage hosts; () for one route."""
    if len(pick.hosts) == 1:
        return ()
    return tuple(tuple(stage_hosts.index(host) for host in group) for group in pick.hosts)


@dataclass(frozen=True)
class LevelComparison:
    measured_tok_s: dict[str, float]  # per layout name, physical
    predicted_tok_s: dict[str, float]  # per layout name, prediction at this level


def compare(levels: dict[str, LevelComparison], chosen: str) -> dict[str, float | bool | str]:
    """chosen_vs_best_c<N>, best_measured_c<N>, predicted_faster_c<N>,
    planner_picked_faster_c<N> per level (keys "c8", ...), and planner_picked_faster overall."""
    out: dict[str, float | bool | str] = {}
    agreed = []
    for level, figures in levels.items():
        measured, predicted = figures.measured_tok_s, figures.predicted_tok_s
        best = max(measured, key=lambda name: measured[name])
        out[f"chosen_vs_best_{level}"] = measured[chosen] / measured[best] if measured[best] > 0 else math.nan
        out[f"best_measured_{level}"] = best
        faster = max(predicted, key=lambda name: (predicted[name], name == SINGLE))  # a tie: fewer routes
        out[f"predicted_faster_{level}"] = faster
        picked_faster = measured[faster] >= max(measured.values())
        out[f"planner_picked_faster_{level}"] = picked_faster
        agreed.append(picked_faster)
    out["planner_picked_faster"] = bool(agreed) and all(agreed)
    return out


@dataclass(frozen=True)
class StreamOutcome:
    """One streamed request of the kill bench, as its client saw it."""

    status: int  # HTTP status (0: no response at all)
    finished: bool  # a finish_reason arrived and the stream closed cleanly
    token_times_s: tuple[float, ...]  # arrival of each token, on the run's clock
    error: str = ""


def kill_report(outcomes: Sequence[StreamOutcome], killed_at_s: float) -> dict[str, float | int]:
    """Lost requests, 5xx answers, and the pause a replayed stream's client saw."""
    lost = sum(1 for o in outcomes if not o.finished or o.error or o.status != 200)
    server_errors = sum(1 for o in outcomes if o.status >= 500)
    spanning = [o for o in outcomes
                if any(t < killed_at_s for t in o.token_times_s) and any(t >= killed_at_s for t in o.token_times_s)]
    gaps = [b - a for o in spanning for a, b in zip(o.token_times_s, o.token_times_s[1:], strict=False)]
    return {"requests": len(outcomes), "lost_requests": lost, "http_5xx": server_errors,
            "streams_across_kill": len(spanning),
            "largest_inter_token_gap_s": max(gaps) if gaps else 0.0}
