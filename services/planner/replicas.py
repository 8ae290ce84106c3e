"""Replica routes: how many pipelines the hosts form, which hosts and layers each gets. Pure.

A layout partitions the inventory's nodes into groups; each group is one route (a replica
pipeline serving the whole model: a contiguous cover of every layer), planned with the existing
single-route search on that group alone. A host holds at most one stage of one route, so the
groups are disjoint. Every figure here is a prediction of the cost model, never a measurement.

- Enumeration: every set partition of the nodes (Bell(n) layouts: 15 for 4 hosts, 4140 for 8),
  or only those into exactly N groups when N routes are asked for. Over MAX_ROUTE_HOSTS nodes
  the layout search refuses with `TOO_MANY_HOSTS_FOR_ROUTES` rather than guess.
- Each route's stage bounds are the target's, capped at its group's size, so the default
  microbatch rows (`Target.microbatch_rows`) follow the route's own stage count.
- Concurrency split: the target's sequences are split across the routes, first equally, then in
  proportion to each route's predicted tokens/s at the equal share (largest remainder, at least
  one sequence a route); the split with the higher predicted aggregate is kept. Each route is
  planned at its share, so its memory holds KV for its share only, and its prediction is the
  single-route model's (bottleneck stage at the route's rows per microbatch, per-hop wire terms,
  pipeline fill when its share is small). Fewer sequences than routes: `CONCURRENCY_BELOW_ROUTES`.
- Aggregate: the sum of the routes' predicted decode tokens/s.
- Choice: the highest aggregate, unless a layout with fewer routes lies within the spread of it,
  by the rule single-route placements tie by (`stability.within_spread`): each one's median
  aggregate lies inside the other's band (profiles at their fastest runs, `stability.LOW` times,
  to their slowest, `stability.HIGH` times). Then the fewest routes win (simpler: fewer copies of
  the weights, fewer processes). Mere overlap of the bands is not a tie: one slow run stretches a
  band far past its median. Declared figures have no spread, so only an equal prediction (within
  TIE_TOLERANCE) counts as a tie.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from libs.service.errors import FailedPrecondition, InvalidArgument
from services.planner import domain as d
from services.planner.inventory import Inventory, Target

MAX_ROUTE_HOSTS = 8
TIE_TOLERANCE = 1e-9
FASTEST, FEWER_WITHIN_SPREAD = "fastest", "fewer_routes_within_spread"
SHOWN_CANDIDATES = 20

# Plans one route: (the group's inventory, the route's target) -> its single-route result.
RoutePlanner = Callable[[Inventory, Target], d.PlanResult]
# (inventory, target, plan) -> (slowest, fastest) predicted tokens/s of that placement over the
# measured spread; None: declared figures, no spread.
RouteBand = Callable[[Inventory, Target, d.Plan], tuple[float, float]]


def partitions(count: int, groups: int | None = None) -> Iterator[tuple[tuple[int, ...], ...]]:
    """Set partitions of range(count), each group in ascending order and groups ordered by their
    first member; with `groups`, only those into exactly that many groups."""
    def grow(i: int, blocks: list[list[int]]) -> Iterator[tuple[tuple[int, ...], ...]]:
        if groups is not None and len(blocks) + (count - i) < groups:
            return
        if i == count:
            if groups is None or len(blocks) == groups:
                yield tuple(tuple(b) for b in blocks)
            return
        for b in blocks:
            b.append(i)
            yield from grow(i + 1, blocks)
            b.pop()
        if groups is None or len(blocks) < groups:
            blocks.append([i])
            yield from grow(i + 1, blocks)
            blocks.pop()

    if count:
        yield from grow(0, [])


def group_inventory(inventory: Inventory, names: Sequence[str]) -> Inventory:
    """The nodes named (in inventory order) and the links between them."""
    keep = set(names)
    return replace(inventory, nodes=tuple(n for n in inventory.nodes if n.name in keep),
                   links=tuple(x for x in inventory.links if x.from_node in keep and x.to_node in keep))


def route_target(target: Target, hosts: int, share: int) -> Target:
    return replace(target, concurrency=share, min_stages=min(target.min_stages, hosts),
                   max_stages=min(target.max_stages, hosts))


def equal_shares(total: int, routes: int) -> tuple[int, ...]:
    return tuple(total // routes + (1 if i < total % routes else 0) for i in range(routes))


def proportional_shares(total: int, weights: Sequence[float]) -> tuple[int, ...]:
    """`total` split in proportion to `weights` (largest remainder), at least one each."""
    k = len(weights)
    spare = total - k
    whole = sum(weights)
    exact = [spare * w / whole for w in weights] if whole > 0 else [spare / k] * k
    base = [int(x) for x in exact]
    order = sorted(range(k), key=lambda i: (-(exact[i] - base[i]), i))
    for i in order[: spare - sum(base)]:
        base[i] += 1
    return tuple(1 + b for b in base)


@dataclass(frozen=True)
class _Layout:
    candidate: d.LayoutCandidate
    routes: tuple[d.RouteShare, ...] = ()
    result: d.PlanResult | None = None  # the failing route's result, when infeasible
    rejections: tuple[d.Rejection, ...] = ()  # the routes' node and link rejections, when feasible
    error: FailedPrecondition | None = None


def _route_path(plan: d.Plan) -> str:
    return ">".join(s.node for s in plan.stages)


def describe_layout(groups: Sequence[Sequence[str]], plans: Sequence[d.Plan] | None = None) -> str:
    count = len(groups)
    parts = [_route_path(p) for p in plans] if plans else [">".join(g) for g in groups]
    used = {s.node for p in plans for s in p.stages} if plans else set()
    idle = [n for g in groups for n in g if plans and n not in used]
    text = f"{count} route{'s' if count > 1 else ''}: " + " | ".join(parts)
    return text + (f" (idle: {', '.join(idle)})" if idle else "")


class _Planner:
    def __init__(self, inventory: Inventory, target: Target, plan_route: RoutePlanner,
                 band: RouteBand | None) -> None:
        self.inventory, self.target, self.plan_route, self.band = inventory, target, plan_route, band
        self.memo: dict[tuple[tuple[str, ...], int], tuple[d.PlanResult | None, FailedPrecondition | None]] = {}

    def route(self, names: tuple[str, ...], share: int) -> tuple[d.PlanResult | None, FailedPrecondition | None]:
        key = (names, share)
        if key not in self.memo:
            try:
                self.memo[key] = (self.plan_route(group_inventory(self.inventory, names),
                                                  route_target(self.target, len(names), share)), None)
            except FailedPrecondition as exc:  # e.g. a deployment refused for want of evidence
                self.memo[key] = (None, exc)
        return self.memo[key]

    def split(self, groups: tuple[tuple[str, ...], ...],
              shares: tuple[int, ...]) -> tuple[list[d.PlanResult], int | None, FailedPrecondition | None]:
        """Every route's result at its share; the index of the first infeasible route, if any."""
        results: list[d.PlanResult] = []
        for i, (names, share) in enumerate(zip(groups, shares, strict=True)):
            result, error = self.route(names, share)
            if result is None or not result.feasible:
                return results, i, error
            results.append(result)
        return results, None, None

    def layout(self, groups: tuple[tuple[str, ...], ...]) -> _Layout:
        k, total = len(groups), self.target.concurrency
        plain = describe_layout(groups)
        if total < k:
            return _Layout(d.LayoutCandidate(plain, k, groups, False, reason=d.CONCURRENCY_BELOW_ROUTES,
                                             detail=f"{total} sequence(s) cannot keep {k} routes busy"))
        shares = equal_shares(total, k)
        results, failed, error = self.split(groups, shares)
        if failed is not None:
            result, _ = self.memo[(groups[failed], shares[failed])]
            reason = error.reason if error else result.infeasibility_reason if result else d.NO_FEASIBLE_PLACEMENT
            why = error.message if error else result.infeasibility if result else ""
            return _Layout(d.LayoutCandidate(
                plain, k, groups, False, shares=shares, reason=reason,
                detail=f"route on {', '.join(groups[failed])} at {shares[failed]} sequence(s): {why}"),
                result=result, error=error)
        if k > 1:
            weighted = proportional_shares(total, [_tokens(r.plan) for r in results])
            if weighted != shares:
                again, failed, _ = self.split(groups, weighted)
                if failed is None and sum(map(_tokens, again)) > sum(map(_tokens, results)):
                    results, shares = again, weighted
        plans = [r.plan for r in results if r.plan is not None]
        low = high = sum(map(_tokens, plans))
        if self.band is not None:
            bands = [self.band(group_inventory(self.inventory, names), route_target(self.target, len(names), s), p)
                     for names, s, p in zip(groups, shares, plans, strict=True)]
            low, high = sum(b[0] for b in bands), sum(b[1] for b in bands)
        candidate = d.LayoutCandidate(describe_layout(groups, plans), k, groups, True, sum(map(_tokens, plans)),
                                      (low, high), shares)
        rejections = tuple(dict.fromkeys(x for r in results for x in r.rejections))
        return _Layout(candidate, tuple(d.RouteShare(p, s) for p, s in zip(plans, shares, strict=True)),
                       rejections=rejections)


