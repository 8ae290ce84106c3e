"""The placement benchmark's pure core: the calibrated split is the planner's profile-based plan,
mapped onto the fleet's workers, and refused when any term rests on a declared figure."""

from __future__ import annotations

import pytest

from apps.bench.placement_core import (
    NotPhysical,
    bottleneck_prediction_error,
    calibrated_split,
    even_split,
    every_split,
    layers_per_host,
    saturation,
    split_label,
    tok_s_ratio,
)
from services.planner.inventory import Target
from services.planner.planner import plan
from services.planner.profiles import book_from_records
from tests.unit.planner.factories import full_mesh, node, tiny_model
from tests.unit.planner.profile_factories import NOW, link_profile, link_record, stage_profile, stage_record

MODEL = tiny_model(layers=12)
SNAP = MODEL.model_snapshot
TWO = Target(context_tokens=512, concurrency=8, min_stages=2, max_stages=2, prefill_tokens=16)
NODES = ("stage_worker_0", "stage_worker_1")
HOSTS = ("alpha", "beta")


def _plan(alpha_s: float, beta_s: float, *, beta_profiled: bool = True):
    recs = [stage_record(stage_profile(NODES[0], SNAP, layer_s=alpha_s))]
    if beta_profiled:
        recs.append(stage_record(stage_profile(NODES[1], SNAP, layer_s=beta_s)))
    recs.append(link_record(link_profile(*NODES)))
    inventory = full_mesh(*(node(n) for n in NODES))
    return plan(MODEL, inventory, TWO, profiles=book_from_records(recs), now_unix_ns=NOW).plan


def test_the_calibrated_split_is_the_plans_placement_on_the_fleets_workers():
    split = calibrated_split(_plan(1e-3, 3e-3), NODES, HOSTS)
    per_host = layers_per_host(split)
    assert sum(per_host.values()) == 12 and per_host["beta"] < per_host["alpha"]
    assert split.ranges[0][0] == 0 and split.ranges[-1][1] == 12
    assert split.ranges[0][1] == split.ranges[1][0]
    assert [HOSTS[w] for w in split.workers] == list(split.hosts)


def test_a_plan_with_a_declared_term_is_refused_naming_it():
    with pytest.raises(NotPhysical, match="declared figures"):
        calibrated_split(_plan(1e-3, 1e-3, beta_profiled=False), NODES, HOSTS)


def test_even_split_covers_the_model_in_fleet_order():
    split = even_split(6, HOSTS)
    assert split.ranges == ((0, 3), (3, 6)) and split.workers == (0, 1) and split.hosts == HOSTS


def test_saturation_counts_microbatches_in_flight_against_the_stages():
    assert saturation(8, [4.0, 4.0], 2) == {"microbatches_in_flight": 2.0, "stages": 2, "saturated": True}
    assert saturation(8, [8.0, 7.5], 2)["saturated"] is False


def test_errors_and_ratios():
    assert bottleneck_prediction_error([0.01, 0.02], [0.015, 0.025]) == pytest.approx(0.2)
    assert tok_s_ratio(30.0, 20.0) == 1.5
    with pytest.raises(ValueError):
        tok_s_ratio(1.0, 0.0)
    with pytest.raises(ValueError):
        bottleneck_prediction_error([0.01], [0.0])


def test_the_bench_load_plans_at_its_mean_past_per_decode_row():
    from apps.bench.placement import load_mean_past

    # 16 prompt tokens, 24 output tokens: rows at past 16..38 make output tokens 1..23, mean 27.
    assert load_mean_past(16, 24) == 27
    assert load_mean_past(8, 2) == 8  # one decode row, at the prompt's end


def test_every_split_places_every_layer_once_on_every_host_in_both_orders():
    splits = every_split(4, HOSTS)
    assert [split_label(s) for s in splits] == [
        "alpha[0:1] > beta[1:4]", "alpha[0:2] > beta[2:4]", "alpha[0:3] > beta[3:4]",
        "beta[0:1] > alpha[1:4]", "beta[0:2] > alpha[2:4]", "beta[0:3] > alpha[3:4]"]
    assert all(s.hosts == tuple(HOSTS[w] for w in s.workers) for s in splits)
    assert even_split(4, HOSTS) in splits


def test_every_split_of_three_hosts_counts_orders_times_cuts():
    splits = every_split(5, ("a", "b", "c"))
    assert len(splits) == 6 * 6  # 3! host orders x C(4, 2) cut pairs
    assert all(s.ranges[0][0] == 0 and s.ranges[-1][1] == 5 and all(b > a for a, b in s.ranges) for s in splits)


def test_every_split_lines_name_each_placement_against_the_even_split():
    from apps.bench.placement import every_split_lines

    row = {"placement": "alpha[0:1] > beta[1:4]", "output_tokens_per_s": 556.1, "runs_tok_s": [556.1, 502.0],
           "vs_even_tok_s": 1.38, "measured_bottleneck_s": 2.27e-3, "predicted_bottleneck_s": 3.59e-3,
           "is_even": False, "is_calibrated": True}
    assert every_split_lines({}) == []
    (line,) = every_split_lines({"every_split": [row]})
    assert "alpha[0:1] > beta[1:4]" in line and "556.1 tok/s (runs 556 502)" in line and "1.38x even" in line
    assert line.endswith("calibrated")
