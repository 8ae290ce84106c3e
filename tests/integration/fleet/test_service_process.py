"""One service process: graceful SIGTERM within the grace period, and OTLP span export."""

from __future__ import annotations

import json
import signal
import time

import grpc
import pytest

from fornax.planner.v1 import planner_pb2, planner_pb2_grpc
from fornax.stage_worker.v1 import stage_worker_pb2, stage_worker_pb2_grpc
from tests.support.otlp import OtlpReceiver
from tests.support.procs import ServiceProc

pytestmark = pytest.mark.integration

GRACE_S = 3.0


def test_sigterm_stops_cleanly_within_the_grace_period(tmp_path):
    proc = ServiceProc("services.planner", tmp_path, env={"FORNAX_GRACE_PERIOD_S": str(GRACE_S)})
    proc.wait_serving()
    started = time.monotonic()
    proc.process.send_signal(signal.SIGTERM)
    code = proc.process.wait(timeout=GRACE_S + 10)
    elapsed = time.monotonic() - started
    proc.stop()
    assert code == 0
    assert elapsed < GRACE_S + 5
    events = [json.loads(line)["event"] for line in proc.log_lines()]
    assert events.index("service_stopping") < events.index("service_stopped")


def test_spans_reach_an_otlp_receiver_with_service_names(tmp_path):
    with OtlpReceiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
        planner = ServiceProc("services.planner", tmp_path, env=env)
        worker = ServiceProc("services.stage_worker", tmp_path, env=env, args=["--stage-index", "1"])
        try:
            planner_addr, worker_addr = planner.wait_serving(), worker.wait_serving()
            with grpc.insecure_channel(planner_addr) as channel:
                with pytest.raises(grpc.RpcError):
                    planner_pb2_grpc.PlannerServiceStub(channel).GetPlan(planner_pb2.GetPlanRequest(plan_id="x"))
            with grpc.insecure_channel(worker_addr) as channel:
                caps = stage_worker_pb2_grpc.StageWorkerServiceStub(channel).GetCapabilities(
                    stage_worker_pb2.GetCapabilitiesRequest()
                )
            # a numpy worker runs every weight format: the planner checks a policy's formats against these
            assert caps.backend_build.startswith("numpy")
            assert {"q4_k", "q8_0", "bf16", "fp32"} <= set(caps.weight_formats)
        finally:
            planner.stop()
            worker.stop()
        spans = receiver.wait_for(lambda got: len({s.service_name for s in got}) >= 2)
    by_service = {s.service_name: s.name for s in spans}
    assert "fornax-planner" in by_service
    assert "fornax-stage-worker-stage-1" in by_service
    assert "PlannerService/GetPlan" in by_service["fornax-planner"]
