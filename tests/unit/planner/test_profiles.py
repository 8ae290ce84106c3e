"""Profiles as registry records, and the newest valid ones read back for planning."""

from __future__ import annotations

import dataclasses

import pytest

from apps.cli.profile import render, to_document
from apps.fleet.profiling import FleetProfiles, StoredLink, StoredStage, ordered_pairs
from libs.profiles.schema import (
    Figure,
    HostFacts,
    LayerKindProfile,
    LinkProfile,
    ResidentSample,
    RuntimeResident,
    StageProfile,
    to_json,
)
from services.evidence_registry.domain import Record, RecordStatus
from services.evidence_registry.errors import InvalidField
from services.evidence_registry.profile_records import link_profile_record, stage_profile_record
from services.evidence_registry.validation import check_content
from services.planner.profile_source import newest_per_subject
from services.planner.profiles import ProfileRecordInput, book_from_records

SNAP = "sha256:" + "a" * 64
NS = 10**9


def stage(host: str = "beta", measured_s: int = 1000, snapshot: str = SNAP) -> StageProfile:
    dense = LayerKindProfile("dense", {16: Figure.of([1e-4, 2e-4, 1.5e-4], "s/token")},
                             {1: Figure.of([3e-3, 4e-3, 5e-3], "s/microbatch")}, 1024, 192)
    return StageProfile(HostFacts(host, "AMD EPYC", 0.5, "1", 3 << 30), f"spiffe://fornax/stage/{host}", "numpy",
                        "numpy 2.4", "cpu", snapshot, "fp32", 512, 32, (dense,), "fornax profile --runs 3",
                        measured_s * NS, 3600)


def link(a: str = "alpha", b: str = "beta", measured_s: int = 1000) -> LinkProfile:
    return LinkProfile(a, b, Figure.of([1e-3, 2e-3, 3e-3], "s"), Figure.of([1e8, 1.1e8, 1.2e8], "B/s"), "fnx2+tls",
                       "fornax profile", measured_s * NS, 3600)


def as_record(content, blob, record_id: str, status=RecordStatus.ACTIVE) -> Record:
    from services.evidence_registry.domain import BlobRef

    return Record(record_id, content, BlobRef("0" * 64, len(blob)), status, content.validity.valid_from_unix_ns)


def stage_record(profile: StageProfile, record_id: str, **kw) -> tuple[Record, bytes]:
    content, blob = stage_profile_record(profile, (0, 2), "hidden 64")
    return as_record(content, blob, record_id, **kw), blob


def link_record(profile: LinkProfile, record_id: str) -> tuple[Record, bytes]:
    content, blob = link_profile_record(profile, "alpha: AMD EPYC, 1.5 cores", "fnx2 2.0", "8 rows x 2048 bf16")
    return as_record(content, blob, record_id), blob


def test_profile_records_carry_the_schema_labels_and_pass_physical_validation():
    content, blob = stage_profile_record(stage(), (0, 2), "hidden 64")
    check_content(content)
    assert blob == to_json(stage())
    assert dict(content.labels)["profile"] == "stage" and dict(content.labels)["host"] == "beta"
    assert dict(content.labels)["model_snapshot"] == SNAP and content.subject == "stage-profile:beta"
    assert content.evidence_class.value == "physical" and content.type.value == "measurement"
    assert "0.5 cores" in content.provenance.hardware and content.provenance.command == "fornax profile --runs 3"
    assert "prefill S in [16]" in content.provenance.shapes and "context 512" in content.provenance.shapes
    assert content.validity.valid_until_unix_ns - content.validity.valid_from_unix_ns == 3600 * NS
    link_content, _ = link_profile_record(link(), "alpha host", "fnx2 2.0", "8 rows")
    check_content(link_content)  # a link names no layer range
    assert link_content.subject == "link-profile:alpha->beta"
    assert dict(link_content.labels) == {"profile": "link", "from_host": "alpha", "to_host": "beta"}


def test_only_links_may_leave_out_the_layer_range():
    content, _ = stage_profile_record(stage(), (0, 2), "hidden 64")
    stripped = dataclasses.replace(content, provenance=dataclasses.replace(content.provenance, layer_range=None))
    with pytest.raises(InvalidField) as caught:
        check_content(stripped)
    assert caught.value.reason == "MISSING_PROVENANCE"


def planner_input(record: Record, blob: bytes) -> ProfileRecordInput:
    return ProfileRecordInput(record.record_id, record.content.type.value, blob, record.content.labels,
                              record.content.evidence_class.value)


