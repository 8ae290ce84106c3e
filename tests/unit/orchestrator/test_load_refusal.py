"""What a failed LoadStage becomes: a worker lost mid-load (its process ended, e.g. killed by
its host's memory limit) names the stage and the worker, instead of a bare socket error."""

from __future__ import annotations

import grpc
from grpc.aio import AioRpcError, Metadata

from libs.service.errors import FailedPrecondition, Unavailable
from libs.service.interceptors import REASON_METADATA_KEY
from services.orchestrator.route.stage_chain import _load_refusal


def _error(code: grpc.StatusCode, details: str, reason: str | None = None) -> AioRpcError:
    trailing = Metadata((REASON_METADATA_KEY, reason)) if reason else Metadata()
    return AioRpcError(code, Metadata(), trailing, details)


def test_a_worker_lost_while_loading_is_named_with_its_stage():
    refusal = _load_refusal(2, "198.19.60.10:43003",
                            _error(grpc.StatusCode.UNAVAILABLE, "Stream removed (Socket closed)"))
    assert isinstance(refusal, Unavailable) and refusal.reason == "STAGE_WORKER_LOST"
    assert "stage 2" in refusal.message and "198.19.60.10:43003" in refusal.message
    assert "Stream removed (Socket closed)" in refusal.message


def test_a_precondition_refusal_keeps_the_workers_reason():
    refusal = _load_refusal(1, "w:1", _error(grpc.StatusCode.FAILED_PRECONDITION, "no room",
                                               "INSUFFICIENT_MEMORY_FOR_OVERLAP"))
    assert isinstance(refusal, FailedPrecondition) and refusal.reason == "INSUFFICIENT_MEMORY_FOR_OVERLAP"
    assert refusal.message == "stage 1 refused the load: no room"


def test_a_reasoned_unavailable_and_other_codes_pass_through():
    reasoned = _error(grpc.StatusCode.UNAVAILABLE, "busy", "ARTIFACT_SOURCE_UNAVAILABLE")
    assert _load_refusal(0, "w:1", reasoned) is reasoned
    internal = _error(grpc.StatusCode.INTERNAL, "bug")
    assert _load_refusal(0, "w:1", internal) is internal
