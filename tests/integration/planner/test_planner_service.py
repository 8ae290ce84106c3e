"""PlannerService over real sockets on 127.0.0.1:0 (in-process server, grpc.aio client)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from apps.bench.planner import synthetic_model
from fornax.common.v1 import common_pb2
from fornax.planner.v1 import planner_pb2 as pb
from fornax.planner.v1 import planner_pb2_grpc as pb_grpc
from libs.service.config import ServerConfig
from libs.service.interceptors import reason_of
from libs.service.server import build_server
from services.planner import convert
from services.planner.client import AsyncPlannerClient, PlannerCallFailed
from services.planner.config import PlannerConfig
from services.planner.inventory import load_inventory_file
from services.planner.planner import plan
from services.planner.server import SERVICE_NAME, make_spec

EXAMPLES = Path(__file__).resolve().parents[3] / "services" / "planner" / "examples"


def request_for(example: str, *, mode: str | None = None, layers: int = 27) -> pb.CreatePlanRequest:
    loaded = load_inventory_file(EXAMPLES / example, mode=mode)
    request = pb.CreatePlanRequest(request_id="req-1", target=convert.target_to_proto(loaded.target))
    request.model.CopyFrom(convert.model_to_proto(synthetic_model(layers, experts=64, top_k=6)))
    convert.inventory_to_request(loaded.inventory, request)
    return request


async def with_planner(scenario, registry_addr: str | None = None, *, by_address: bool = False):
    cfg = PlannerConfig(server=ServerConfig("planner", host="127.0.0.1", grpc_port=0, insecure=True),
                        registry_addr=registry_addr)
    running = await build_server(cfg.server, await make_spec(cfg))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            status = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=10)
            assert status.status == health_pb2.HealthCheckResponse.SERVING
            if by_address:
                return await scenario(f"127.0.0.1:{running.port}")
            return await scenario(pb_grpc.PlannerServiceStub(channel))
    finally:
        await running.server.stop(None)


async def _error(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


def test_create_then_get_plan():
    async def scenario(stub):
        created = await stub.CreatePlan(request_for("mixed_fleet.yaml"), timeout=30)
        fetched = await stub.GetPlan(pb.GetPlanRequest(plan_id=created.plan.plan_id), timeout=10)
        return created, fetched

    created, fetched = asyncio.run(with_planner(scenario))
    assert created.feasible
    assert [(r.subject, r.reason) for r in created.rejections] == [("cpu-server", "MISSING_DTYPE")]
    plan = created.plan
    assert plan.mode == pb.PLAN_MODE_EXPLORATORY and plan.label.startswith("exploratory")
    assert plan.stages[0].layer_range.layer_start == 0 and plan.stages[-1].layer_range.layer_end_exclusive == 27
    assert all(f.prediction and f.evidence_class == common_pb2.EVIDENCE_CLASS_REFERENCE for f in plan.predictions)
    assert {f.name for f in plan.predictions} >= {"decode_tokens_per_s", "ttft_s", "bubble_fraction"}
    assert fetched.plan == plan


def test_infeasible_is_a_normal_answer_with_the_shortfall():
    async def scenario(stub):
        request = request_for("mixed_fleet.yaml", layers=200)
        return await stub.CreatePlan(request, timeout=30)

    response = asyncio.run(with_planner(scenario))
    assert not response.feasible and not response.HasField("plan")
    assert response.infeasibility_reason == "INSUFFICIENT_MEMORY" and response.shortfall_bytes > 0


def test_bad_input_and_unknown_plan_are_specific_errors():
    async def scenario(stub):
        bad_target = request_for("mixed_fleet.yaml")
        bad_target.target.context_tokens = 0
        untyped = request_for("mixed_fleet.yaml")
        untyped.inventory.nodes[0].evidence_record_ids.append("rec-1")
        no_layers = request_for("mixed_fleet.yaml")
        del no_layers.model.layers[:]
        return [
            await _error(stub.CreatePlan(bad_target, timeout=10)),
            await _error(stub.CreatePlan(untyped, timeout=10)),
            await _error(stub.CreatePlan(no_layers, timeout=10)),
            await _error(stub.GetPlan(pb.GetPlanRequest(plan_id="plan-missing"), timeout=10)),
            await _error(stub.CreatePlan(request_for("deployment_fleet.yaml"), timeout=10)),
        ]

    bad_target, untyped, no_layers, missing, no_registry = asyncio.run(with_planner(scenario))
    assert bad_target.code() == grpc.StatusCode.INVALID_ARGUMENT and "target.context_tokens" in bad_target.details()
    assert untyped.code() == grpc.StatusCode.INVALID_ARGUMENT and reason_of(untyped) == "UNTYPED_EVIDENCE"
    assert "inventory.nodes[0].evidence_record_ids" in untyped.details()
    assert no_layers.code() == grpc.StatusCode.INVALID_ARGUMENT and "model.layers" in no_layers.details()
    assert missing.code() == grpc.StatusCode.NOT_FOUND and reason_of(missing) == "PLAN_NOT_FOUND"
    assert no_registry.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason_of(no_registry) == "NO_EVIDENCE_REGISTRY"


def test_client_returns_domain_values_and_reasons():
    loaded = load_inventory_file(EXAMPLES / "mixed_fleet.yaml")
    model = synthetic_model(27, experts=64, top_k=6)

    async def scenario(address):
        async with AsyncPlannerClient(address) as planner:
            result = await planner.create_plan(model, loaded.inventory, loaded.target)
            fetched = await planner.get_plan(result.plan.plan_id)
            with pytest.raises(PlannerCallFailed) as err:
                await planner.get_plan("plan-none")
            return result, fetched, err.value

    result, fetched, error = asyncio.run(with_planner(scenario, by_address=True))
    local = plan(model, loaded.inventory, loaded.target)
    assert result.plan.plan_hash == local.plan.plan_hash == fetched.plan_hash
    assert result.rejections == local.rejections
    assert [(s.node, s.layer_start, s.layer_end) for s in fetched.stages] == [
        (s.node, s.layer_start, s.layer_end) for s in local.plan.stages]
    assert error.reason == "PLAN_NOT_FOUND" and error.code == grpc.StatusCode.NOT_FOUND
