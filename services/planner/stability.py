"""A placement that does not flip on profile noise. Pure.

Every profile figure is a median with its lowest and highest run. The planner predicts each
placement's bottleneck from the medians, and also from the lows and from the highs (the same
cost model over a book whose figures stand at their low or high run: a time at its low, a rate
at its high, and the other way round), which gives each placement a measured band
`[B_low, B_high]`. A placement P is *within the spread* of the fastest F (a tie the
measurements cannot break) when each one's median lies inside the other's band:
B(P) <= B_high(F) and B(F) >= B_low(P). Then F, faster on the medians, may be slower on the next
profile. Mere overlap of the two bands is not enough: one slow run stretches a band's high side
(recorded on this project's two-unlike-hosts fleet: the fastest's band reached 2.6 times its
median), so overlap lumped placements twice as slow on every median in with the tie, and whether
they overlapped flipped from one profile to the next, and with it the simplest of the set.

So among the placements within the spread of the fastest:
1. the placement chosen before (`previous`), when it is among them, is kept;
2. else the simplest (`simplicity`): fewest stages, then nodes in inventory order, then the most
   even layer counts, then the earliest cuts. None of these depend on the measurements, so three
   noisy profiles of the same fleet give the same answer.
A placement no other one ties with wins outright.

A deployment plan is different: it installs what a gate measured. When a passing route
calibration of this model stands on these nodes, its placement is the deployment's, however
the corrected cost model now ranks it; a placement predicted faster is named in the choice,
to be qualified before it can be deployed.
The choice and its figures (all predictions) are stated in the plan (`Plan.choice`); a placement
that wins outright names the next fastest and which side of the spread keeps it out.

A band always holds its own median. The lows and highs run through the same cost model as the
medians, which reads figures at other rows and pasts off the measured grid by interpolation and
extrapolation, and a line through two lows can rise above the line through two medians.
Recorded on this project's two-unlike-hosts fleet: a fastest placement predicted 19.40 ms on the
medians and 19.88 ms on the lows, so it did not tie with itself, the tie rule never ran, and a
placement that tied with it (21.05 ms, band 17.80..32.63) lost to it on noise.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from libs.profiles import schema
from services.planner.profiles import CalibrationRecord, LinkRecord, ProfileBook, StageRecord
from services.planner.search import Placement, Problem, evaluate

LOW, HIGH = "low", "high"
# Placements counted before giving up the exhaustive pass (then the median-best is kept, and said so).
ENUMERATION_LIMIT = 20_000
KEPT_PREVIOUS, SIMPLEST, FASTEST, UNCHECKED = "kept_previous", "simplest_within_spread", "fastest", "unchecked"
QUALIFIED = "qualified"


def _bound(figure: schema.Figure, side: str) -> schema.Figure:
    """The figure standing at its low or high run, for the time it implies (a rate inverts)."""
    rate = "/s" in figure.unit
    value = figure.low if (side == LOW) != rate else figure.high
    return replace(figure, median=value)


def _bound_table(table: dict[int, schema.Figure], side: str) -> dict[int, schema.Figure]:
    return {k: _bound(f, side) for k, f in table.items()}


def _bound_grid(grid: dict[int, dict[int, schema.Figure]], side: str) -> dict[int, dict[int, schema.Figure]]:
    return {c: _bound_table(t, side) for c, t in grid.items()}


def _bound_stage(p: schema.StageProfile, side: str) -> schema.StageProfile:
    kinds = tuple(replace(k, prefill_s_per_token=_bound_table(k.prefill_s_per_token, side),
                          decode_s_per_microbatch=_bound_table(k.decode_s_per_microbatch, side),
                          decode_s_by_context=_bound_grid(k.decode_s_by_context, side)) for k in p.kinds)
    return replace(p, kinds=kinds, step_s_per_microbatch=_bound_table(p.step_s_per_microbatch, side),
                   step_s_by_context=_bound_grid(p.step_s_by_context, side))


def bounded_book(book: ProfileBook, side: str) -> ProfileBook:
    """The same records with every figure at its `side` (LOW: fastest run, HIGH: slowest run)."""
    return ProfileBook(
        stages=tuple(StageRecord(r.record_id, _bound_stage(r.profile, side), r.standing) for r in book.stages),
        links=tuple(LinkRecord(r.record_id, replace(r.profile, rtt_32kib_s=_bound(r.profile.rtt_32kib_s, side),
                                                    throughput_bytes_per_s=_bound(r.profile.throughput_bytes_per_s,
                                                                                  side)), r.standing)
                    for r in book.links),
        calibrations=tuple(_bound_calibration(r, side) for r in book.calibrations))


def _bound_calibration(r: CalibrationRecord, side: str) -> CalibrationRecord:
    stages = tuple(replace(s, measured_s=_bound(s.measured_s, side),
                           measured_terms={k: _bound(f, side) for k, f in s.measured_terms.items()})
                   for s in r.calibration.stages)
    return replace(r, calibration=replace(r.calibration, stages=stages))


@dataclass(frozen=True)
class Choice:
    """Why this placement: `rule` is one of the module's rules; every figure is a prediction."""

    rule: str
    chosen: Placement
    fastest: Placement
    chosen_band_s: tuple[float, float]  # (B_low, B_high) of the chosen placement
    fastest_band_s: tuple[float, float]
    candidates_within_spread: int
    # The next fastest on the medians when the chosen one wins outright, and its band.
    runner_up: Placement | None = None
    runner_up_band_s: tuple[float, float] = (0.0, 0.0)

    def describe(self, names: Sequence[str]) -> str:
        def show(p: Placement) -> str:
            return " > ".join(f"{names[v]}[{p.cuts[k]}:{p.cuts[k + 1]}]" for k, v in enumerate(p.nodes))

        def band(b: tuple[float, float]) -> str:
            return f"{b[0] * 1e3:.4g}..{b[1] * 1e3:.4g} ms"

        chosen = f"{show(self.chosen)} (bottleneck {self.chosen.value * 1e3:.4g} ms, band {band(self.chosen_band_s)})"
        fastest = (f"{show(self.fastest)} (bottleneck {self.fastest.value * 1e3:.4g} ms, "
                   f"band {band(self.fastest_band_s)})")
        if self.rule == FASTEST and self.candidates_within_spread > 1:
            return (f"fastest on the medians: {chosen}, and the simplest of the {self.candidates_within_spread} "
                    "placements within the measured spread of it (predictions)")
        if self.rule == FASTEST and self.runner_up is not None:
            return f"fastest on the medians: {chosen}; {self._outright(show, band)} (predictions)"
        if self.rule == FASTEST:
            return f"fastest on the medians: {chosen}; the only placement (predictions)"
        if self.rule == QUALIFIED and self.chosen == self.fastest:
            return f"the qualified placement, also the fastest on the medians: {chosen} (predictions)"
        if self.rule == QUALIFIED:
            return (f"the qualified placement: {chosen}; the cost model predicts {fastest} faster, "
                    "which `fornax qualify` must measure before a deployment installs it (predictions)")
        if self.rule == UNCHECKED:
            return f"fastest on the medians: {chosen}; too many placements to check the spread (predictions)"
        same = (self.chosen.nodes, self.chosen.cuts) == (self.fastest.nodes, self.fastest.cuts)
        if self.rule == KEPT_PREVIOUS and same:
            return (f"kept the placement chosen before, also the fastest on the medians: {chosen}; "
                    f"{self.candidates_within_spread} placement(s) within the measured spread of it (predictions)")
        why = ("kept the placement chosen before" if self.rule == KEPT_PREVIOUS else
               "chose the simplest (fewest stages, inventory order, most even layers)")
        return (f"{why}: {chosen}; the fastest on the medians, {fastest}, lies within the measured spread of it "
                f"(each median within the other's band; {self.candidates_within_spread} placement(s) within "
                "spread; predictions)")


    def _outright(self, show, band) -> str:
        """Why the next fastest does not tie: which side of the spread keeps it out."""
        assert self.runner_up is not None
        nxt = self.runner_up
        why = ("even its lowest-run prediction lies above this one's median"
               if self.runner_up_band_s[0] > self.chosen.value else
               "its median lies above this one's highest-run prediction")
        return (f"the next fastest, {show(nxt)} (bottleneck {nxt.value * 1e3:.4g} ms, "
                f"band {band(self.runner_up_band_s)}), is slower by more than the measured spread: {why}")


