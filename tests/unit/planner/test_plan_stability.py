"""A plan that does not flip on profile noise: recorded profiles, nothing timed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from libs.profiles.schema import Figure, RouteStage, StageCalibration, route_key
from services.planner.explain import explain_lines
from services.planner.inventory import Target
from services.planner.planner import DeploymentRefused, plan
from services.planner.profiles import book_from_records
from services.planner.stability import HIGH, LOW, bounded_book
from tests.unit.planner.factories import full_mesh, node, tiny_model
from tests.unit.planner.profile_factories import (
    NOW,
    calibration,
    calibration_record,
    link_profile,
    link_record,
    stage_profile,
    stage_record,
)

MODEL = tiny_model(layers=4)
SNAP = MODEL.model_snapshot
TWO = Target(context_tokens=512, concurrency=4, min_stages=2, max_stages=2, prefill_tokens=64)


def _spread(profile, scale: float, spread: float):
    """Every figure of `profile` times `scale`, its runs `spread` either side of the median."""
    def fig(f: Figure) -> Figure:
        m = f.median * scale
        return Figure(m, m * (1 - spread), m * (1 + spread), 3, f.unit)

    def table(t):
        return {k: fig(f) for k, f in t.items()}

    kinds = tuple(replace(k, prefill_s_per_token=table(k.prefill_s_per_token),
                          decode_s_per_microbatch=table(k.decode_s_per_microbatch)) for k in profile.kinds)
    return replace(profile, kinds=kinds, step_s_per_microbatch=table(profile.step_s_per_microbatch))


def _records(a_scale: float, b_scale: float, spread: float, extra=()):
    a = _spread(stage_profile("a", SNAP, layer_s=1e-3), a_scale, spread)
    b = _spread(stage_profile("b", SNAP, backend="numpy", layer_s=1e-3), b_scale, spread)
    return [stage_record(a), stage_record(b), link_record(link_profile("a", "b")), *extra]


def _plan(recs):
    inventory = full_mesh(node("a"), replace(node("b"), backend="numpy"))
    return plan(MODEL, inventory, TWO, profiles=book_from_records(recs), now_unix_ns=NOW).plan


def _placement(p):
    return tuple((s.node, s.layer_start, s.layer_end) for s in p.stages)


# Three profiles of the same two hosts (b about 1.5 times slower per layer, near where a 2:2
# and a 3:1 split tie), each within the runs' own 15% spread of the others
# (host b's median wanders as a noisy profile does).
NOISY = ((1.00, 1.40), (1.00, 1.60), (0.95, 1.50))


def test_three_noisy_profiles_of_one_fleet_give_one_placement():
    plans = [_plan(_records(a, b, 0.15)) for a, b in NOISY]
    assert len({_placement(p) for p in plans}) == 1
    assert all("simplest" in p.choice and "within the measured spread" in p.choice for p in plans)


def test_the_same_noise_without_spread_flips_the_placement():
    """What the stability rule prevents: with runs that agree exactly, every difference counts."""
    plans = [_plan(_records(a, b, 0.0)) for a, b in NOISY]
    assert len({_placement(p) for p in plans}) > 1


def test_a_placement_faster_beyond_the_spread_still_wins():
    p = _plan(_records(1.0, 3.0, 0.05))  # b is three times slower, runs within 5%
    assert p.choice.startswith("fastest")
    layers = {s.node: s.layer_end - s.layer_start for s in p.stages}
    assert layers["a"] > layers["b"]


def _previous(stages: list[tuple[str, str, int, int]], passed: bool = True):
    key = route_key(SNAP, [RouteStage(h, backend, a, b) for h, backend, a, b in stages])
    cal = replace(calibration(key, passed=passed), stages=tuple(
        StageCalibration(i, h, a, b, 0.01, Figure(0.01, 0.01, 0.01, 3, "s")) for i, (h, _, a, b) in enumerate(stages)))
    return calibration_record(cal)


def test_the_previous_placement_is_kept_when_the_spread_cannot_tell_it_from_the_fastest():
    recs = _records(1.00, 1.10, 0.15)
    fresh = _placement(_plan(recs))
    other = [("b", "numpy", 0, 2), ("a", "max", 2, 4)]
    assert fresh != tuple((h, a, b) for h, _, a, b in other)
    kept = _plan([*recs, _previous(other)])
    assert _placement(kept) == tuple((h, a, b) for h, _, a, b in other)
    assert "kept the placement chosen before" in kept.choice
    assert any("kept the placement chosen before" in line for line in explain_lines(kept))


def test_a_previous_placement_outside_the_spread_is_dropped():
    recs = _records(1.0, 3.0, 0.05)
    p = _plan([*recs, _previous([("b", "numpy", 0, 3), ("a", "max", 3, 4)])])
    assert p.choice.startswith("fastest")
    assert _placement(p) != (("b", 0, 3), ("a", 3, 4))


def test_a_previous_placement_on_another_backend_is_not_the_same_placement():
    recs = _records(1.00, 1.10, 0.15)
    p = _plan([*recs, _previous([("b", "max", 0, 2), ("a", "max", 2, 4)])])
    assert "kept" not in p.choice


def test_bounded_books_put_times_at_their_runs_and_rates_the_other_way():
    book = book_from_records(_records(1.0, 1.0, 0.1))
    low, high = bounded_book(book, LOW), bounded_book(book, HIGH)
    assert low.stages[0].profile.kind("dense").decode_s_per_microbatch[1].median == \
        book.stages[0].profile.kind("dense").decode_s_per_microbatch[1].low
    assert high.stages[0].profile.kind("dense").decode_s_per_microbatch[1].median == \
        book.stages[0].profile.kind("dense").decode_s_per_microbatch[1].high
    rate = book.links[0].profile.throughput_bytes_per_s
    assert low.links[0].profile.throughput_bytes_per_s.median == rate.high
    assert high.links[0].profile.throughput_bytes_per_s.median == rate.low


def test_a_deployment_installs_the_qualified_placement_and_names_the_one_predicted_faster():
    recs = _records(1.0, 3.0, 0.05)  # the medians clearly favour more layers on a
    qualified = [("a", "max", 0, 2), ("b", "numpy", 2, 4)]
    assert _placement(_plan(recs)) != tuple((h, a, b) for h, _, a, b in qualified)
    deployment = replace(TWO, mode="deployment")
    inventory = full_mesh(node("a"), replace(node("b"), backend="numpy"))
    p = plan(MODEL, inventory, deployment, profiles=book_from_records([*recs, _previous(qualified)]),
             now_unix_ns=NOW).plan
    assert _placement(p) == tuple((h, a, b) for h, _, a, b in qualified)
    assert p.choice.startswith("the qualified placement: a[0:2] > b[2:4]")
    assert "predicts a[0:3] > b[3:4]" in p.choice and "fornax qualify" in p.choice



def test_a_failed_calibration_is_not_a_qualified_placement():
    recs = _records(1.0, 3.0, 0.05)
    failed = [("a", "max", 0, 2), ("b", "numpy", 2, 4)]
    deployment = replace(TWO, mode="deployment")
    inventory = full_mesh(node("a"), replace(node("b"), backend="numpy"))
    with pytest.raises(DeploymentRefused) as refused:
        plan(MODEL, inventory, deployment, profiles=book_from_records([*recs, _previous(failed, passed=False)]),
             now_unix_ns=NOW)
    assert refused.value.reason == "MISSING_CALIBRATION"
