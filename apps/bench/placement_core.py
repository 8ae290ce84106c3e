"""The pure part of `fornax bench placement`: the calibrated split from the planner's
profile-based plan, the ratios, and what explains a calibrated split that loses.

The calibrated split is the planner's own answer (`services.planner.planner.plan_from_profiles`)
to the stored stage and link profiles (physical records); every per-stage time it states is a
prediction computed from those measurements. Only the served figures are measurements.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from services.planner import domain as d

# Runs per split. One run serves 8 x 24 tokens (about 0.2-0.3 s) and its tokens/s moves by a
# fifth to a third from run to run: recorded on the two-unlike-hosts fleet (AMD EPYC, tiny), the
# even split 479-800 tok/s and the calibrated one 586-1072 over six fleets at 2 runs each, the
# very first run of a bench the slowest every time. Best of 4 keeps that first run out of
# either side's figure and gives each split three warm chances.
PLACEMENT_REPEATS = 4
# Timed passes of the load per run, after one untimed pass of it (the first pass on a freshly
# loaded route was the slowest of every bench recorded). Three passes make a run about 0.6 s.
PLACEMENT_WAVES = 3



@dataclass(frozen=True)
class Split:
    """Stage i runs layers `ranges[i]` on fleet stage host `hosts[i]` (worker index `workers[i]`)."""

    workers: tuple[int, ...]
    hosts: tuple[str, ...]
    ranges: tuple[tuple[int, int], ...]


class NotPhysical(ValueError):
    """The plan rests on declared figures somewhere: the benchmark compares a calibrated plan only."""


def calibrated_split(plan: d.Plan, node_names: Sequence[str], hosts: Sequence[str]) -> Split:
    """The plan's placement, its nodes mapped to the fleet's stage workers (`node_names[i]` is
    worker i's inventory node). A term filled with a declared figure is refused, named."""
    declared = [f"stage {s.stage_index} {t.term}" for s in plan.stages for t in s.terms
                if t.evidence_class != d.TERM_PHYSICAL]
    if declared:
        raise NotPhysical("the plan fills " + ", ".join(declared) + " with declared figures; profile every stage "
                          "host and link of this fleet with this checkpoint (`fornax profile`)")
    index = {name: i for i, name in enumerate(node_names)}
    workers = tuple(index[s.node] for s in plan.stages)
    return Split(workers, tuple(hosts[w] for w in workers), tuple((s.layer_start, s.layer_end) for s in plan.stages))


def even_split(num_layers: int, hosts: Sequence[str]) -> Split:
    n = len(hosts)
    cuts = [round(i * num_layers / n) for i in range(n + 1)]
    return Split(tuple(range(n)), tuple(hosts), tuple((cuts[i], cuts[i + 1]) for i in range(n)))


def every_split(num_layers: int, hosts: Sequence[str]) -> list[Split]:
    """Every placement of `num_layers` layers on all of `hosts`, each host one stage of at least one
    layer: every host order times every set of cuts (fleet order first, then earlier cuts first)."""
    n = len(hosts)
    out = []
    for order in itertools.permutations(range(n)):
        for inner in itertools.combinations(range(1, num_layers), n - 1):
            cuts = (0, *inner, num_layers)
            out.append(Split(order, tuple(hosts[w] for w in order),
                             tuple((cuts[i], cuts[i + 1]) for i in range(n))))
    return out


def split_label(split: Split) -> str:
    return " > ".join(f"{h}[{a}:{b}]" for h, (a, b) in zip(split.hosts, split.ranges, strict=True))


def layers_per_host(split: Split) -> dict[str, int]:
    return {h: b - a for h, (a, b) in zip(split.hosts, split.ranges, strict=True)}


def saturation(concurrency: int, rows_per_microbatch: Sequence[float], stages: int) -> dict[str, float | bool]:
    """Microbatches the load keeps in flight (concurrency over measured rows per microbatch): fewer
    than the stages and some stage must idle while another works, whatever the split."""
    rows = max(max(rows_per_microbatch, default=1.0), 1.0)
    in_flight = concurrency / rows
    return {"microbatches_in_flight": in_flight, "stages": stages, "saturated": in_flight >= stages}


def bottleneck_prediction_error(predicted_s: list[float], measured_s: list[float]) -> float:
    """|measured bottleneck stage time - predicted| / measured, bottlenecks compared as such."""
    measured = max(measured_s)
    if measured <= 0:
        raise ValueError("no stage time was measured")
    return abs(measured - max(predicted_s)) / measured


def tok_s_ratio(calibrated_tok_s: float, even_tok_s: float) -> float:
    if even_tok_s <= 0:
        raise ValueError("the even split served no tokens")
    return calibrated_tok_s / even_tok_s
