"""The stability rule on twelve recorded cycles of issue 31's procedure (`data/
two_unlike_hosts_cycles.json`: each cycle's `fornax profile` records and the serving window it
ended with, from empty state directories on one AMD EPYC box). The first plan of a cycle rests on
its profiles alone, as `fornax profile`'s serving window plans it; the gate's plan adds that
window. Nothing is timed here."""

from __future__ import annotations

import json

import pytest

from services.planner import measured, stability
from services.planner.planner import _measured_problem, plan_with_book
from services.planner.search import evaluate
from tests.unit.planner.recorded import INVENTORY, UP, book_of, planned_at, recorded, route_of

RECORDED, MODEL = recorded("two_unlike_hosts_cycles.json")
ALPHA_FIRST, BETA_FIRST = ((0, 1), (0, 3, 4)), ((1, 0), (0, 1, 4))


def _profiles(cycle: int) -> list[dict]:
    return [r for r in RECORDED["cycles"][cycle - 1] if r["record_type"] == "measurement"]


def _with_window(cycle: int) -> list[dict]:
    return RECORDED["cycles"][cycle - 1]


def _plan(records: list[dict]):
    return plan_with_book(MODEL, INVENTORY, UP, None, book_of(records), planned_at(records)).plan


def _raw_band(records: list[dict], placement) -> tuple[float, float, float]:
    """(low, median, high) through the cost model, with no correction of the band."""
    book, now = book_of(records), planned_at(records)
    return tuple(evaluate(_measured_problem(measured.build_measured(MODEL, INVENTORY, INVENTORY.nodes, UP, b, now),
                                            UP), *placement)
                 for b in (stability.bounded_book(book, stability.LOW), book,
                           stability.bounded_book(book, stability.HIGH)))


def test_a_fastest_placement_whose_lows_extrapolate_above_its_median_still_ties_with_itself():
    """Cycle 7: the lows put beta first above its own median (19.88 against 19.40 ms), so it
    did not tie with itself and won outright on noise; alpha first (21.05 ms, band
    17.80..32.63) lies within its spread, and the simpler one is planned."""
    low, median, _ = _raw_band(_profiles(7), BETA_FIRST)
    assert low > median
    plan = _plan(_profiles(7))
    assert route_of(plan) == "alpha:max[0:3]>beta:numpy[3:4]"
    assert plan.choice.startswith("chose the simplest")
    assert "the fastest on the medians, beta[0:1] > alpha[1:4] (bottleneck 19.4 ms, band 19.4..28.21 ms)" \
        in plan.choice


def test_an_outright_winner_names_the_next_fastest_and_the_side_of_the_spread_that_keeps_it_out():
    """Cycle 11: beta first wins on its profiles; alpha first's lowest-run prediction lies above
    beta first's median, which the explanation states with both bands."""
    plan = _plan(_profiles(11))
    assert route_of(plan) == "beta:numpy[0:1]>alpha:max[1:4]"
    low, _, _ = _raw_band(_profiles(11), ALPHA_FIRST)
    _, beta_median, _ = _raw_band(_profiles(11), BETA_FIRST)
    assert low > beta_median
    assert plan.choice.startswith("fastest on the medians: beta[0:1] > alpha[1:4] (bottleneck 19.28 ms")
    assert ("the next fastest, alpha[0:3] > beta[3:4] (bottleneck 31.69 ms, band 24.44..66.67 ms), is slower by "
            "more than the measured spread: even its lowest-run prediction lies above this one's median") in plan.choice


@pytest.mark.parametrize("cycle", range(1, 13))
def test_every_cycles_first_plan_is_the_common_placement_or_says_why_not(cycle):
    """The third done-when item of issue 31 on the recorded cycles: the same placement, or an
    explanation that the other one is predicted faster by more than the measured spread."""
    plan = _plan(_profiles(cycle))
    if route_of(plan) != "alpha:max[0:3]>beta:numpy[3:4]":
        assert "the next fastest, alpha[0:3] > beta[3:4]" in plan.choice
        assert "is slower by more than the measured spread" in plan.choice


def _window_route(cycle: int) -> str:
    window = next(r for r in _with_window(cycle) if r["record_type"] == "calibration")
    return dict(map(tuple, window["labels"]))["route_key"].split("|", 1)[1]


@pytest.mark.parametrize("cycle", range(1, 13))
def test_the_gates_plan_keeps_the_placement_its_serving_window_measured(cycle):
    """The gate's plan rests on the window too: it plans the placement the window measured,
    kept as the placement chosen before where the window's wider spread leaves a tie, or
    fastest outright."""
    gate = _plan(_with_window(cycle))
    assert route_of(gate) == _window_route(cycle)
    assert gate.choice.startswith(("kept the placement chosen before", "fastest on the medians"))
    if "within the measured spread" in gate.choice:
        assert gate.choice.startswith("kept the placement chosen before")


INTERLEAVED, INTERLEAVED_MODEL = recorded("two_unlike_hosts_interleaved.json")


@pytest.mark.parametrize("cycle", range(3))
def test_three_fresh_profiles_on_the_sustained_clock_with_round_robin_runs_give_one_placement(cycle):
    """The third done-when item of issue 31 itself: three cycles from empty state directories
    after the profile's figures moved to the sustained clock and round-robin runs; the serving
    window's plan and the gate's plan (which adds the window) are the same placement each time."""
    records = INTERLEAVED["cycles"][cycle]
    profiles = [r for r in records if r["record_type"] == "measurement"]
    assert {json.loads(r["blob"]).get("timing") for r in profiles if "stage" in dict(map(tuple, r["labels"]))
            .get("profile", "")} == {"sustained"}
    for book_records in (profiles, records):
        plan = plan_with_book(INTERLEAVED_MODEL, INVENTORY, UP, None, book_of(book_records),
                              planned_at(book_records)).plan
        assert route_of(plan) == "alpha:max[0:3]>beta:numpy[3:4]", plan.choice
