"""Route calibrations fed back into the planner: recorded profiles and calibrations, nothing timed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from libs.profiles.schema import GATE, SERVING_WINDOW, Figure, RouteStage, StageCalibration, route_key
from services.planner.explain import explain_lines
from services.planner.inventory import Target
from services.planner.planner import plan, predict_placement
from services.planner.profiles import book_from_records
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
PLACEMENT = [("a", 0, 2), ("b", 2, 4)]
INVENTORY = full_mesh(node("a"), node("b"))


def _profiles():
    return [stage_record(stage_profile("a", SNAP)), stage_record(stage_profile("b", SNAP)),
            link_record(link_profile("a", "b"))]


def _calibration(*, compute_a: float, wire_a: float, evidence=("stage-a", "stage-b", "link-a-b"), purpose=GATE,
                 tolerance: float | None = None, record_id: str = "cal-1", age_s: int = 60,
                 predicted_compute: float = 0.002):
    key = route_key(SNAP, [RouteStage("a", "max", 0, 2), RouteStage("b", "max", 2, 4)])

    def stage(i, host, a, b, compute, wire):
        predicted = {"compute": predicted_compute if host == "a" else 0.002, "pack": 0.0,
                     "wire": 0.0001 if wire else 0.0, "unpack": 0.0}
        measured = {k: Figure(v, v * 0.9, v * 1.1, 3, "s") for k, v in
                    {"compute": compute, "pack": 0.0, "wire": wire, "unpack": 0.0}.items()}
        total = Figure(compute + wire, compute, compute, 3, "s")
        return StageCalibration(i, host, a, b, sum(predicted.values()), total, 4.0, 64.0, predicted, measured)
    stages = (stage(0, "a", 0, 2, compute_a, wire_a), stage(1, "b", 2, 4, 0.002, 0.0))
    c = replace(calibration(key), evidence_ids=evidence, stages=stages, purpose=purpose,
                measured_unix_ns=NOW - age_s * 10**9)
    if tolerance is not None:
        c = replace(c, tolerance=tolerance)
    return calibration_record(c, record_id)


def _predict(records):
    return predict_placement(MODEL, INVENTORY, TWO, book_from_records(records), PLACEMENT, now_unix_ns=NOW)


def _term(p, stage, name):
    return next(t for t in p.stages[stage].terms if t.term == name)


def test_a_route_that_measured_compute_twice_the_profile_doubles_the_hosts_compute_and_says_so():
    base, fed = _predict(_profiles()), _predict([*_profiles(), _calibration(compute_a=0.004, wire_a=0.0001)])
    assert _term(fed, 0, "compute").value == pytest.approx(2 * _term(base, 0, "compute").value)
    assert _term(fed, 0, "step").value == pytest.approx(2 * _term(base, 0, "step").value)
    assert _term(fed, 1, "compute").value == pytest.approx(_term(base, 1, "compute").value)  # b measured as predicted
    assert _term(fed, 0, "compute").basis == "route calibration cal-1"
    assert _term(base, 0, "compute").basis == "layer profiles"
    assert "cal-1" in _term(fed, 0, "compute").record_ids and "cal-1" in fed.evidence_ids
    text = "\n".join(explain_lines(fed))
    assert "prediction from route calibration cal-1" in text and "factor 2 applied" in text
    assert "prediction from layer profiles" in text  # the terms it did not scale


def test_a_wire_term_follows_the_routes_measured_wire():
    base, fed = _predict(_profiles()), _predict([*_profiles(), _calibration(compute_a=0.002, wire_a=0.0007)])
    assert _term(fed, 0, "wire").value == pytest.approx(7 * _term(base, 0, "wire").value)
    assert _term(fed, 0, "wire").basis == "route calibration cal-1"


def test_a_profiles_serving_window_feeds_back_though_it_is_no_verdict_and_never_qualifies_a_route():
    window = _calibration(compute_a=0.004, wire_a=0.0001, purpose=SERVING_WINDOW, tolerance=0.0)
    fed = _predict([*_profiles(), window])
    assert _term(fed, 0, "compute").value == pytest.approx(2 * _term(_predict(_profiles()), 0, "compute").value)
    assert "serving window cal-1" in _term(fed, 0, "compute").note
    book = book_from_records([*_profiles(), window])
    key = route_key(SNAP, [RouteStage("a", "max", 0, 2), RouteStage("b", "max", 2, 4)])
    assert book.calibration_record(key) is None  # deployment still needs a gate


def test_a_failed_gate_feeds_nothing_back():
    failed = _calibration(compute_a=0.004, wire_a=0.0001, tolerance=0.0)
    fed = _predict([*_profiles(), failed])
    assert _term(fed, 0, "compute").value == pytest.approx(_term(_predict(_profiles()), 0, "compute").value)


def test_a_gate_that_predicted_from_a_window_keeps_the_windows_level():
    window = _calibration(compute_a=0.004, wire_a=0.0001, purpose=SERVING_WINDOW, record_id="window-1", age_s=120)
    # The gate predicted from the window (2x: 4 ms) and measured 4.4 ms: 1.1x over what it predicted.
    gate = _calibration(compute_a=0.0044, wire_a=0.0001, predicted_compute=0.004,
                        evidence=("stage-a", "stage-b", "link-a-b", "window-1"))
    fed = _predict([*_profiles(), window, gate])
    assert _term(fed, 0, "compute").value == pytest.approx(2.2 * _term(_predict(_profiles()), 0, "compute").value)
    assert "times the 2 its prediction carried" in _term(fed, 0, "compute").note
    unrelated = _calibration(compute_a=0.0044, wire_a=0.0001, predicted_compute=0.004)  # did not rest on it
    fed = _predict([*_profiles(), window, unrelated])
    assert _term(fed, 0, "compute").value == pytest.approx(1.1 * _term(_predict(_profiles()), 0, "compute").value)


def test_a_calibration_of_other_profile_records_does_not_scale_a_newer_profile():
    stale = _calibration(compute_a=0.004, wire_a=0.0007, evidence=("stage-a-old", "link-old"))
    fed = _predict([*_profiles(), stale])
    assert _term(fed, 0, "compute").value == pytest.approx(_term(_predict(_profiles()), 0, "compute").value)
    assert all(t.basis != "route calibration cal-1" for s in fed.stages for t in s.terms)


def test_the_next_plan_moves_layers_off_a_host_the_route_measured_slow():
    fresh = plan(MODEL, INVENTORY, TWO, profiles=book_from_records(_profiles()), now_unix_ns=NOW).plan
    fed = plan(MODEL, INVENTORY, TWO, profiles=book_from_records([*_profiles(), _calibration(compute_a=0.008,
                                                                                            wire_a=0.0001)]),
               now_unix_ns=NOW).plan
    layers = {s.node: s.layer_end - s.layer_start for s in fed.stages}
    assert {s.node: s.layer_end - s.layer_start for s in fresh.stages} == {"a": 2, "b": 2}
    assert layers["a"] < layers["b"]
