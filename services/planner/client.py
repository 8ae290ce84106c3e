"""Planner client for other services: domain values in, domain values out.

    async with AsyncPlannerClient(address) as planner:
        result = await planner.create_plan(model, inventory, target)   # a PlanResult
        if result.feasible:
            plan = await planner.get_plan(result.plan.plan_id)

CreatePlan carries a request id and planning is deterministic, so UNAVAILABLE is retried with
backoff; any other status is raised as `PlannerCallFailed` with the server's reason.
"""

from __future__ import annotations

import asyncio
import uuid

import grpc
from fornax.planner.v1 import planner_pb2 as pb
from fornax.planner.v1 import planner_pb2_grpc as pb_grpc

from libs.service.errors import FornaxError
from libs.service.interceptors import reason_of
from services.planner import convert, domain
from services.planner.inventory import Inventory, Target
from services.planner.model import ModelDescription


class PlannerCallFailed(FornaxError):
    def __init__(self, rpc: str, error: grpc.aio.AioRpcError) -> None:
        super().__init__(f"planner {rpc}: {error.details()}", reason=reason_of(error) or f"PLANNER_{error.code().name}")
        self.code = error.code()


def create_plan_request(model: ModelDescription, inventory: Inventory, target: Target,
                        request_id: str | None = None) -> pb.CreatePlanRequest:
    request = pb.CreatePlanRequest(request_id=request_id or uuid.uuid4().hex, target=convert.target_to_proto(target))
    request.model.CopyFrom(convert.model_to_proto(model))
    convert.inventory_to_request(inventory, request)
    return request


class AsyncPlannerClient:
    def __init__(self, address: str, timeout_s: float = 60.0, attempts: int = 3, backoff_s: float = 0.1) -> None:
        self._channel = grpc.aio.insecure_channel(address)
        self._stub = pb_grpc.PlannerServiceStub(self._channel)
        self._timeout_s, self._attempts, self._backoff_s = timeout_s, attempts, backoff_s

    async def __aenter__(self) -> AsyncPlannerClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def _call(self, rpc: str, request):
        for attempt in range(self._attempts):
            try:
                return await getattr(self._stub, rpc)(request, timeout=self._timeout_s)
            except grpc.aio.AioRpcError as error:
                if error.code() is not grpc.StatusCode.UNAVAILABLE or attempt + 1 == self._attempts:
                    raise PlannerCallFailed(rpc, error) from None
                await asyncio.sleep(self._backoff_s * 2**attempt)
        raise AssertionError("unreachable")

    async def create_plan(self, model: ModelDescription, inventory: Inventory, target: Target,
                          request_id: str | None = None) -> domain.PlanResult:
        request = create_plan_request(model, inventory, target, request_id)
        return convert.result_from_proto(await self._call("CreatePlan", request))

    async def get_plan(self, plan_id: str) -> domain.Plan:
        response = await self._call("GetPlan", pb.GetPlanRequest(plan_id=plan_id))
        return convert.plan_from_proto(response.plan)