def _tokens(x: d.Plan | d.PlanResult | None) -> float:
    plan = x.plan if isinstance(x, d.PlanResult) else x
    return plan.prediction("decode_tokens_per_s") if plan is not None else 0.0


def plan_routes(inventory: Inventory, target: Target, routes: int | None, plan_route: RoutePlanner,
                band: RouteBand | None = None) -> d.PlanResult:
    """The best layout of `routes` routes (None: any count, the planner chooses), every candidate
    with its predicted aggregate tokens/s in `route_choice`. Raises `InvalidArgument`
    (`TOO_MANY_HOSTS_FOR_ROUTES`, `BAD_ROUTE_COUNT`) when the layout search cannot answer."""
    names = tuple(n.name for n in inventory.nodes)
    if len(names) > MAX_ROUTE_HOSTS:
        raise InvalidArgument(f"{len(names)} nodes: the route layout search enumerates every partition of at "
                              f"most {MAX_ROUTE_HOSTS} nodes; plan one route, or fewer nodes",
                              reason=d.TOO_MANY_HOSTS_FOR_ROUTES, field="routes")
    if routes is not None and not 1 <= routes <= len(names):
        raise InvalidArgument(f"{routes} route(s) asked of {len(names)} node(s); each route needs a node of its own",
                              reason=d.BAD_ROUTE_COUNT, field="routes")
    planner = _Planner(inventory, target, plan_route, band)
    layouts = [planner.layout(tuple(tuple(names[i] for i in g) for g in groups))
               for groups in partitions(len(names), routes)]
    return choose(layouts)


