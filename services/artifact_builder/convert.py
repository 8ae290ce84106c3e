"""Protobuf and plan-document conversions; protobuf messages stop here."""

from __future__ import annotations

import hashlib
import json

from google.protobuf import json_format

from fornax.artifact_builder.v1 import artifact_builder_pb2 as pb
from fornax.common.v1 import common_pb2
from fornax.planner.v1 import planner_pb2
from libs.artifacts.manifest import FileRecord, canonical_hash
from libs.artifacts.verify import VerifiedArtifact
from libs.common.kinds import DType
from libs.common.proto import dtype_from_pb
from services.artifact_builder.build import BuildProgress, BuildResult
from services.artifact_builder.errors import PlanInvalidError
from services.artifact_builder.snapshot import CheckpointSnapshot, Inspection
from services.artifact_builder.staging import StagePlan, StageRange, plan_from_ranges


def plan_from_json(text: str) -> StagePlan:
    """A `fornax.planner.v1.Plan` in protobuf JSON, bare or wrapped as {"plan": {...}}.

    The plan's own id and hash are kept, so manifests bind to the planner's identity; a plan
    document without a hash is identified by the hash of its canonical JSON.
    """
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanInvalidError(f"plan is not JSON: {exc}", field="plan_json") from exc
    if isinstance(document, dict) and isinstance(document.get("plan"), dict):
        document = document["plan"]
    plan = planner_pb2.Plan()
    try:
        json_format.ParseDict(document, plan)
    except (json_format.ParseError, TypeError, AttributeError) as exc:
        raise PlanInvalidError(f"plan is not a fornax.planner.v1.Plan: {exc}", field="plan_json") from exc
    if not plan.stages:
        raise PlanInvalidError("plan has no stages", field="plan_json")
    stages = tuple(
        StageRange(s.stage_index, s.layer_range.layer_start, s.layer_range.layer_end_exclusive)
        for s in sorted(plan.stages, key=lambda s: s.stage_index)
    )
    plan_hash = plan.plan_hash or canonical_hash(document)
    return StagePlan(plan_id=plan.plan_id or plan_hash, plan_hash=plan_hash, stages=stages)


def plan_from_message(plan: planner_pb2.Plan) -> StagePlan:
    if not plan.stages:
        raise PlanInvalidError("plan has no stages", field="plan")
    if not plan.plan_hash:
        raise PlanInvalidError("a typed plan must carry its plan_hash", field="plan.plan_hash")
    stages = tuple(
        StageRange(s.stage_index, s.layer_range.layer_start, s.layer_range.layer_end_exclusive)
        for s in sorted(plan.stages, key=lambda s: s.stage_index)
    )
    return StagePlan(plan_id=plan.plan_id or plan.plan_hash, plan_hash=plan.plan_hash, stages=stages)


def plan_from_request(request: pb.BuildStageArtifactsRequest) -> StagePlan:
    given = [bool(request.plan_json), bool(request.layer_ranges), request.HasField("plan")]
    if sum(given) != 1:
        raise PlanInvalidError("give exactly one of plan, plan_json or layer_ranges", field="plan")
    if request.HasField("plan"):
        return plan_from_message(request.plan)
    if request.plan_json:
        return plan_from_json(request.plan_json)
    return plan_from_ranges(tuple((r.layer_start, r.layer_end_exclusive) for r in request.layer_ranges))


BACKEND_NAMES = {common_pb2.BACKEND_MAX: "max", common_pb2.BACKEND_NUMPY: "numpy"}


