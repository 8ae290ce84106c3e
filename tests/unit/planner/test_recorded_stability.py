"""The stability rule on recorded profiles: four `fornax profile` runs of
fleets/two-unlike-hosts.yaml with the tiny checkpoint, each from an empty state directory
(`data/two_unlike_hosts_profiles.json`, measurements only), planned as `fornax up` and
`fornax bench placement` plan them. Nothing is timed here."""

from __future__ import annotations

from dataclasses import replace

import pytest

from apps.fleet.plan_inventory import fleet_target
from services.planner import measured, stability
from services.planner.planner import _measured_problem, plan_with_book
from services.planner.search import evaluate
from tests.unit.planner.recorded import INVENTORY, SPEC, UP, book_of, planned_at, recorded, route_of

RECORDED, MODEL = recorded("two_unlike_hosts_profiles.json")
# `fornax bench placement`'s defaults (concurrency 8, 16 prompt tokens, 24 output tokens: mean
# past 27 per decode row).
BENCH = replace(fleet_target(SPEC, context_tokens=2048, concurrency=8, stages=None, mode="exploratory"),
                prefill_tokens=16, decode_context_tokens=27)


def _plan(profile: list[dict], target):
    return plan_with_book(MODEL, INVENTORY, target, None, book_of(profile), planned_at(profile)).plan


@pytest.mark.parametrize(("target", "route"), [
    (UP, "alpha:max[0:3]>beta:numpy[3:4]"),
    (BENCH, "alpha:max[0:1]>beta:numpy[1:4]"),
])
def test_four_fresh_profiles_of_the_fleet_give_one_placement(target, route):
    plans = [_plan(profile, target) for profile in RECORDED["profiles"]]
    assert [route_of(p) for p in plans] == [route] * 4


def test_the_explanation_names_both_predictions_and_the_spread_when_the_simpler_one_is_kept():
    """Profile 1: beta[0:1] > alpha[1:4] is fastest on the medians, alpha[0:3] > beta[3:4]
    ties with it (each median within the other's band), and the simpler one is planned."""
    choice = _plan(RECORDED["profiles"][0], UP).choice
    assert choice.startswith("chose the simplest")
    assert "alpha[0:3] > beta[3:4] (bottleneck" in choice and "the fastest on the medians, beta[0:1] > alpha[1:4]" \
        in choice
    assert choice.count("band ") == 2 and "each median within the other's band" in choice


def _band(profile: list[dict], target, nodes, cuts) -> tuple[float, float, float]:
    book = book_of(profile)
    now = planned_at(profile)
    low, median, high = (evaluate(_measured_problem(measured.build_measured(
        MODEL, INVENTORY, INVENTORY.nodes, target, b, now), target), nodes, cuts)
        for b in (stability.bounded_book(book, stability.LOW), book, stability.bounded_book(book, stability.HIGH)))
    return low, median, high


def test_a_placement_whose_band_overlaps_only_through_a_slow_run_is_not_a_tie():
    """Profile 1: the even split's band overlaps the fastest's (a slow run stretched both high
    sides), yet its median is well outside the fastest's band: the measurements tell them apart."""
    profile = RECORDED["profiles"][0]
    fastest = _band(profile, UP, (1, 0), (0, 1, 4))
    even = _band(profile, UP, (0, 1), (0, 2, 4))
    assert even[0] <= fastest[2]  # the bands overlap
    assert even[1] > 1.5 * fastest[1]
    assert not stability.within_spread(even[1], (even[0], even[2]), fastest[1], (fastest[0], fastest[2]))


def test_ties_are_symmetric_in_the_medians_and_bands():
    assert stability.within_spread(1.1, (0.9, 1.3), 1.0, (0.95, 1.2))
    assert not stability.within_spread(1.3, (1.05, 1.6), 1.0, (0.95, 1.2))  # its median beyond the fastest's band
    assert not stability.within_spread(1.1, (1.02, 1.3), 1.0, (0.95, 1.2))  # the fastest's median below its band
    assert not stability.within_spread(float("inf"), (0.9, 1.3), 1.0, (0.95, 1.2))
