"""The planner plans a MAX node only from stage profiles timed in the node's block-format
activations: a profile of the other mode stands aside (PROFILE_MISMATCH, like a profile of another
model or weight policy), and the node's mode crosses every path into the inventory."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fornax.common.v1 import common_pb2
from fornax.planner.v1 import planner_pb2 as pb
from fornax.stage_worker.v1 import stage_worker_pb2 as sw_pb
from libs.profiles import schema
from services.evidence_registry.domain import BlobRef, Record, RecordStatus
from services.evidence_registry.profile_records import stage_profile_record
from services.planner import convert
from services.planner import domain as d
from services.planner.explain import explain_lines
from services.planner.inventory import InventoryError, Target, parse_inventory
from services.planner.inventory_facts import describe_facts, inventory_from
from services.planner.planner import DeploymentRefused, plan
from services.planner.profile_source import newest_per_subject
from services.planner.profiles import book_from_records
from services.planner.reserve import choose_reserve
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
HOUR_NS = 3600 * 10**9


def _profile(host: str, mode: str, *, measured: int = NOW - HOUR_NS, layer_s: float = 1e-3):
    return replace(stage_profile(host, SNAP, measured=measured, layer_s=layer_s), max_activations=mode)


def _record(host: str, mode: str, **kw):
    return stage_record(_profile(host, mode, **kw), f"stage-{host}-{mode}")


def test_a_node_runs_its_reported_mode_and_an_unreported_max_node_int8():
    assert node("a").activations == "int8"  # a max node that reports none: the worker's default
    assert replace(node("a"), max_activations="float32").activations == "float32"
    assert replace(node("a"), backend="numpy").activations == ""


def test_a_profile_of_the_other_mode_stands_aside_with_the_reason():
    book = book_from_records([_record("a", "int8")])
    assert book.stage_problem("a", SNAP, "max", NOW, max_activations="int8") is None
    refused = book.stage_problem("a", SNAP, "max", NOW, max_activations="float32")
    assert refused.reason == d.PROFILE_MISMATCH and refused.record_id == "stage-a-int8"
    assert "timed with int8 activations, the node runs float32 activations" in refused.detail
    assert book.stage_problem("a", SNAP, "max", NOW) is None  # no mode asked: nothing checked


def test_the_newest_profile_of_the_nodes_mode_is_taken_over_a_newer_one_of_the_other():
    older_float32 = _record("a", "float32", measured=NOW - 3 * HOUR_NS)
    book = book_from_records([older_float32, _record("a", "int8")])
    assert book.stage_record("a", "float32").record_id == "stage-a-float32"
    assert book.stage_record("a", "int8").record_id == "stage-a-int8"
    assert book.stage_problem("a", SNAP, "max", NOW, max_activations="float32") is None
    assert book.stage_record("a").record_id == "stage-a-int8"  # no mode: the newest


def _run(recs, a_mode: str = "", target: Target = TWO):
    inventory = full_mesh(replace(node("a"), max_activations=a_mode), node("b"))
    return plan(MODEL, inventory, target, profiles=book_from_records(recs), now_unix_ns=NOW)


def _a_compute(result):
    stage = next(s for s in result.plan.stages if s.host == "a")
    return {t.term: t for t in stage.terms}["compute"]


def test_planning_a_float32_node_ignores_its_int8_profile_and_says_why():
    recs = [_record("a", "int8"), _record("b", "int8"), link_record(link_profile("a", "b"))]
    as_int8 = _a_compute(_run(recs, "int8"))
    assert as_int8.evidence_class == d.TERM_PHYSICAL and "stage-a-int8" in as_int8.record_ids
    assert "timed in int8 activations" in as_int8.note
    as_float32 = _a_compute(_run(recs, "float32"))
    assert as_float32.evidence_class == d.TERM_DECLARED and "stage-a-int8" not in as_float32.record_ids
    key = _run(recs, "float32").plan.route_key
    with pytest.raises(DeploymentRefused) as refused:
        _run([*recs, calibration_record(calibration(key))], "float32", replace(TWO, mode="deployment"))
    assert refused.value.reason == d.PROFILE_MISMATCH and "host a" in refused.value.message
    assert "the node runs float32 activations" in refused.value.message


def test_the_reserve_of_a_float32_node_stays_declared_over_an_int8_profile():
    book = book_from_records([_record("a", "int8")])
    int8 = choose_reserve(node("a"), "a", book, SNAP, MODEL.weights_policy, NOW)
    assert int8.measured and int8.record_id == "stage-a-int8"
    float32 = choose_reserve(replace(node("a"), max_activations="float32"), "a", book, SNAP, MODEL.weights_policy,
                             NOW)
    assert not float32.measured and "PROFILE_MISMATCH" in float32.detail


def test_explain_names_the_mode_a_stage_was_planned_in():
    recs = [_record("a", "float32"), _record("b", "int8"), link_record(link_profile("a", "b"))]
    text = "\n".join(explain_lines(_run(recs, "float32").plan))
    assert "on a timed in float32 activations" in text and "on b timed in int8 activations" in text


def _registry_record(profile: schema.StageProfile, record_id: str, labels_edit=None) -> Record:
    content, blob = stage_profile_record(profile, (0, 2), "hidden 64")
    if labels_edit is not None:
        content = replace(content, labels=labels_edit(content.labels))
    return Record(record_id, content, BlobRef("0" * 64, len(blob)), RecordStatus.ACTIVE,
                  profile.measured_unix_ns)


def test_the_registry_fetch_keeps_a_max_hosts_newest_profile_of_each_mode():
    def unlabelled(labels):
        return tuple((k, v) for k, v in labels if k != schema.LABEL_MAX_ACTIVATIONS)

    old = _registry_record(_profile("a", "int8", measured=NOW - 5 * HOUR_NS), "old-int8", unlabelled)
    float32 = _registry_record(_profile("a", "float32", measured=NOW - 3 * HOUR_NS), "float32")
    int8 = _registry_record(_profile("a", "int8"), "int8")
    numpy = _registry_record(stage_profile("n", SNAP, backend="numpy"), "numpy")
    kept = {r.record_id for r in newest_per_subject([old, float32, int8, numpy])}
    assert kept == {"float32", "int8", "numpy"}  # an unlabelled max record is an int8 one: shadowed
    assert {r.record_id for r in newest_per_subject([old, float32])} == {"old-int8", "float32"}


def _cap(backend, mode: str = "") -> sw_pb.GetCapabilitiesResponse:
    return sw_pb.GetCapabilitiesResponse(
        backend=backend, backend_build="max 26", data_plane_host="h", max_activations=mode,
        supported_dtypes=[common_pb2.ELEMENT_TYPE_FP32],
        device=sw_pb.DeviceInfo(kind="cpu", name="CPU", cpu_count=2, memory_available_bytes=1 << 33))


def test_running_workers_report_their_mode_into_the_inventory():
    caps = [_cap(common_pb2.BACKEND_MAX, "float32"), _cap(common_pb2.BACKEND_MAX), _cap(common_pb2.BACKEND_NUMPY)]
    nodes = inventory_from(caps).nodes
    assert [n.max_activations for n in nodes] == ["float32", "", ""]
    assert [n.activations for n in nodes] == ["float32", "int8", ""]
    assert "(max 26, float32 activations)" in describe_facts(caps)


def test_the_mode_crosses_the_planner_api_and_a_bad_one_is_refused():
    inventory = full_mesh(replace(node("a"), max_activations="float32"), replace(node("b"), backend="numpy"))
    request = pb.CreatePlanRequest()
    convert.inventory_to_request(inventory, request)
    assert [n.max_activations for n in convert.inventory_from_request(request).nodes] == ["float32", ""]
    request.inventory.nodes[0].max_activations = "int4"
    with pytest.raises(InventoryError) as unknown:
        convert.inventory_from_request(request)
    assert (unknown.value.reason, unknown.value.field) == ("MAX_ACTIVATIONS_UNSUPPORTED",
                                                           "inventory.nodes[0].max_activations")
    request.inventory.nodes[0].max_activations = ""
    request.inventory.nodes[1].max_activations = "int8"
    with pytest.raises(InventoryError) as on_numpy:
        convert.inventory_from_request(request)
    assert on_numpy.value.reason == "MAX_ACTIVATIONS_BACKEND"


def test_an_inventory_file_node_may_state_its_mode():
    raw = {"nodes": [{"name": "a", "backend": "max", "memory": "8GiB", "compute": "1TFLOP/s",
                      "memory_bandwidth": "10GB/s", "dtypes": ["fp32"], "operations": [],
                      "max_activations": "float32"}]}
    assert parse_inventory(raw).nodes[0].activations == "float32"
    raw["nodes"][0]["backend"] = "numpy"
    with pytest.raises(InventoryError) as refused:
        parse_inventory(raw)
    assert refused.value.reason == "MAX_ACTIVATIONS_BACKEND" and refused.value.field == "nodes[0].max_activations"
