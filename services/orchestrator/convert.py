"""Protobuf <-> domain conversions for OrchestratorService. Protobuf stops here."""

from __future__ import annotations

import uuid

from fornax.common.v1 import common_pb2
from fornax.orchestrator.v1 import orchestrator_pb2 as pb
from libs.common.proto import backend_from_pb, dtype_from_pb
from libs.service.errors import InvalidArgument
from libs.text.chat_template import ChatMessage
from services.orchestrator.api.openai_request import check_model, check_token_ids, generation_request, parse_options
from services.orchestrator.engine.client import EngineClient
from services.orchestrator.engine.domain import FinishReason, GenerationRequest, RequestOutput
from services.orchestrator.engine.drift import Calibration, RouteCalibration
from services.orchestrator.route.host_change import RemovalReason, RemovedRoute
from services.orchestrator.route.host_drain import HostDrainOutcome
from services.orchestrator.route.lifecycle import InstallRequest, RouteState, RouteStatus

_FINISH = {FinishReason.STOP: pb.FINISH_REASON_STOP, FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
           FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED,
           FinishReason.DEADLINE: pb.FINISH_REASON_ERROR,
           FinishReason.REJECTED: pb.FINISH_REASON_ERROR,
           FinishReason.UNAVAILABLE: pb.FINISH_REASON_ERROR,
           FinishReason.ERROR: pb.FINISH_REASON_ERROR}


def generation_from_pb(request: pb.GenerateRequest, engine: EngineClient) -> GenerationRequest:
    """Validates like the HTTP API does; proto3 zeros mean "unset" (top_p 0 -> 1)."""
    check_model(request.model, engine.served)
    sampling = request.sampling
    fields = {"temperature": sampling.temperature, "top_p": sampling.top_p or 1.0,
              "top_k": sampling.top_k, "max_tokens": sampling.max_tokens or None,
              "stop": list(sampling.stop) or None,
              "seed": sampling.seed if sampling.HasField("seed") else None}
    options = parse_options(fields)
    text = engine.text
    which = request.WhichOneof("prompt")
    if which == "token_ids":
        ids = check_token_ids(tuple(request.token_ids.ids), engine.served, "token_ids")
    elif request.chat:
        ids = tuple(text.encode_chat([ChatMessage("user", request.text)]))
    else:
        ids = tuple(text.tokenizer.encode(request.text))
    return generation_request(
        _request_id(request.request_id), ids, options, engine.served,
        engine.config.token_limits, "token_ids" if which == "token_ids" else "text",
        request.deadline_budget_ns or None)


def _request_id(given: str) -> str:
    """Request ids are canonical lower-case UUIDs, as FNX2 requires; one is made if absent."""
    if not given:
        return str(uuid.uuid4())
    try:
        canonical = str(uuid.UUID(given))
    except ValueError:
        canonical = ""
    if canonical != given:
        raise InvalidArgument(f"request_id {given!r} is not a canonical lower-case UUID",
                              reason="INVALID_REQUEST_ID", field="request_id")
    return given


def output_to_pb(output: RequestOutput) -> pb.GenerateResponse:
    response = pb.GenerateResponse(text_delta=output.text, token_ids=list(output.token_ids))
    if output.finished and output.finish_reason is not None:
        response.finish_reason = _FINISH[output.finish_reason]
        response.usage.prompt_tokens = output.prompt_tokens
        response.usage.completion_tokens = output.completion_tokens
    return response


_STATE = {RouteState.EMPTY: pb.ROUTE_STATE_EMPTY, RouteState.INSTALLING: pb.ROUTE_STATE_INSTALLING,
          RouteState.SERVING: pb.ROUTE_STATE_SERVING, RouteState.DRAINING: pb.ROUTE_STATE_DRAINING,
          RouteState.DRAINED: pb.ROUTE_STATE_DRAINED, RouteState.FAILED: pb.ROUTE_STATE_FAILED,
          RouteState.DEGRADED: pb.ROUTE_STATE_DEGRADED}


