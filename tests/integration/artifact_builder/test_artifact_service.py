"""The artifact builder as a real process: inspect, streamed build, verify, evidence registration."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from fornax.artifact_builder.v1 import artifact_builder_pb2 as pb
from fornax.artifact_builder.v1 import artifact_builder_pb2_grpc as pb_grpc
from fornax.common.v1 import common_pb2
from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from libs.service.interceptors import reason_of
from services.evidence_registry.client import RegistryClient
from services.evidence_registry.domain import EvidenceClass, RecordType
from tests.integration.evidence_registry.test_registry_service import start_registry
from tests.support.procs import ServiceProc

pytestmark = pytest.mark.integration
FP32 = common_pb2.ELEMENT_TYPE_FP32


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("artifact-builder")
    registry, registry_addr = start_registry(root / "registry", root / "run")
    builder = ServiceProc("services.artifact_builder", root / "run", env={
        "FORNAX_REGISTRY_ADDR": registry_addr,
        "FORNAX_ARTIFACT_STORE": str(root / "store"),
        "FORNAX_GRACE_PERIOD_S": "2",
    })
    try:
        address = builder.wait_serving()
        checkpoint = root / "tiny"
        write_checkpoint(CheckpointRequest("tiny", checkpoint, max_shard_bytes=200_000))
        with grpc.insecure_channel(address) as channel:
            yield pb_grpc.ArtifactBuilderServiceStub(channel), registry_addr, checkpoint, root
    finally:
        assert builder.stop() == 0
        assert registry.stop() == 0


def _build(stub, request: pb.BuildStageArtifactsRequest):
    events = list(stub.BuildStageArtifacts(request, timeout=120))
    assert events[-1].WhichOneof("event") == "result"
    assert all(e.WhichOneof("event") == "progress" for e in events[:-1])
    return events[-1].result, [e.progress for e in events[:-1]]


def _error(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value


def test_inspect_registers_the_snapshot_as_a_model_record(fleet):
    stub, registry_addr, checkpoint, _ = fleet
    response = stub.InspectCheckpoint(
        pb.InspectCheckpointRequest(checkpoint_dir=str(checkpoint), source="generated:tiny", revision="seed0"),
        timeout=60,
    )
    assert response.valid and not response.problems
    snap = response.snapshot
    assert snap.num_layers == 4 and snap.weight_dtype == "BF16" and len(snap.shards) > 1
    assert (snap.source, snap.revision) == ("generated:tiny", "seed0")
    assert response.model_record_id
    with RegistryClient(registry_addr) as registry:
        record, blob = registry.get_record(response.model_record_id, include_blob=True)
    assert record.content.type is RecordType.MODEL
    assert record.content.evidence_class is EvidenceClass.CONTRACT
    assert record.content.subject == snap.snapshot_id
    assert json.loads(blob)["config_sha256"] == snap.config_sha256


def test_streamed_build_then_verify_and_refuse_tampering(fleet):
    stub, _, checkpoint, root = fleet
    out = root / "store" / "out-ranges"
    ranges = [common_pb2.LayerRange(layer_start=0, layer_end_exclusive=1),
              common_pb2.LayerRange(layer_start=1, layer_end_exclusive=4)]
    result, progress = _build(stub, pb.BuildStageArtifactsRequest(
        request_id="build-1", checkpoint_dir=str(checkpoint), out_dir=str(out),
        layer_ranges=ranges, boundary_dtype=FP32))
    assert progress[-1].tensors_done == progress[-1].tensors_total > 0
    assert [(s.layer_range.layer_start, s.layer_range.layer_end_exclusive) for s in result.stages] == [(0, 1), (1, 4)]
    stage = result.stages[1]
    ok = stub.VerifyArtifact(pb.VerifyArtifactRequest(
        artifact_dir=str(out / "stage-1"), expected_manifest_hash=stage.manifest_hash,
        expected_plan_hash=result.plan_hash), timeout=60)
    assert ok.ok and ok.manifest_hash == stage.manifest_hash
    wrong_plan = stub.VerifyArtifact(pb.VerifyArtifactRequest(
        artifact_dir=stage.artifact_dir, expected_plan_hash="sha256:" + "1" * 64), timeout=60)
    assert (wrong_plan.ok, wrong_plan.reason) == (False, "ARTIFACT_PLAN_MISMATCH")
    weights = Path(stage.artifact_dir) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    flipped = stub.VerifyArtifact(pb.VerifyArtifactRequest(artifact_dir=stage.artifact_dir), timeout=60)
    assert (flipped.ok, flipped.reason) == (False, "ARTIFACT_CHECKSUM_MISMATCH")


def test_build_from_a_planner_plan_keeps_its_identity(fleet):
    stub, _, checkpoint, root = fleet
    plan = {"planId": "plan-0123456789abcdef", "planHash": "sha256:" + "ab" * 32, "stages": [
        {"stageIndex": 0, "node": "a", "layerRange": {"layerStart": 0, "layerEndExclusive": 2}, "ownsEmbeddings": True},
        {"stageIndex": 1, "node": "b", "layerRange": {"layerStart": 2, "layerEndExclusive": 4}, "ownsHead": True},
    ]}
    result, _ = _build(stub, pb.BuildStageArtifactsRequest(
        request_id="build-2", checkpoint_dir=str(checkpoint), plan_json=json.dumps({"plan": plan}),
        boundary_dtype=FP32))
    assert (result.plan_id, result.plan_hash) == (plan["planId"], plan["planHash"])
    assert Path(result.stages[0].artifact_dir).parent == root / "store" / "artifacts"
    manifest = json.loads((Path(result.stages[1].artifact_dir) / "manifest.json").read_text())
    assert manifest["plan"] == {"plan_id": plan["planId"], "plan_hash": plan["planHash"]}


def test_bad_requests_get_specific_errors(fleet):
    stub, _, checkpoint, root = fleet
    both = _error(lambda: _build(stub, pb.BuildStageArtifactsRequest(
        checkpoint_dir=str(checkpoint), plan_json="{}", boundary_dtype=FP32,
        layer_ranges=[common_pb2.LayerRange(layer_start=0, layer_end_exclusive=4)])))
    assert (both.code(), reason_of(both)) == (grpc.StatusCode.INVALID_ARGUMENT, "PLAN_INVALID")
    unspecified = _error(lambda: _build(stub, pb.BuildStageArtifactsRequest(
        checkpoint_dir=str(checkpoint), layer_ranges=[common_pb2.LayerRange(layer_start=0, layer_end_exclusive=4)])))
    assert unspecified.code() == grpc.StatusCode.INVALID_ARGUMENT
    gap = _error(lambda: _build(stub, pb.BuildStageArtifactsRequest(
        checkpoint_dir=str(checkpoint), boundary_dtype=FP32,
        layer_ranges=[common_pb2.LayerRange(layer_start=0, layer_end_exclusive=3)])))
    assert reason_of(gap) == "PLAN_INVALID"
    missing = _error(lambda: stub.InspectCheckpoint(
        pb.InspectCheckpointRequest(checkpoint_dir=str(root / "nowhere")), timeout=30))
    assert (missing.code(), reason_of(missing)) == (grpc.StatusCode.NOT_FOUND, "CHECKPOINT_NOT_FOUND")
    refused = stub.VerifyArtifact(pb.VerifyArtifactRequest(artifact_dir=str(root)), timeout=30)
    assert (refused.ok, refused.reason) == (False, "ARTIFACT_MANIFEST_MISSING")


def test_paths_outside_the_roots_are_refused_with_a_reason(fleet, tmp_path):
    from libs.service.interceptors import reason_of

    stub, _, checkpoint, root = fleet
    refused = {}
    calls = {
        "checkpoint_dir": lambda: stub.InspectCheckpoint(pb.InspectCheckpointRequest(checkpoint_dir="/etc"),
                                                         timeout=30),
        "artifact_dir": lambda: stub.VerifyArtifact(pb.VerifyArtifactRequest(artifact_dir="/etc"), timeout=30),
        "out_dir": lambda: list(stub.BuildStageArtifacts(pb.BuildStageArtifactsRequest(
            request_id="escape", checkpoint_dir=str(checkpoint), out_dir=str(root / "not-the-store")), timeout=30)),
    }
    for field, call in calls.items():
        with pytest.raises(grpc.RpcError) as caught:
            call()
        refused[field] = (caught.value.code(), reason_of(caught.value))
    assert refused == dict.fromkeys(calls, (grpc.StatusCode.PERMISSION_DENIED, "PATH_OUTSIDE_ROOTS"))
    assert not (root / "not-the-store").exists()
