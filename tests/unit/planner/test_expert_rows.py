"""A MoE layer's decode time between measured batch sizes follows its routed experts: pure, nothing timed."""

from __future__ import annotations

import numpy as np
import pytest

from libs.profiles.schema import Figure
from services.planner.expert_rows import expected_distinct, expert_shaped, nonnegative_fit
from services.planner.measured import interpolate

D = expected_distinct(16, 4)  # the `small` preset's routing: 16 experts, 4 per token


def table(values: dict[int, float]) -> dict[int, Figure]:
    return {b: Figure(v, v, v, 3, "s") for b, v in values.items()}


def shaped(values: dict[int, float], rows: float) -> float:
    return expert_shaped(table(values), rows, D, interpolate)


def test_distinct_experts_grow_fast_then_saturate():
    assert D(1) == pytest.approx(4.0)
    assert D(8 / 3) == pytest.approx(16 * (1 - 0.75 ** (8 / 3)))
    assert D(8) == pytest.approx(14.39, abs=0.01) and D(32) == pytest.approx(16.0, abs=0.01)
    with pytest.raises(ValueError, match="top_k"):
        expected_distinct(8, 9)


def test_a_layer_whose_time_is_fixed_per_row_and_per_expert_is_predicted_exactly_between_its_batches():
    def cost(r: float) -> float:  # 2 ms fixed, 0.3 ms a row, 1 ms an expert read
        return 2e-3 + 0.3e-3 * r + 1e-3 * D(r)

    measured = {b: cost(b) for b in (1, 8, 32)}
    rows = 8 / 3
    assert shaped(measured, rows) == pytest.approx(cost(rows))
    # A straight line between 1 and 8 rows reads it low: the distinct experts rise fastest at few rows.
    assert interpolate(table(measured), rows) < 0.85 * cost(rows)
    assert shaped(measured, 20) == pytest.approx(cost(20))


def test_every_measured_point_is_reproduced_and_outside_them_the_straight_end_segments_stand():
    measured = {1: 4.1e-3, 8: 24.8e-3, 32: 50.1e-3}
    for b, v in measured.items():
        assert shaped(measured, b) == pytest.approx(v)
    assert shaped(measured, 0.5) == pytest.approx(interpolate(table(measured), 0.5))
    assert shaped(measured, 48) == pytest.approx(interpolate(table(measured), 48))


def test_a_noisy_table_the_shape_cannot_fit_with_positive_costs_stays_between_its_neighbours():
    # Convex in the experts (the 32-row point far above): an exact fit needs a negative expert cost.
    measured = {1: 4.6e-3, 8: 43.3e-3, 32: 299.7e-3}
    for rows in (2, 8 / 3, 5):
        value = shaped(measured, rows)
        assert measured[1] < value < measured[8]
    assert measured[8] < shaped(measured, 16) < measured[32]


def test_two_measured_batches_give_the_straight_line():
    measured = {1: 1e-3, 8: 2e-3}
    assert shaped(measured, 4) == pytest.approx(interpolate(table(measured), 4))


def test_the_nonnegative_fit_drops_a_column_a_negative_coefficient_would_need():
    x = np.array([1.0, 2.0, 3.0])
    design = np.stack([np.ones(3), x], axis=1)
    assert nonnegative_fit(design, 2 * x) == pytest.approx([0.0, 2.0])
    falling = np.array([3.0, 2.0, 1.0])
    assert nonnegative_fit(design, falling) == pytest.approx([2.0, 0.0])  # the mean, no negative slope
