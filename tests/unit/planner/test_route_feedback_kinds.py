"""A route calibration scales the kinds of compute its stage ran: recorded profiles, nothing timed.

The model has 4 layers: layer 0 dense, layers 1-3 MoE; the first stage also runs the embeddings,
the last the head, and every stage its step overhead."""

from __future__ import annotations

from dataclasses import replace

import pytest

from libs.profiles.schema import GATE, SERVING_WINDOW, Figure, RouteStage, StageCalibration, route_key
from services.planner.explain import explain_lines
from services.planner.planner import predict_placement
from services.planner.profiles import book_from_records
from tests.unit.planner.profile_factories import NOW, calibration, calibration_record
from tests.unit.planner.test_route_feedback import INVENTORY, MODEL, SNAP, TWO, _profiles, _term

A_DENSE_FIRST = [("a", 0, 1), ("b", 1, 4)]  # a: embed, dense, step
A_MOE_LAST = [("b", 0, 2), ("a", 2, 4)]  # a: moe, head, step


def _measured(placement, a_factor: float, *, record_id: str, age_s: int = 60, purpose: str = GATE):
    """A calibration of `placement` that measured a's compute at `a_factor` times its 2 ms prediction."""
    key = route_key(SNAP, [RouteStage(h, "max", s, e) for h, s, e in placement])

    def stage(i, host, start, end):
        compute = 0.002 * (a_factor if host == "a" else 1.0)
        measured = {"compute": Figure(compute, compute * 0.95, compute * 1.05, 3, "s")}
        return StageCalibration(i, host, start, end, 0.002, Figure(compute, compute, compute, 3, "s"), 4.0, 64.0,
                                {"compute": 0.002}, measured)
    stages = tuple(stage(i, h, s, e) for i, (h, s, e) in enumerate(placement))
    c = replace(calibration(key), evidence_ids=("stage-a", "stage-b", "link-a-b"), stages=stages, purpose=purpose,
                measured_unix_ns=NOW - age_s * 10**9)
    return calibration_record(c, record_id)


def _moe_on_a(records):
    return predict_placement(MODEL, INVENTORY, TWO, book_from_records(records), A_MOE_LAST, now_unix_ns=NOW)


def test_a_dense_layer_that_ran_fast_does_not_lower_the_hosts_moe_layers():
    base = _moe_on_a(_profiles())
    fed = _moe_on_a([*_profiles(), _measured(A_DENSE_FIRST, 0.85, record_id="window-1", purpose=SERVING_WINDOW)])
    assert _term(fed, 1, "compute").value == pytest.approx(_term(base, 1, "compute").value)
    assert _term(fed, 1, "compute").basis == "layer profiles"
    # The step overhead ran in the measured stage, so it follows the route.
    assert _term(fed, 1, "step").value == pytest.approx(0.85 * _term(base, 1, "step").value)
    dense_first = predict_placement(MODEL, INVENTORY, TWO, book_from_records(
        [*_profiles(), _measured(A_DENSE_FIRST, 0.85, record_id="window-1")]), A_DENSE_FIRST, now_unix_ns=NOW)
    plain = predict_placement(MODEL, INVENTORY, TWO, book_from_records(_profiles()), A_DENSE_FIRST, now_unix_ns=NOW)
    assert _term(dense_first, 0, "compute").value == pytest.approx(0.85 * _term(plain, 0, "compute").value)


def test_a_route_slower_than_the_profile_on_other_kinds_carries_its_excess_over_and_says_so():
    base = _moe_on_a(_profiles())
    fed = _moe_on_a([*_profiles(), _measured(A_DENSE_FIRST, 1.5, record_id="window-1")])
    assert _term(fed, 1, "compute").value == pytest.approx(1.5 * _term(base, 1, "compute").value)
    note = _term(fed, 1, "compute").note
    assert "window-1" in note and "a stage of dense, embed, step only" in note and "to moe, head" in note
    assert "route calibration window-1" in "\n".join(explain_lines(fed))


def test_each_kind_takes_the_newest_calibration_that_ran_it():
    older = _measured(A_MOE_LAST, 1.4, record_id="gate-moe", age_s=600)
    newer = _measured(A_DENSE_FIRST, 0.8, record_id="gate-dense", age_s=60)
    records = [*_profiles(), older, newer]
    moe_last = _moe_on_a(records)
    assert _term(moe_last, 1, "compute").value == pytest.approx(1.4 * _term(_moe_on_a(_profiles()), 1, "compute").value)
    assert _term(moe_last, 1, "step").calibration_id == "gate-dense"  # the step ran in both: the newer
    both = predict_placement(MODEL, INVENTORY, TWO, book_from_records(records), [("a", 0, 3), ("b", 3, 4)],
                             now_unix_ns=NOW)
    plain = predict_placement(MODEL, INVENTORY, TWO, book_from_records(_profiles()), [("a", 0, 3), ("b", 3, 4)],
                              now_unix_ns=NOW)
    compute = _term(both, 0, "compute")
    assert set(compute.calibration_id.split(", ")) == {"gate-dense", "gate-moe"}
    assert plain.stages[0].decode.compute_s * 0.8 < both.stages[0].decode.compute_s < \
        plain.stages[0].decode.compute_s * 1.4
