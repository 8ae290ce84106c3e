"""The runtime reserve the planner holds back on a host: a usable stage profile's measurement
beats the declared figure, every choice says which it is, and a larger measurement moves layers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.planner import domain as d
from services.planner.inventory import Target
from services.planner.planner import DeploymentRefused, plan
from services.planner.profiles import book_from_records
from services.planner.reserve import DECLARED, PHYSICAL, choose_reserve
from tests.unit.planner.factories import full_mesh, node, tiny_model
from tests.unit.planner.profile_factories import (
    MIB,
    NOW,
    calibration,
    calibration_record,
    link_profile,
    link_record,
    stage_profile,
    stage_record,
)

MODEL = tiny_model(layers=12)
SNAP = MODEL.model_snapshot
TWO = Target(context_tokens=512, concurrency=4, min_stages=2, max_stages=2, prefill_tokens=64)
DECLARED_GIB = 0.25


def hosts(memory_gib: float = 0.4):
    return full_mesh(node("a", memory_gib=memory_gib, reserve_gib=DECLARED_GIB),
                     node("b", memory_gib=memory_gib, reserve_gib=DECLARED_GIB))


def records(a_reserve: int | None, b_reserve: int | None = 200 * MIB, **a_kw):
    return [stage_record(stage_profile("a", SNAP, reserve=a_reserve, **a_kw)),
            stage_record(stage_profile("b", SNAP, reserve=b_reserve)), link_record(link_profile("a", "b"))]


def run(recs, target=TWO, inventory=None):
    return plan(MODEL, inventory or hosts(), target, profiles=book_from_records(recs), now_unix_ns=NOW)


def terms_of(stage) -> dict[str, d.TermEvidence]:
    return {t.term: t for t in stage.terms}


def test_a_measured_reserve_beats_the_declared_one_and_is_physical_with_its_record():
    result = run(records(a_reserve=100 * MIB))
    by_host = {s.host: s for s in result.plan.stages}
    a = by_host["a"]
    assert a.reserve_bytes == 100 * MIB != int(DECLARED_GIB * 2**30)
    assert a.memory_bytes == a.weight_bytes + a.kv_bytes + a.activation_bytes + 100 * MIB
    reserve = terms_of(a)["reserve"]
    assert reserve.evidence_class == d.TERM_PHYSICAL and reserve.record_ids == ("stage-a",)
    assert reserve.value == 100 * MIB and "measured on a (Test CPU) by stage profile stage-a" in reserve.note
    assert "after the profiled steps" in reserve.note  # the larger of the profile's two samples


def test_a_profile_that_predates_the_measurement_leaves_the_declared_reserve_labelled_declared():
    result = run(records(a_reserve=None))
    a = next(s for s in result.plan.stages if s.host == "a")
    assert a.reserve_bytes == int(DECLARED_GIB * 2**30)
    reserve = terms_of(a)["reserve"]
    assert reserve.evidence_class == d.TERM_DECLARED and reserve.record_ids == ()
    assert "predates the measured runtime reserve" in reserve.note and "declared, exploratory" in reserve.note
    assert result.plan.declared_terms == 1 and "1 term(s) declared" in result.plan.label


def test_a_profile_of_another_model_or_backend_does_not_lend_its_reserve():
    book = book_from_records(records(a_reserve=100 * MIB))
    a = node("a", reserve_gib=DECLARED_GIB)
    other_model = choose_reserve(a, "a", book, "sha256:" + "9" * 64, MODEL.weights_policy, NOW)
    other_backend = choose_reserve(replace(a, backend="numpy"), "a", book, SNAP, MODEL.weights_policy, NOW)
    unprofiled = choose_reserve(a, "c", book, SNAP, MODEL.weights_policy, NOW)
    for choice in (other_model, other_backend, unprofiled):
        assert (choice.evidence, choice.reserve_bytes, choice.record_id) == (DECLARED, a.reserve_bytes, "")
    assert "PROFILE_MISMATCH" in other_model.detail and "MISSING_PROFILE" in unprofiled.detail
    measured = choose_reserve(a, "a", book, SNAP, MODEL.weights_policy, NOW)
    assert (measured.evidence, measured.reserve_bytes, measured.record_id) == (PHYSICAL, 100 * MIB, "stage-a")


def test_a_plan_that_fits_with_the_declared_reserve_shifts_layers_off_a_host_measured_larger():
    declared = run(records(a_reserve=None, b_reserve=None))
    assert declared.feasible and [s.layer_end - s.layer_start for s in declared.plan.stages] == [6, 6]
    measured = run(records(a_reserve=370 * MIB, b_reserve=None))
    assert measured.feasible
    layers = {s.host: s.layer_end - s.layer_start for s in measured.plan.stages}
    assert layers["a"] < 6 < layers["b"]
    for s in measured.plan.stages:
        assert s.memory_bytes <= s.node_memory_bytes


def test_measured_reserves_that_leave_no_room_refuse_the_plan():
    assert run(records(a_reserve=None, b_reserve=None)).feasible
    refused = run(records(a_reserve=400 * MIB, b_reserve=400 * MIB))
    assert not refused.feasible and refused.infeasibility_reason == d.NO_FEASIBLE_PLACEMENT


def test_deployment_refuses_a_host_whose_profile_predates_the_measured_reserve():
    recs = records(a_reserve=None)
    key = run(recs).plan.route_key
    with pytest.raises(DeploymentRefused) as caught:
        run([*recs, calibration_record(calibration(key))], target=replace(TWO, mode="deployment"))
    assert caught.value.reason == d.MISSING_PROFILE
    assert "host a runtime reserve" in caught.value.message and "run `fornax profile` again" in caught.value.message
