"""The installed plan's predictions evaluated at the rows per microbatch qualify actually measured.

A plan predicts each stage's decode microbatch at its target rows (concurrency over the
microbatches it keeps in flight); the gate's decode window runs the rows its prompts give.
Comparing the two compares different work. So the gate re-evaluates the same placement with the
planner's own cost model (`services.planner.planner.predict_placement`), on the same profile
records the plan rests on, at each stage's measured rows per microbatch. The planner's tables
take whole rows: a fractional measured figure blends the predictions at the rows either side
linearly (each term is linear in rows between the profile's measured batches).

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

ROWS_BASIS = "measured rows"  # what Calibration.rows_basis says when predictions follow the measurement


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


def predicted_at_rows(installed: Sequence[PredictedStage], rows: Sequence[float],
                      plan_at: PlanAt) -> list[PredictedStage]:
    """Each installed stage's terms re-predicted at its own measured rows per microbatch."""
    if len(rows) != len(installed):
        raise ValueError(f"{len(rows)} measured row figures for {len(installed)} stages")
    cache: dict[int, d.Plan] = {}

    def plan(r: int) -> d.Plan:
        if r not in cache:
            cache[r] = plan_at(r)
        return cache[r]

    out = []
    for stage, measured_rows in zip(installed, rows, strict=True):
        low, high, fraction = row_bounds(measured_rows)
        a = next(s for s in plan(low).stages if s.stage_index == stage.stage_index)
        b = next(s for s in plan(high).stages if s.stage_index == stage.stage_index)
        out.append(replace(stage, seconds=blend(a.decode, b.decode, fraction), rows=max(measured_rows, 1.0)))
    return out


def planner_at(model: ModelDescription, inventory: Inventory, book: ProfileBook,
               stages: Sequence[tuple[str, int, int]], now_ns: int) -> PlanAt:
    """The planner's prediction of this placement (fp32 hops, as qualify runs it) at `rows` rows."""
    target = Target(min_stages=len(stages), max_stages=len(stages), boundary_dtype=DType.FP32)

    def at(rows: int) -> d.Plan:
        return predict_placement(model, inventory, replace(target, decode_microbatch_rows=rows), book, stages, now_ns)
    return at