def install_request_from_pb(request: pb.InstallPlanRequest) -> InstallRequest:
    if not request.checkpoint_dir:
        raise InvalidArgument("checkpoint_dir is required", reason="INVALID_CHECKPOINT",
                              field="checkpoint_dir")
    if request.stages < 1:
        raise InvalidArgument("stages must be at least 1", reason="INVALID_STAGES",
                              field="stages")
    backend = backend_from_pb(request.backend, "backend")
    boundary = dtype_from_pb(request.boundary_dtype, "boundary_dtype", reason="INVALID_BOUNDARY_DTYPE")
    return InstallRequest(request.checkpoint_dir, request.stages, backend, boundary,
                          allow_break_before_make=request.allow_break_before_make)


def status_to_pb(status: RouteStatus) -> pb.PlanStatus:
    message = pb.PlanStatus(state=_STATE[status.state],
                            inflight_requests=status.inflight_requests, reason=status.failure)
    if status.plan is not None:
        message.plan.CopyFrom(common_pb2.PlanBinding(
            plan_id=status.plan.plan_id, plan_hash=status.plan.plan_hash,
            plan_generation_id=status.plan.plan_generation_id))
    route_ok = status.state in (RouteState.SERVING, RouteState.DRAINING, RouteState.DRAINED,
                                RouteState.DEGRADED)
    for index, stage in enumerate(status.stages):
        condition = status.stage_conditions[index] if index < len(status.stage_conditions) else ""
        message.stages.append(pb.StageStatus(
            stage_index=stage.index, worker_address=stage.worker_address,
            layer_range=common_pb2.LayerRange(layer_start=stage.layer_start,
                                              layer_end_exclusive=stage.layer_end),
            manifest_hash=stage.manifest_hash, healthy=route_ok and not condition,
            condition=condition))
    if status.calibration is not None:
        message.calibration.CopyFrom(calibration_to_pb(status.calibration))
    message.routes.extend(status_to_pb(route) for route in status.routes)
    message.removed_routes.extend(removed_route_to_pb(route) for route in status.removed)
    return message


_REMOVAL = {RemovalReason.HOST_DRAINED: pb.ROUTE_REMOVAL_REASON_HOST_DRAINED,
            RemovalReason.REJOIN_TIMEOUT: pb.ROUTE_REMOVAL_REASON_REJOIN_TIMEOUT}


def removed_route_to_pb(route: RemovedRoute) -> pb.RemovedRoute:
    return pb.RemovedRoute(worker_addresses=list(route.route), reason=_REMOVAL[route.reason],
                           host_worker_address=route.host, detail=route.detail)


_CALIBRATION = {Calibration.NO_PREDICTION: pb.CALIBRATION_STATE_NO_PREDICTION,
                Calibration.UNMEASURED: pb.CALIBRATION_STATE_UNMEASURED,
                Calibration.CALIBRATED: pb.CALIBRATION_STATE_CALIBRATED,
                Calibration.UNCALIBRATED: pb.CALIBRATION_STATE_UNCALIBRATED}


def calibration_to_pb(calibration: RouteCalibration) -> pb.RouteCalibration:
    message = pb.RouteCalibration(state=_CALIBRATION[calibration.state], reason=calibration.reason,
                                  prediction_basis=calibration.prediction_basis,
                                  relative_bound=calibration.relative_bound)
    for stage in calibration.stages:
        measured = stage.measured
        message.stages.append(pb.StageCalibration(
            stage_index=stage.index, state=_CALIBRATION[stage.state],
            predicted_decode_service_s=stage.predicted_s or 0.0,
            measured_decode_service_s=measured.recent_decode_service_s if measured else 0.0,
            measured_microbatches=measured.recent_microbatches if measured else 0,
            measured_rows_per_microbatch=measured.recent_rows if measured else 0.0))
    return message


def host_drain_to_pb(outcome: HostDrainOutcome, status: RouteStatus) -> pb.DrainHostResponse:
    return pb.DrainHostResponse(
        removed_routes=[pb.RouteWorkers(worker_addresses=list(route)) for route in outcome.decision.leaving],
        finished_requests=outcome.finished, handed_off_requests=outcome.handed_off,
        ended_requests=outcome.ended, stored_route_set=outcome.stored, status=status_to_pb(status),
        largest_gap_ns=round(outcome.largest_gap_s * 1e9))