def placements(problem: Problem) -> list[tuple[tuple[int, ...], tuple[int, ...]]] | None:
    """Every (nodes, cuts) of the problem's stage bounds; None when there are over ENUMERATION_LIMIT."""
    n, L = problem.num_nodes, problem.num_layers
    top = min(problem.max_stages, n, L)
    count = sum(math.perm(n, k) * math.comb(L - 1, k - 1) for k in range(problem.min_stages, top + 1))
    if count > ENUMERATION_LIMIT:
        return None
    out = []
    for k in range(problem.min_stages, top + 1):
        for nodes in itertools.permutations(range(n), k):
            for inner in itertools.combinations(range(1, L), k - 1):
                out.append((nodes, (0, *inner, L)))
    return out


def within_spread(value_s: float, band_s: tuple[float, float], fastest_s: float,
                  fastest_band_s: tuple[float, float]) -> bool:
    """Whether a placement predicted `value_s` (band `band_s`) ties with the fastest: each one's
    median bottleneck lies within the other's band of lowest..highest run."""
    return math.isfinite(value_s) and value_s <= fastest_band_s[1] and fastest_s >= band_s[0]


def simplicity(nodes: tuple[int, ...], cuts: tuple[int, ...]) -> tuple:
    sizes = [b - a for a, b in zip(cuts, cuts[1:], strict=False)]
    return (len(nodes), nodes, max(sizes) - min(sizes), cuts)


