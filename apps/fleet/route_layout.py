"""`fornax up --fleet FILE --routes auto|N`: the planner's replica-route layout of the file's
stage hosts, as the orchestrator's FORNAX_ROUTE_GROUPS (indices into its stage workers, which
follow the file's stage hosts in order).

The layout is what `fornax plan --fleet FILE --routes ...` chooses, from the file's declared
figures (a prediction of the cost model, never a measurement); each route is then planned
again on its own hosts when the orchestrator installs it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from apps.fleet.spec import FleetSpec
from libs.service.errors import FailedPrecondition, InvalidArgument

if TYPE_CHECKING:
    from services.planner.domain import PlanResult

# The load the layout is chosen for: `fornax plan`'s defaults.
LAYOUT_CONTEXT_TOKENS = 2048
LAYOUT_CONCURRENCY = 32


@dataclass(frozen=True)
class RouteLayout:
    groups: tuple[tuple[int, ...], ...]  # one per route, stage order; () for a single route
    description: str  # "2 routes: alpha>beta | gamma>delta"
    predicted_tok_s: float  # the layout's predicted decode tokens/s (prediction, declared figures)
    routes: tuple[tuple[str, ...], ...] = ()  # every route's hosts, stage order (one route too)


def parse_routes(text: str) -> int | None:
    """`--routes`: None for auto, else a count >= 1; anything else is BAD_ROUTE_COUNT."""
    if text == "auto":
        return None
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise InvalidArgument(f"--routes takes auto or a count >= 1, got {text!r}", reason="BAD_ROUTE_COUNT",
                          field="routes")


def plan_fleet_routes(spec: FleetSpec, checkpoint: str, count: int | None, weights: str | None,
                      concurrency: int = LAYOUT_CONCURRENCY) -> PlanResult:
    """The planner's replica-route result for the file's declared figures at `concurrency`
    (every layout weighed is in its `route_choice`; predictions, never measurements)."""
    from apps.fleet.plan_inventory import fleet_target, fleet_weights, inventory_from_fleet
    from services.planner.model import describe_checkpoint
    from services.planner.planner import plan_routes

    built = inventory_from_fleet(spec)
    chosen_weights = fleet_weights(spec, weights)
    model = describe_checkpoint(checkpoint, chosen_weights.policy)
    if chosen_weights.mixed:
        model = replace(model, weights_policy="")
    target = fleet_target(spec, context_tokens=LAYOUT_CONTEXT_TOKENS, concurrency=concurrency,
                          stages=None, mode="exploratory")
    return plan_routes(model, built.inventory, target, count, None)


def plan_layout(spec: FleetSpec, checkpoint: str, routes: str, weights: str | None) -> RouteLayout:
    from services.planner.replicas import describe_layout

    result = plan_fleet_routes(spec, checkpoint, parse_routes(routes), weights)
    if not result.feasible or not result.routes:
        raise FailedPrecondition(f"no replica-route layout fits the fleet: {result.infeasibility}",
                                 reason=result.infeasibility_reason or "ROUTES_INFEASIBLE")
    names = [host.name for host in spec.stage_hosts]
    plans = [share.plan for share in result.routes]
    groups = tuple(tuple(names.index(stage.node) for stage in plan.stages) for plan in plans)
    choice = result.route_choice
    chosen = choice.candidates[choice.chosen] if choice is not None else None
    description = chosen.layout if chosen is not None else describe_layout(
        [[s.node for s in p.stages] for p in plans], plans)
    return RouteLayout(groups if len(groups) > 1 else (), description,
                       chosen.tokens_per_s if chosen is not None else 0.0,
                       tuple(tuple(stage.node for stage in plan.stages) for plan in plans))