def test_the_planner_reads_the_records_profile_writes_and_takes_the_newest():
    old, old_blob = stage_record(stage(measured_s=1000), "old")
    new, new_blob = stage_record(stage(measured_s=2000), "new")
    ab, ab_blob = link_record(link(), "ab")
    newest = newest_per_subject([old, new, ab])
    assert [r.record_id for r in newest] == ["ab", "new"]
    blobs = {"old": old_blob, "new": new_blob, "ab": ab_blob}
    book = book_from_records(planner_input(r, blobs[r.record_id]) for r in newest)
    assert book.stage_record("beta").profile == stage(measured_s=2000)
    assert book.stage_problem("beta", SNAP, "numpy", 2100 * NS) is None
    assert book.link_problem("alpha", "beta", 2100 * NS) is None
    assert book.stage_problem("beta", "sha256:" + "b" * 64, "numpy", 2100 * NS).reason == "PROFILE_MISMATCH"
    assert book.stage_problem("beta", SNAP, "numpy", 10_000 * NS).reason == "PROFILE_EXPIRED"


def test_a_profile_timed_with_one_weight_policy_does_not_serve_a_plan_in_another():
    record, blob = stage_record(dataclasses.replace(stage(measured_s=2000), weights_policy="fp32"), "fp32")
    book = book_from_records([planner_input(record, blob)])
    assert book.stage_problem("beta", SNAP, "numpy", 2100 * NS, "fp32") is None
    assert book.stage_problem("beta", SNAP, "numpy", 2100 * NS) is None  # no policy: bytes as stored
    refused = book.stage_problem("beta", SNAP, "numpy", 2100 * NS, "q4_k_m")
    assert refused.reason == "PROFILE_MISMATCH"
    assert "measured with fp32 weights, planning q4_k_m weights" in refused.detail


def test_every_printed_figure_says_it_is_physical_and_shows_its_spread():
    s_record, _ = stage_record(stage(), "s1")
    l_record, _ = link_record(link(), "l1")
    result = FleetProfiles(SNAP, (StoredStage(stage(), s_record),), (StoredLink(link(), l_record),))
    text = render(result)
    assert "PHYSICAL stage profile beta (record s1)" in text and "PHYSICAL link profile alpha -> beta" in text
    assert "0.5 cores" in text and "numpy 2.4" in text and SNAP in text and "fornax profile --runs 3" in text
    assert "spread 67%, n=3" in text  # the dense layer's prefill: (2e-4 - 1e-4) / 1.5e-4
    resident = RuntimeResident((ResidentSample("after the profiled steps of layers [0, 2)", 300 << 20, 200 << 20,
                                               40 << 20, 10 << 20, 50 << 20),))
    with_reserve = dataclasses.replace(stage(), runtime_resident=resident)
    text = render(FleetProfiles(SNAP, (StoredStage(with_reserve, s_record),), ()))
    assert "runtime reserve 200.0 MiB (largest sample" in text
    assert "after the profiled steps of layers [0, 2): resident 300.0 MiB (anonymous 200.0), weight file pages " \
           "40.0, weight copies 10.0, KV 50.0 -> 200.0 MiB" in text
    document = to_document(result)
    assert document["stages"][0]["evidence_class"] == "physical" and document["links"][0]["record_id"] == "l1"
    assert ordered_pairs(["a", "b", "c"]) == [("a", "b"), ("a", "c"), ("b", "a"), ("b", "c"), ("c", "a"), ("c", "b")]


def test_a_gate_newer_than_a_profiles_serving_window_of_the_same_route_does_not_shadow_it():
    from apps.qualify.gate import Verdict
    from apps.qualify.records import MeasuredOn, calibration_record
    from libs.common.kinds import DType
    from libs.profiles.schema import GATE, SERVING_WINDOW, Calibration, StageCalibration
    from services.evidence_registry.domain import LayerRange

    def calibration(purpose: str, measured_s: int, record_id: str) -> Record:
        stage_ = StageCalibration(0, "beta", 0, 2, 0.004, Figure.of([0.006, 0.007], "s"))
        c = Calibration("sha256:s|beta:numpy[0:2]", "sha256:p", ("new",), (stage_,), 0.004,
                        Figure.of([0.006, 0.007], "s"), 0.25, 2, purpose=purpose, measured_unix_ns=measured_s * NS)
        on = MeasuredOn("AMD EPYC", "numpy 2.4", SNAP, "fornax profile", measured_s * NS, 3600, LayerRange(0, 2),
                        DType.FP32, "4 prompts")
        content, blob = calibration_record(Verdict(c, ()), on)
        return as_record(content, blob, record_id)

    window, gate = calibration(SERVING_WINDOW, 1000, "window"), calibration(GATE, 2000, "gate")
    assert dict(window.content.labels)["purpose"] == SERVING_WINDOW
    assert dict(window.content.labels)["passed"] == "false"  # a window is never a passing gate
    assert window.content.subject.startswith("serving-window:")
    assert {r.record_id for r in newest_per_subject([window, gate])} == {"window", "gate"}
    later_gate = calibration(GATE, 3000, "later-gate")
    assert {r.record_id for r in newest_per_subject([window, gate, later_gate])} == {"window", "later-gate"}
