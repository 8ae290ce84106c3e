"""Planning from measured stage and link profiles, and the deployment gate on them."""

from __future__ import annotations

from dataclasses import replace

import grpc
import pytest

from services.planner import domain as d
from services.planner.inventory import Target
from services.planner.planner import DeploymentRefused, plan
from services.planner.profiles import Standing, book_from_records
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

MODEL = tiny_model(layers=12)
SNAP = MODEL.model_snapshot
TWO = Target(context_tokens=512, concurrency=4, min_stages=2, max_stages=2, prefill_tokens=64)


def inventory(*names: str):
    return full_mesh(*(node(n) for n in names))


def records(a_s: float = 1e-3, b_s: float = 1e-3, *, link: bool = True, **b_kw):
    out = [stage_record(stage_profile("a", SNAP, layer_s=a_s)), stage_record(stage_profile("b", SNAP, layer_s=b_s,
                                                                                          **b_kw))]
    return out + ([link_record(link_profile("a", "b"))] if link else [])


def run(recs, target=TWO, names=("a", "b")):
    return plan(MODEL, inventory(*names), target, profiles=book_from_records(recs), now_unix_ns=NOW)


def layers_of(result, node_name):
    return sum(s.layer_end - s.layer_start for s in result.plan.stages if s.node == node_name)


def test_equal_hosts_split_evenly_and_a_three_times_slower_host_gets_fewer_layers():
    even = run(records(1e-3, 1e-3))
    assert layers_of(even, "a") == layers_of(even, "b") == 6
    skewed = run(records(1e-3, 3e-3))
    a, b = layers_of(skewed, "a"), layers_of(skewed, "b")
    assert a + b == 12 and b < a and b in (3, 4)
    # The bottleneck prediction follows the measurements: b's share at 3x the per-layer time.
    busiest = max(s.decode.service_s for s in skewed.plan.stages)
    assert busiest < max(s.decode.service_s for s in even.plan.stages) * 3 * 0.75


def test_dense_decode_interpolates_linearly_between_measured_batches():
    # rows 4 lies between the measured batches 1 (1 ms) and 8 (2 ms): 1 ms + 3/7 ms per dense layer
    # (MoE layers follow their routed experts instead: `test_expert_rows`).
    dense = tiny_model(layers=12, dense_layers=12)
    result = plan(dense, inventory("a", "b"), replace(TWO, decode_microbatch_rows=4),
                  profiles=book_from_records(records()), now_unix_ns=NOW)
    first = result.plan.stages[0]
    per_layer = 1e-3 + (4 - 1) / (8 - 1) * 1e-3
    embed = 1e-4 + 3 / 7 * 1e-4
    step = 1e-4 + 3 / 7 * 1e-4  # the factory's step overhead: 0.1 ms at 1 row, 0.2 ms at 8
    assert first.decode.compute_s == pytest.approx(per_layer * first.layer_end + embed + step)


def test_the_step_overhead_is_its_own_physical_term_inside_the_stage_service():
    with_step = run(records(), target=replace(TWO, decode_microbatch_rows=8))
    without = run([stage_record(stage_profile(h, SNAP, step_s=0.0)) for h in ("a", "b")]
                  + [link_record(link_profile("a", "b"))], target=replace(TWO, decode_microbatch_rows=8))
    for stage, bare in zip(with_step.plan.stages, without.plan.stages, strict=True):
        terms = {t.term: t for t in stage.terms}
        assert terms["step"].value == pytest.approx(2e-4)  # measured 0.2 ms at 8 rows
        assert terms["step"].evidence_class == d.TERM_PHYSICAL
        assert terms["compute"].value + terms["step"].value == pytest.approx(stage.decode.compute_s)
        assert stage.decode.compute_s == pytest.approx(bare.decode.compute_s + 2e-4)
        assert {t.term: t for t in bare.terms}["step"].evidence_class == d.TERM_DECLARED


def test_a_step_overhead_measured_below_zero_predicts_zero():
    negative = run([stage_record(stage_profile(h, SNAP, step_s=-5e-4)) for h in ("a", "b")]
                   + [link_record(link_profile("a", "b"))])
    for stage in negative.plan.stages:
        assert {t.term: t for t in stage.terms}["step"].value == 0.0


