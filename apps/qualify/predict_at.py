"""The installed plan's predictions evaluated at the rows per microbatch, and the past per row,
qualify actually measured.

A plan predicts each stage's decode microbatch at its target rows (concurrency over the
microbatches it keeps in flight); the gate's decode window runs the rows its prompts give.
Comparing the two compares different work. So the gate re-evaluates the same placement with the
planner's own cost model (`services.planner.planner.predict_placement`), on the same profile
records the plan rests on, at each stage's measured rows per microbatch. The planner's tables
take whole rows: a fractional measured figure blends the predictions at the rows either side
linearly (each term is linear in rows between the profile's measured batches).

Decode attention reads rows x past, and a plan predicts at its decode context (by default the
configured context, the longest past a sequence reaches); the gate's decode window runs at the
past its prompts and outputs give. So the re-prediction also takes the measured mean past per
decode row (`past_tokens`), which the planner interpolates over the profile's measured pasts.

The gate measures a stage's `wire` as the next hop's round trip less the next stage's own queue
and execute time: the boundary frame out and the answer back. The planner's wire term is the
frame's one-way time (half the measured 32 KiB round trip plus its bytes over the measured
throughput), what a pipelined link is busy for. So the gate's wire prediction adds the answer's
way back: the other half of the same link record's measured round trip (`answer_halves`).

Everything here is a prediction; the rows it is evaluated at are physical (measured).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from apps.qualify.gate import PredictedStage
from libs.common.kinds import DType
from services.planner import domain as d
from services.planner.inventory import Inventory, Target
from services.planner.model import ModelDescription
from services.planner.planner import predict_placement
from services.planner.profiles import ProfileBook

ROWS_BASIS = "measured rows"  # Calibration.rows_basis when predictions follow the measurement (wire: round trip)


def blend(low: d.StageCost, high: d.StageCost, fraction: float) -> dict[str, float]:
    """Per-phase seconds between two row counts' predictions, `fraction` of the way to `high`."""
    def mix(a: float, b: float) -> float:
        return a + (b - a) * fraction
    return {"compute": mix(low.compute_s, high.compute_s), "pack": mix(low.pack_s, high.pack_s),
            "wire": mix(low.wire_s, high.wire_s), "unpack": mix(low.unpack_s, high.unpack_s),
            "queue": mix(low.queue_s, high.queue_s), "exposed_wait": mix(low.exposed_wait_s, high.exposed_wait_s)}


def row_bounds(rows: float) -> tuple[int, int, float]:
    """(whole rows below, whole rows above, fraction between) for a measured mean; at least 1 row."""
    rows = max(rows, 1.0)
    low = math.floor(rows)
    return low, low + 1, rows - low


PlanAt = Callable[[int], d.Plan]


def answer_halves(book: ProfileBook, hosts: Sequence[str]) -> list[float]:
    """Per stage in route order: half the measured round trip of the link to the next stage's host
    (the answer's way back); 0 for the last stage, which sends nothing on."""
    out = []
    for here, there in zip(hosts, [*hosts[1:], None], strict=True):
        record = book.link_record(here, there) if there is not None else None
        out.append(record.profile.rtt_32kib_s.median / 2 if record is not None else 0.0)
    return out


def predicted_at_rows(installed: Sequence[PredictedStage], rows: Sequence[float], plan_at: PlanAt,
                      answers_s: Sequence[float] = (), past: float = 0.0) -> list[PredictedStage]:
    """Each installed stage's terms re-predicted at its own measured rows per microbatch; the
    stage's `answers_s` entry (if given) is added to its wire term (the round trip qualify measures).
    `past`: the tokens of past per row `plan_at` predicts at, stated on each stage (0: the plan's)."""
    if len(rows) != len(installed):
        raise ValueError(f"{len(rows)} measured row figures for {len(installed)} stages")
    if answers_s and len(answers_s) != len(installed):
        raise ValueError(f"{len(answers_s)} answer times for {len(installed)} stages")
    cache: dict[int, d.Plan] = {}

    def plan(r: int) -> d.Plan:
        if r not in cache:
            cache[r] = plan_at(r)
        return cache[r]

    out: list[PredictedStage] = []
    for stage, measured_rows in zip(installed, rows, strict=True):
        low, high, fraction = row_bounds(measured_rows)
        a = next(s for s in plan(low).stages if s.stage_index == stage.stage_index)
        b = next(s for s in plan(high).stages if s.stage_index == stage.stage_index)
        seconds = blend(a.decode, b.decode, fraction)
        if answers_s:
            seconds["wire"] += answers_s[len(out)]
        out.append(replace(stage, seconds=seconds, rows=max(measured_rows, 1.0), past=past))
    return out


def planner_at(model: ModelDescription, inventory: Inventory, book: ProfileBook,
               stages: Sequence[tuple[str, int, int]], now_ns: int, past_tokens: float = 0.0,
               boundary_dtype: DType = DType.FP32) -> PlanAt:
    """The planner's prediction of this placement (its hops of `boundary_dtype`) at `rows` rows
    and `past_tokens` tokens of past per row (rounded to a whole token; 0: the target's default)."""
    target = Target(min_stages=len(stages), max_stages=len(stages), boundary_dtype=boundary_dtype,
                    decode_context_tokens=max(0, round(past_tokens)))

    def at(rows: int) -> d.Plan:
        return predict_placement(model, inventory, replace(target, decode_microbatch_rows=rows), book, stages, now_ns)
    return at