def _whole(problem: Problem, p: Placement) -> bool:
    """Whether `p` places every layer within the problem's stage bounds."""
    return p.cuts[-1] == problem.num_layers and problem.min_stages <= len(p.nodes) <= problem.max_stages


def choose(median: Problem, low: Problem, high: Problem, fastest: Placement,
           previous: Placement | None = None, qualified: Placement | None = None) -> Choice:
    """The placement to plan: see the module docstring. `fastest` is the median problem's optimum;
    `qualified`, for a deployment, the placement of the newest passing calibration."""
    def band(nodes: tuple[int, ...], cuts: tuple[int, ...]) -> tuple[float, float]:
        value = evaluate(median, nodes, cuts)
        return min(evaluate(low, nodes, cuts), value), max(evaluate(high, nodes, cuts), value)

    fastest_band = band(fastest.nodes, fastest.cuts)
    if qualified is not None and _whole(median, qualified) and \
            math.isfinite(evaluate(median, qualified.nodes, qualified.cuts)):
        pick = (qualified.nodes, qualified.cuts)
        chosen = Placement(*pick, evaluate(median, *pick))
        return Choice(QUALIFIED, chosen if pick != (fastest.nodes, fastest.cuts) else fastest, fastest,
                      band(*pick), fastest_band, 1)
    every = placements(median)
    if every is None:
        return Choice(UNCHECKED, fastest, fastest, fastest_band, fastest_band, 1)
    fastest_s = evaluate(median, fastest.nodes, fastest.cuts)
    within = [(nodes, cuts) for nodes, cuts in every
              if within_spread(evaluate(median, nodes, cuts), band(nodes, cuts), fastest_s, fastest_band)]
    rule, pick = FASTEST, (fastest.nodes, fastest.cuts)
    if previous is not None and (previous.nodes, previous.cuts) in within and len(within) > 1:
        rule, pick = KEPT_PREVIOUS, (previous.nodes, previous.cuts)
    elif len(within) > 1:
        pick = min(within, key=lambda p: simplicity(*p))
        rule = FASTEST if pick == (fastest.nodes, fastest.cuts) else SIMPLEST
    chosen = Placement(pick[0], pick[1], evaluate(median, *pick))
    runner = _runner_up(median, every, pick) if len(within) <= 1 else None
    return Choice(rule, chosen, fastest, band(*pick), fastest_band, max(len(within), 1), runner,
                  band(runner.nodes, runner.cuts) if runner else (0.0, 0.0))


def _runner_up(median: Problem, every: list[tuple[tuple[int, ...], tuple[int, ...]]],
               chosen: tuple[tuple[int, ...], tuple[int, ...]]) -> Placement | None:
    """The fastest on the medians after `chosen`; None when no other placement is feasible."""
    others = [Placement(n, c, evaluate(median, n, c)) for n, c in every if (n, c) != chosen]
    others = [p for p in others if math.isfinite(p.value)]
    return min(others, key=lambda p: (p.value, simplicity(p.nodes, p.cuts))) if others else None


def previous_placement(book: ProfileBook, model_snapshot: str, hosts: Sequence[str],
                       backends: Sequence[str], passing_only: bool = False) -> Placement | None:
    """The placement of the newest route calibration of this model (with `passing_only`, the
    newest that passed and that the registry vouches for), on these nodes (host and backend per
    node index): the placement chosen, installed and qualified before."""
    found = [r for r in book.calibrations if r.calibration.route_key.startswith(model_snapshot + "|")
             and (not passing_only or (r.calibration.passed and r.standing.ok))]
    if not found:
        return None
    newest = max(found, key=lambda r: r.calibration.measured_unix_ns)
    nodes, cuts = [], [0]
    for stage in sorted(newest.calibration.stages, key=lambda s: s.stage_index):
        index = next((i for i, h in enumerate(hosts) if h == stage.host), None)
        if index is None or cuts[-1] != stage.layer_start or index in nodes:
            return None
        hop = f"{stage.host}:{backends[index]}[{stage.layer_start}:{stage.layer_end}]"
        if hop not in newest.calibration.route_key:  # the node runs another backend now
            return None
        nodes.append(index)
        cuts.append(stage.layer_end)
    return Placement(tuple(nodes), tuple(cuts), 0.0) if nodes else None