def stage_backends(request: pb.BuildStageArtifactsRequest) -> tuple[str, ...]:
    """Each stage's backend ("max" or "numpy"): a typed plan's, or `stage_backends` beside layer
    ranges (one per range); empty otherwise (every stage then holds the policy's formats as chosen)."""
    if request.stage_backends:
        if request.HasField("plan") or len(request.stage_backends) != len(request.layer_ranges):
            raise PlanInvalidError(f"stage_backends gives {len(request.stage_backends)} backend(s); it needs one per "
                                   f"layer range ({len(request.layer_ranges)}), and a typed plan names its own",
                                   field="stage_backends")
        unknown = [b for b in request.stage_backends if b not in BACKEND_NAMES]
        if unknown:
            raise PlanInvalidError(f"stage_backends holds unknown backend value(s) {unknown}", field="stage_backends")
        return tuple(BACKEND_NAMES[b] for b in request.stage_backends)
    if not request.HasField("plan"):
        return ()
    found = [BACKEND_NAMES.get(stage.backend, "") for stage in request.plan.stages]
    return tuple(found) if all(found) else ()


def boundary_dtype_from_pb(value: int) -> DType:
    return dtype_from_pb(value, "boundary_dtype", reason=PlanInvalidError.default_reason, error=PlanInvalidError)


def _digest(record: FileRecord) -> pb.FileDigest:
    return pb.FileDigest(path=record.path, sha256=record.sha256, size_bytes=record.size_bytes)


def snapshot_to_pb(snapshot: CheckpointSnapshot) -> pb.CheckpointSnapshot:
    return pb.CheckpointSnapshot(
        snapshot_id=snapshot.snapshot_id,
        checkpoint_dir=str(snapshot.checkpoint_dir),
        source=snapshot.source,
        revision=snapshot.revision,
        config_sha256=snapshot.config_sha256,
        tokenizer_sha256=snapshot.tokenizer_sha256,
        chat_template_sha256=snapshot.chat_template_sha256,
        weight_index_sha256=snapshot.weight_index_sha256,
        shards=[_digest(s) for s in snapshot.shards],
        num_layers=snapshot.num_layers,
        tensor_count=snapshot.tensor_count,
        total_tensor_bytes=snapshot.total_tensor_bytes,
        tied_embeddings=snapshot.tied_embeddings,
        weight_dtype=snapshot.weight_dtype,
    )


def inspection_to_pb(inspection: Inspection, model_record_id: str = "") -> pb.InspectCheckpointResponse:
    return pb.InspectCheckpointResponse(
        snapshot=snapshot_to_pb(inspection.snapshot),
        valid=inspection.valid,
        problems=[
            pb.TensorProblem(name=p.name, problem=p.problem, expected=p.expected, found=p.found)
            for p in inspection.problems
        ],
        model_record_id=model_record_id,
    )


def event_to_pb(event: BuildProgress | BuildResult) -> pb.BuildStageArtifactsResponse:
    if isinstance(event, BuildProgress):
        return pb.BuildStageArtifactsResponse(
            progress=pb.BuildProgress(
                stage_index=event.stage_index,
                tensors_done=event.tensors_done,
                tensors_total=event.tensors_total,
                bytes_done=event.bytes_done,
                bytes_total=event.bytes_total,
            )
        )
    stages = [
        pb.StageArtifact(
            stage_index=s.stage_index,
            artifact_dir=str(s.artifact_dir),
            manifest_hash=s.manifest_hash,
            layer_range=common_pb2.LayerRange(layer_start=s.layer_start, layer_end_exclusive=s.layer_end),
            weight_bytes=s.weight_bytes,
        )
        for s in event.stages
    ]
    return pb.BuildStageArtifactsResponse(
        result=pb.BuildResult(plan_id=event.plan_id, plan_hash=event.plan_hash, stages=stages)
    )


def verified_to_pb(verified: VerifiedArtifact) -> pb.VerifyArtifactResponse:
    return pb.VerifyArtifactResponse(ok=True, manifest_hash=verified.manifest_hash)


def refused_to_pb(reason: str, detail: str) -> pb.VerifyArtifactResponse:
    return pb.VerifyArtifactResponse(ok=False, reason=reason, detail=detail)


def model_files_to_pb(files: list[tuple[str, bytes]], inspection: Inspection) -> pb.GetModelFilesResponse:
    return pb.GetModelFilesResponse(
        files=[pb.ModelFile(path=name, content=data, sha256=hashlib.sha256(data).hexdigest()) for name, data in files],
        snapshot=snapshot_to_pb(inspection.snapshot),
    )