def choose_layout(candidates: Sequence[d.LayoutCandidate]) -> d.RouteChoice:
    """The rule of the module docstring over labelled predictions; at least one is feasible."""
    feasible = [i for i, c in enumerate(candidates) if c.feasible]
    best = max(feasible, key=lambda i: (candidates[i].tokens_per_s, -candidates[i].routes, -i))
    within = [i for i in feasible if ties(candidates[i], candidates[best])]
    pick = min(within, key=lambda i: (candidates[i].routes, -candidates[i].tokens_per_s, i))
    rule = FASTEST if candidates[pick].routes == candidates[best].routes else FEWER_WITHIN_SPREAD
    if rule == FASTEST:
        pick = best
    return d.RouteChoice(rule, pick, tuple(candidates), explanation(candidates, pick, best, rule))


def ties(candidate: d.LayoutCandidate, best: d.LayoutCandidate) -> bool:
    """Whether `candidate` lies within the measured spread of `best`: each one's median predicted
    tokens/s inside the other's (slowest, fastest) band."""
    slowest, fastest = candidate.band_tokens_per_s
    return (candidate.tokens_per_s >= best.band_tokens_per_s[0] * (1 - TIE_TOLERANCE)
            and best.tokens_per_s <= fastest * (1 + TIE_TOLERANCE) and slowest <= fastest)


def choose(layouts: Sequence[_Layout]) -> d.PlanResult:
    candidates = tuple(x.candidate for x in layouts)
    if not any(c.feasible for c in candidates):
        return _infeasible(layouts)
    choice = choose_layout(candidates)
    chosen = layouts[choice.chosen]
    return d.PlanResult(True, chosen.routes[0].plan, chosen.rejections, routes=chosen.routes, route_choice=choice)


def explanation(candidates: Sequence[d.LayoutCandidate], pick: int, best: int, rule: str) -> str:
    chosen, top = candidates[pick], candidates[best]
    tok = f"{chosen.tokens_per_s:.4g} tokens/s"
    infeasible = [c for c in candidates if not c.feasible]
    reasons = sorted({c.reason for c in infeasible})
    tail = (f"; {len(infeasible)} layout(s) infeasible ({', '.join(reasons)})" if infeasible else "")
    if d.INSUFFICIENT_MEMORY in reasons:
        tail += ("; memory: in those, a route's hosts cannot hold the model's weights plus KV for the route's "
                 "share of the concurrency plus their reserves")
    if rule == FEWER_WITHIN_SPREAD:
        return (f"chose {chosen.layout} ({tok}): the fastest, {top.layout} ({top.tokens_per_s:.4g} tokens/s), "
                "lies within the measured spread of it, and fewer routes are simpler (predictions)" + tail)
    others = [c for c in candidates if c.feasible and c is not chosen]
    if not others:
        return f"chose {chosen.layout} ({tok}): the only feasible layout (predictions)" + tail
    runner = max(others, key=lambda c: c.tokens_per_s)
    if chosen.routes == 1:
        lead = f"one route predicts the highest fleet throughput, {tok}, over {runner.layout} " \
               f"({runner.tokens_per_s:.4g} tokens/s)"
    else:
        lead = f"{chosen.layout} predicts the highest fleet throughput, {tok}, over {runner.layout} " \
               f"({runner.tokens_per_s:.4g} tokens/s)"
    if runner.tokens_per_s >= chosen.tokens_per_s * (1 - TIE_TOLERANCE) and runner.routes > chosen.routes:
        lead += "; tied, and fewer routes are simpler"
    return lead + " (predictions)" + tail


def _infeasible(layouts: Sequence[_Layout]) -> d.PlanResult:
    """No layout is feasible: the fewest-routes layout's own answer (or refusal), with every
    candidate's reason in the choice."""
    candidates = tuple(x.candidate for x in layouts)
    first = min(range(len(layouts)), key=lambda i: candidates[i].routes)
    error = layouts[first].error
    if error is not None:
        raise error
    reasons = sorted({c.reason for c in candidates})
    choice = d.RouteChoice("infeasible", -1, candidates,
                           f"no layout of {len(candidates)} is feasible ({', '.join(reasons)})")
    result = layouts[first].result
    base = result if result is not None else d.PlanResult(False, None)
    return replace(base, feasible=False, plan=None,
                   infeasibility=base.infeasibility or candidates[first].detail,
                   infeasibility_reason=base.infeasibility_reason or candidates[first].reason, route_choice=choice)
