from __future__ import annotations

import asyncio
import dataclasses

import grpc
import pytest

from fornax.orchestrator.v1 import orchestrator_pb2 as pb
from fornax.orchestrator.v1 import orchestrator_pb2_grpc as pb_grpc
from libs.service.config import ServerConfig
from libs.service.interceptors import reason_of
from libs.service.server import build_server
from services.orchestrator.config import OrchestratorConfig
from services.orchestrator.route.settings import InprocessSettings, RouteSettings
from services.orchestrator.server import make_spec

pytestmark = pytest.mark.integration
LONG = "0b7a3c4e-8f51-4d2a-9c6e-1f2a3b4c5d6e"


async def _serve(checkpoint):
    cfg = OrchestratorConfig(server=ServerConfig("orchestrator", insecure=True), route=RouteSettings(model_id="tiny"),
                             inprocess=InprocessSettings(checkpoint=str(checkpoint), stages=2))
    spec = await make_spec(cfg)
    running = await build_server(cfg.server, spec)
    return running, spec


async def _close(running, spec):
    await running.server.stop(grace=None)
    await spec.on_stop()


def test_generate_streams_and_cancel_releases(checkpoint):
    async def main():
        running, spec = await _serve(checkpoint)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
                stub = pb_grpc.OrchestratorServiceStub(channel)
                sampling = pb.SamplingParams(max_tokens=6)
                events = [e async for e in stub.Generate(pb.GenerateRequest(
                    model="tiny", text="hello", chat=True, sampling=sampling))]
                call = stub.Generate(pb.GenerateRequest(
                    request_id=LONG, model="tiny", token_ids=pb.TokenIds(ids=[5, 6, 7]),
                    sampling=pb.SamplingParams(max_tokens=1500)))
                await call.read()
                cancelled = await stub.Cancel(pb.CancelRequest(target_request_id=LONG))
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    while await call.read() is not grpc.aio.EOF:
                        pass
                with pytest.raises(grpc.aio.AioRpcError) as bad:
                    await stub.Generate(pb.GenerateRequest(model="other", text="x")).read()
                with pytest.raises(grpc.aio.AioRpcError) as bad_id:
                    await stub.Generate(pb.GenerateRequest(request_id="Long", model="tiny",
                                                           text="x")).read()
                status = await stub.GetPlanStatus(pb.GetPlanStatusRequest())
            return events, cancelled, info.value, bad.value, bad_id.value, status
        finally:
            await _close(running, spec)

    events, cancelled, error, bad, bad_id, status = asyncio.run(main())
    assert reason_of(bad_id) == "INVALID_REQUEST_ID"
    final = events[-1]
    assert final.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH)
    assert final.usage.completion_tokens == sum(len(e.token_ids) for e in events)
    assert final.usage.prompt_tokens > 0
    assert cancelled.found
    assert error.code() is grpc.StatusCode.CANCELLED and reason_of(error) == "CANCELLED"
    assert bad.code() is grpc.StatusCode.NOT_FOUND and reason_of(bad) == "MODEL_NOT_FOUND"
    assert status.current.state == pb.ROUTE_STATE_SERVING


def test_generate_without_route_is_unavailable(checkpoint):
    async def main():
        cfg = OrchestratorConfig(server=ServerConfig("orchestrator", insecure=True))
        spec = await make_spec(dataclasses.replace(cfg))
        running = await build_server(cfg.server, spec)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
                stub = pb_grpc.OrchestratorServiceStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.Generate(pb.GenerateRequest(model="fornax", text="x")).read()
                return info.value
        finally:
            await _close(running, spec)

    error = asyncio.run(main())
    assert error.code() is grpc.StatusCode.UNAVAILABLE
    assert reason_of(error) == "ROUTE_NOT_READY"


def test_install_drain_rollback_over_grpc(checkpoint):
    from fornax.common.v1 import common_pb2

    async def main():
        running, spec = await _serve(checkpoint)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
                stub = pb_grpc.OrchestratorServiceStub(channel)
                installed = await stub.InstallPlan(pb.InstallPlanRequest(
                    checkpoint_dir=str(checkpoint), stages=1,
                    backend=common_pb2.BACKEND_NUMPY, boundary_dtype=common_pb2.ELEMENT_TYPE_FP32))
                drained = await stub.DrainPlan(pb.DrainPlanRequest(timeout_ns=10**10))
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.Generate(pb.GenerateRequest(model="tiny", text="x")).read()
                rolled = await stub.RollbackPlan(pb.RollbackPlanRequest())
                events = [e async for e in stub.Generate(pb.GenerateRequest(
                    model="tiny", text="x", sampling=pb.SamplingParams(max_tokens=3)))]
                with pytest.raises(grpc.aio.AioRpcError) as bad:
                    await stub.InstallPlan(pb.InstallPlanRequest(checkpoint_dir="x", stages=1))
            return installed.status, drained.status, refused.value, rolled.status, events, bad.value
        finally:
            await _close(running, spec)

    installed, drained, refused, rolled, events, bad = asyncio.run(main())
    assert installed.state == pb.ROUTE_STATE_SERVING
    assert drained.state == pb.ROUTE_STATE_DRAINED
    assert refused.code() is grpc.StatusCode.UNAVAILABLE and reason_of(refused) == "NOT_ADMITTING"
    assert rolled.state == pb.ROUTE_STATE_SERVING
    assert rolled.plan.plan_generation_id not in ("", installed.plan.plan_generation_id)
    assert events[-1].usage.completion_tokens >= 1
    assert reason_of(bad) == "INVALID_BACKEND"
