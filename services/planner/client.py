"""Planner client for other services: domain values in, domain values out.

    async with AsyncPlannerClient(address) as planner:
        result = await planner.create_plan(model, inventory, target)   # a PlanResult
        if result.feasible:
            plan = await planner.get_plan(result.plan.plan_id)

CreatePlan carries a request id and planning is deterministic, so every planner RPC is
idempotent: the channel retries UNAVAILABLE and RESOURCE_EXHAUSTED with backoff; any failure
left after that is raised as `PlannerCallFailed` with the server's reason.
"""

from __future__ import annotations

import uuid

import grpc

from fornax.planner.v1 import planner_pb2 as pb
from fornax.planner.v1 import planner_pb2_grpc as pb_grpc
from libs.service.channels import ChannelConfig, open_aio_channel, rpc_errors_as
from libs.service.errors import FornaxError
from libs.service.interceptors import reason_of
from services.planner import convert, domain
from services.planner.inventory import Inventory, Target
from services.planner.model import ModelDescription
from services.planner.profiles import ProfileRecordInput

PLANNER_SERVICE = pb.DESCRIPTOR.services_by_name["PlannerService"].full_name


class PlannerCallFailed(FornaxError):
    def __init__(self, rpc: str, error: grpc.RpcError) -> None:
        super().__init__(f"planner {rpc}: {error.details()}", reason=reason_of(error) or f"PLANNER_{error.code().name}")
        self.code = error.code()


def create_plan_request(model: ModelDescription, inventory: Inventory, target: Target,
                        request_id: str | None = None,
                        profiles: list[ProfileRecordInput] | None = None) -> pb.CreatePlanRequest:
    """`profiles` (even empty) asks the planner to plan from measured profile records."""
    request = pb.CreatePlanRequest(request_id=request_id or uuid.uuid4().hex, target=convert.target_to_proto(target))
    request.model.CopyFrom(convert.model_to_proto(model))
    convert.inventory_to_request(inventory, request)
    if profiles is not None:
        convert.profiles_to_request(profiles, request)
    return request


class AsyncPlannerClient:
    def __init__(self, address: str, timeout_s: float = 60.0, channel: ChannelConfig = ChannelConfig()) -> None:
        self._channel = open_aio_channel(address, channel, idempotent=(PLANNER_SERVICE,))
        self._stub = pb_grpc.PlannerServiceStub(self._channel)
        self._timeout_s = timeout_s

    async def __aenter__(self) -> AsyncPlannerClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def create_plan(self, model: ModelDescription, inventory: Inventory, target: Target,
                          request_id: str | None = None,
                          profiles: list[ProfileRecordInput] | None = None) -> domain.PlanResult:
        request = create_plan_request(model, inventory, target, request_id, profiles)
        with rpc_errors_as(lambda error: PlannerCallFailed("CreatePlan", error)):
            response = await self._stub.CreatePlan(request, timeout=self._timeout_s)
        return convert.result_from_proto(response)

    async def get_plan(self, plan_id: str) -> domain.Plan:
        with rpc_errors_as(lambda error: PlannerCallFailed("GetPlan", error)):
            response = await self._stub.GetPlan(pb.GetPlanRequest(plan_id=plan_id), timeout=self._timeout_s)
        return convert.plan_from_proto(response.plan)