def test_a_larger_step_overhead_on_one_host_moves_layers_off_it():
    even = run(records())
    heavy = run([stage_record(stage_profile("a", SNAP)), stage_record(stage_profile("b", SNAP, step_s=3e-3)),
                 link_record(link_profile("a", "b"))])
    assert layers_of(heavy, "b") < layers_of(even, "b")


def test_wire_is_half_rtt_plus_frame_bytes_over_throughput_and_pack_unpack_live_inside_it():
    result = run(records())
    first = result.plan.stages[0]
    frame = MODEL.hidden_size * 2 * TWO.microbatch_rows  # bf16 boundary rows
    assert first.decode.wire_s == pytest.approx(1e-4 / 2 + frame / 1e9)
    assert first.decode.pack_s == 0.0 and result.plan.stages[1].decode.unpack_s == 0.0
    pack = next(t for t in first.terms if t.term == "pack")
    assert pack.evidence_class == d.TERM_PHYSICAL and pack.record_ids == ("link-a-b",)


def test_a_slow_link_changes_the_placement():
    fast = run(records(), target=replace(TWO, min_stages=1))
    assert len(fast.plan.stages) == 2
    slow = [*records(link=False), link_record(link_profile("a", "b", rtt_s=1.0))]
    result = run(slow, target=replace(TWO, min_stages=1))
    assert len(result.plan.stages) == 1 and result.plan.stages[0].layer_end == 12


def test_every_term_carries_its_evidence_ids_and_says_it_is_a_prediction_from_measurements():
    result = run(records())
    p = result.plan
    assert set(p.evidence_ids) == {"stage-a", "stage-b", "link-a-b"}
    assert p.route_key == f"{SNAP}|a:max[0:6]>b:max[6:12]"
    for stage in p.stages:
        terms = {t.term: t for t in stage.terms}
        assert set(terms) == {"compute", "step", "pack", "wire", "unpack", "memory", "reserve"}
        assert terms["compute"].record_ids == (f"stage-{stage.host}",)
        assert terms["step"].record_ids == (f"stage-{stage.host}",)
        assert terms["memory"].record_ids == (f"stage-{stage.host}",)
        assert terms["reserve"].record_ids == (f"stage-{stage.host}",)
        assert all(t.evidence_class == d.TERM_PHYSICAL for t in stage.terms)
        assert "prediction computed from physical measurements" in terms["compute"].note
    assert "predictions computed from physical measurements" in p.label


def test_memory_comes_from_resident_bytes_and_kv_per_token_at_the_target_context():
    result = run(records())
    first = result.plan.stages[0]
    # 6 layers of 4 MiB each plus the embed kind's 4 MiB; KV 1024 B/token x 512 tokens x 4 sequences a layer.
    assert first.weight_bytes == 7 * 4 * 2**20
    assert first.kv_bytes == 6 * 1024 * 512 * 4


def test_exploratory_fills_gaps_with_declared_figures_and_labels_them():
    result = run([stage_record(stage_profile("a", SNAP))])  # nothing for b, nor for the link
    assert result.feasible
    by_host = {s.host: s for s in result.plan.stages}
    b_terms = {t.term: t for t in by_host["b"].terms}
    assert b_terms["compute"].evidence_class == d.TERM_DECLARED
    assert "declared, exploratory" in b_terms["compute"].note and b_terms["compute"].label == "declared, exploratory"
    a_terms = {t.term: t for t in by_host["a"].terms}
    assert a_terms["compute"].evidence_class == d.TERM_PHYSICAL
    assert a_terms["wire"].evidence_class == d.TERM_DECLARED  # no link profile
    assert result.plan.declared_terms > 0 and "declared, exploratory" in result.plan.label


def _calibrated(recs, *, passed=True):
    key = run(recs).plan.route_key
    return [*recs, calibration_record(calibration(key, passed=passed))]


def test_deployment_with_valid_profiles_and_a_passing_calibration_plans():
    recs = _calibrated(records(1e-3, 3e-3))
    result = run(recs, target=replace(TWO, mode="deployment"))
    p = result.plan
    assert p.mode == "deployment" and p.calibration_id == "calibration-1" and "calibration-1" in p.evidence_ids
    assert p.declared_terms == 0 and layers_of(result, "b") < layers_of(result, "a")


def _refusal(recs, book_edit=None) -> DeploymentRefused:
    book = book_from_records(recs)
    if book_edit:
        book = book_edit(book)
    with pytest.raises(DeploymentRefused) as caught:
        plan(MODEL, inventory("a", "b"), replace(TWO, mode="deployment"), profiles=book, now_unix_ns=NOW)
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION
    return caught.value


