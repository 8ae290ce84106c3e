"""Plan documents and request validation at the protobuf boundary."""

from __future__ import annotations

import json

import pytest

from fornax.artifact_builder.v1 import artifact_builder_pb2 as pb
from fornax.common.v1 import common_pb2
from libs.artifacts.manifest import canonical_hash
from libs.common.kinds import DType
from services.artifact_builder.convert import boundary_dtype_from_pb, plan_from_json, plan_from_request, stage_backends
from services.artifact_builder.errors import PlanInvalidError
from services.artifact_builder.staging import StageRange

PLAN = {
    "plan_id": "plan-1", "plan_hash": "sha256:" + "c" * 64,
    "stages": [
        {"stage_index": 1, "layer_range": {"layer_start": 2, "layer_end_exclusive": 4}},
        {"stage_index": 0, "layer_range": {"layer_end_exclusive": 2}},
    ],
}


def test_plan_json_in_either_field_spelling_and_wrapped():
    expected = (StageRange(0, 0, 2), StageRange(1, 2, 4))
    camel = json.dumps({"plan": {"planId": "plan-1", "planHash": PLAN["plan_hash"], "stages": [
        {"stageIndex": 0, "layerRange": {"layerEndExclusive": 2}},
        {"stageIndex": 1, "layerRange": {"layerStart": 2, "layerEndExclusive": 4}}]}})
    for text in (json.dumps(PLAN), camel):
        plan = plan_from_json(text)
        assert (plan.plan_id, plan.plan_hash, plan.stages) == ("plan-1", PLAN["plan_hash"], expected)


def test_plan_without_identity_is_named_by_its_canonical_hash():
    document = {k: v for k, v in PLAN.items() if k not in ("plan_id", "plan_hash")}
    plan = plan_from_json(json.dumps(document))
    assert plan.plan_hash == canonical_hash(document) == plan.plan_id


@pytest.mark.parametrize("text", ["not json", "[]", '{"stages": []}', '{"stagez": 1}', '{"stages": [{"node": 3}]}'])
def test_malformed_plans_are_refused(text):
    with pytest.raises(PlanInvalidError):
        plan_from_json(text)


def test_request_needs_exactly_one_plan_source_and_a_boundary_dtype():
    ranges = [common_pb2.LayerRange(layer_start=0, layer_end_exclusive=4)]
    with pytest.raises(PlanInvalidError):
        plan_from_request(pb.BuildStageArtifactsRequest())
    with pytest.raises(PlanInvalidError):
        plan_from_request(pb.BuildStageArtifactsRequest(plan_json=json.dumps(PLAN), layer_ranges=ranges))
    assert plan_from_request(pb.BuildStageArtifactsRequest(layer_ranges=ranges)).stages == (StageRange(0, 0, 4),)
    assert boundary_dtype_from_pb(common_pb2.ELEMENT_TYPE_BF16) is DType.BF16
    for bad in (common_pb2.ELEMENT_TYPE_UNSPECIFIED, common_pb2.ELEMENT_TYPE_INT32, 99):
        with pytest.raises(PlanInvalidError):
            boundary_dtype_from_pb(bad)


def test_layer_ranges_name_one_backend_each():
    ranges = [common_pb2.LayerRange(layer_start=0, layer_end_exclusive=2),
              common_pb2.LayerRange(layer_start=2, layer_end_exclusive=4)]
    request = pb.BuildStageArtifactsRequest(layer_ranges=ranges,
                                            stage_backends=[common_pb2.BACKEND_MAX, common_pb2.BACKEND_NUMPY])
    assert stage_backends(request) == ("max", "numpy")
    assert stage_backends(pb.BuildStageArtifactsRequest(layer_ranges=ranges)) == ()
    for bad in ([common_pb2.BACKEND_MAX], [common_pb2.BACKEND_MAX, common_pb2.BACKEND_UNSPECIFIED]):
        with pytest.raises(PlanInvalidError) as refused:
            stage_backends(pb.BuildStageArtifactsRequest(layer_ranges=ranges, stage_backends=bad))
        assert refused.value.field == "stage_backends"
