"""The stability rule on twelve recorded cycles of issue 31's procedure (`data/
two_unlike_hosts_cycles.json`: each cycle's `fornax profile` records and the serving window it
ended with, from empty state directories on one AMD EPYC box). The first plan of a cycle rests on
its profiles alone, as `fornax profile`'s serving window plans it; the gate's plan adds that
window. Nothing is timed here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apps.fleet.plan_inventory import fleet_target, inventory_from_fleet
from apps.fleet.spec import load_fleet_spec
from services.planner import measured, stability
from services.planner.model import describe_config
from services.planner.planner import _measured_problem, plan_with_book
from services.planner.profiles import ProfileRecordInput, book_from_records
from services.planner.search import evaluate

ROOT = Path(__file__).resolve().parents[3]
RECORDED = json.loads((Path(__file__).parent / "data" / "two_unlike_hosts_cycles.json").read_text())
SPEC = load_fleet_spec(str(ROOT / "fleets" / "two-unlike-hosts.yaml"))
INVENTORY = inventory_from_fleet(SPEC).inventory
MODEL = describe_config(RECORDED["checkpoint_config"], snapshot=RECORDED["model_snapshot"])
UP = fleet_target(SPEC, context_tokens=2048, concurrency=32, stages=None, mode="exploratory")
ALPHA_FIRST, BETA_FIRST = ((0, 1), (0, 3, 4)), ((1, 0), (0, 1, 4))


def _profiles(cycle: int) -> list[dict]:
    return [r for r in RECORDED["cycles"][cycle - 1] if r["record_type"] == "measurement"]


def _with_window(cycle: int) -> list[dict]:
    return RECORDED["cycles"][cycle - 1]


def _book(records: list[dict]):
    return book_from_records(ProfileRecordInput(r["record_id"], r["record_type"], r["blob"].encode(),
                                                tuple(tuple(kv) for kv in r["labels"]), r["evidence_class"])
                             for r in records)


def _now(records: list[dict]) -> int:
    return max(json.loads(r["blob"])["measured_unix_ns"] for r in records) + 60 * 10**9


def _plan(records: list[dict]):
    return plan_with_book(MODEL, INVENTORY, UP, None, _book(records), _now(records)).plan


def _route(plan) -> str:
    return plan.route_key.split("|", 1)[1]


def _raw_band(records: list[dict], placement) -> tuple[float, float, float]:
    """(low, median, high) through the cost model, with no correction of the band."""
    book, now = _book(records), _now(records)
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
    assert _route(plan) == "alpha:max[0:3]>beta:numpy[3:4]"
    assert plan.choice.startswith("chose the simplest")
    assert "the fastest on the medians, beta[0:1] > alpha[1:4] (bottleneck 19.4 ms, band 19.4..28.21 ms)" \
        in plan.choice


def test_an_outright_winner_names_the_next_fastest_and_the_side_of_the_spread_that_keeps_it_out():
    """Cycle 11: beta first wins on its profiles; alpha first's lowest-run prediction lies above
    beta first's median, which the explanation states with both bands."""
    plan = _plan(_profiles(11))
    assert _route(plan) == "beta:numpy[0:1]>alpha:max[1:4]"
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
    if _route(plan) != "alpha:max[0:3]>beta:numpy[3:4]":
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
    assert _route(gate) == _window_route(cycle)
    assert gate.choice.startswith(("kept the placement chosen before", "fastest on the medians"))
    if "within the measured spread" in gate.choice:
        assert gate.choice.startswith("kept the placement chosen before")