def test_deployment_refuses_a_host_without_a_profile_naming_it():
    refused = _refusal(_calibrated([stage_record(stage_profile("a", SNAP)), link_record(link_profile("a", "b"))]))
    assert refused.reason == d.MISSING_PROFILE and "host b" in refused.message


def test_deployment_refuses_a_missing_layer_kind_naming_host_and_kind():
    refused = _refusal(_calibrated(records(kinds=("dense", "embed", "head"))))
    assert refused.reason == d.MISSING_PROFILE and "host b kind moe" in refused.message
    assert "stage-b" in refused.message


def test_deployment_refuses_a_profile_without_the_step_overhead_naming_it():
    recs = [stage_record(stage_profile("a", SNAP)), stage_record(stage_profile("b", SNAP, step_s=0.0)),
            link_record(link_profile("a", "b"))]
    with pytest.raises(DeploymentRefused) as refused:
        run(recs, target=replace(TWO, mode="deployment"))
    assert "host b step overhead" in str(refused.value)


def test_deployment_refuses_a_missing_link_profile():
    refused = _refusal(_calibrated(records(link=False)))
    assert refused.reason == d.MISSING_PROFILE and "link a->b" in refused.message


def test_deployment_refuses_a_profile_past_its_own_validity_naming_the_record():
    stale = stage_profile("b", SNAP, measured=NOW - 2 * 86_400 * 10**9, valid_for_s=86_400)
    recs = _calibrated([stage_record(stage_profile("a", SNAP)), stage_record(stale, "stage-b-old"),
                        link_record(link_profile("a", "b"))])
    refused = _refusal(recs)
    assert refused.reason == d.PROFILE_EXPIRED and "stage-b-old" in refused.message


def test_deployment_refuses_what_the_registry_says_is_expired_or_revoked_or_not_physical():
    recs = _calibrated(records())
    expired = _refusal(recs, lambda b: b.with_standings({
        "stage-a": Standing(), "link-a-b": Standing(), "calibration-1": Standing(),
        "stage-b": Standing(False, "EXPIRED", "valid until 1 ns")}))
    assert expired.reason == d.PROFILE_EXPIRED and "stage-b" in expired.message
    revoked = _refusal(recs, lambda b: b.with_standings({
        "stage-a": Standing(), "stage-b": Standing(), "calibration-1": Standing(),
        "link-a-b": Standing(False, "REVOKED", "remeasured")}))
    assert revoked.reason == d.PROFILE_REVOKED and "link a->b" in revoked.message
    declared = _refusal(recs, lambda b: b.with_standings({
        "stage-a": Standing(evidence_class="reference"), "stage-b": Standing(), "link-a-b": Standing(),
        "calibration-1": Standing()}))
    assert declared.reason == d.PROFILE_NOT_PHYSICAL and "host a" in declared.message


def test_deployment_refuses_a_route_without_a_calibration_or_with_a_failed_one():
    missing = _refusal(records())
    assert missing.reason == d.MISSING_CALIBRATION and f"route {SNAP}|a:max[0:6]>b:max[6:12]" in missing.message
    failed = _refusal(_calibrated(records(), passed=False))
    assert failed.reason == d.CALIBRATION_FAILED and "calibration-1" in failed.message


def test_a_profile_for_another_model_snapshot_does_not_count():
    other = [stage_record(stage_profile("a", "sha256:other")), *records()[1:]]
    result = run(other)
    a_terms = {t.term: t for t in next(s for s in result.plan.stages if s.host == "a").terms}
    assert a_terms["compute"].evidence_class == d.TERM_DECLARED
    refused = _refusal(_calibrated(other))
    assert refused.reason == d.PROFILE_MISMATCH and "host a" in refused.message


def test_a_calibration_qualified_on_other_profiles_is_stale():
    recs = records()
    key = run(recs).plan.route_key
    old = replace(calibration(key), evidence_ids=("stage-a", "stage-b-old", "link-a-b"))
    refused = _refusal([*recs, calibration_record(old)])
    assert refused.reason == d.CALIBRATION_STALE and "stage-b" in refused.message
    covering = replace(calibration(key), evidence_ids=("stage-a", "stage-b", "link-a-b"))
    result = run([*recs, calibration_record(covering)], target=replace(TWO, mode="deployment"))
    assert result.plan.calibration_id == "calibration-1"
