"""PlannerService servicer: convert, call the core, convert back.

Planning is CPU-bound and deployment mode makes a blocking registry call, so each CreatePlan
runs on a worker thread and the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

import structlog
from prometheus_client import Counter

from fornax.planner.v1 import planner_pb2, planner_pb2_grpc
from libs.service.errors import InvalidArgument, NotFound
from libs.service.server import ServiceSpec
from services.evidence_registry.client import ClientOptions
from services.planner import convert, domain
from services.planner.config import PlannerConfig
from services.planner.evidence import Resolver
from services.planner.planner import plan, plan_with_records
from services.planner.registry import RegistryResolver

SERVICE_NAME = planner_pb2.DESCRIPTOR.services_by_name["PlannerService"].full_name


# Why plans came out as they did: PLANNED, the infeasibility reason, and every rejection's reason.
DECISIONS = Counter("fornax_planner_decisions_total", "Placement decisions by reason", ["reason"])


def record_decisions(result) -> None:
    DECISIONS.labels("PLANNED" if result.feasible else (result.infeasibility_reason or "INFEASIBLE")).inc()
    for rejection in result.rejections:
        DECISIONS.labels(rejection.reason).inc()
    for failure in result.evidence_failures:
        DECISIONS.labels(f"EVIDENCE_{failure.reason}").inc()


class PlanStore:
    """Issued plans by id, newest kept; plans are immutable and ids derive from their hash."""

    def __init__(self, capacity: int) -> None:
        self._plans: OrderedDict[str, domain.Plan] = OrderedDict()
        self._capacity = capacity

    def put(self, p: domain.Plan) -> None:
        self._plans[p.plan_id] = p
        self._plans.move_to_end(p.plan_id)
        while len(self._plans) > self._capacity:
            self._plans.popitem(last=False)

    def get(self, plan_id: str) -> domain.Plan:
        try:
            return self._plans[plan_id]
        except KeyError:
            raise NotFound(f"no plan {plan_id!r}", reason="PLAN_NOT_FOUND", field="plan_id") from None


class PlannerServicer(planner_pb2_grpc.PlannerServiceServicer):
    def __init__(self, resolver: Resolver | None, store: PlanStore):
        self._resolver = resolver
        self._store = store
        self._log = structlog.get_logger()

    async def CreatePlan(self, request, context) -> planner_pb2.CreatePlanResponse:
        model = convert.model_from_proto(request.model)
        inventory = convert.inventory_from_request(request)
        target = convert.target_from_proto(request.target)
        records = convert.profiles_from_request(request)
        if records is None:
            result = await asyncio.to_thread(plan, model, inventory, target, self._resolver)
        else:
            result = await asyncio.to_thread(plan_with_records, model, inventory, target, self._resolver, records)
        if result.plan is not None:
            self._store.put(result.plan)
        record_decisions(result)
        self._log.info("plan_created", request_id=request.request_id, feasible=result.feasible, mode=target.mode,
                       plan_id=result.plan.plan_id if result.plan else "", reason=result.infeasibility_reason,
                       rejections=len(result.rejections), evidence_failures=len(result.evidence_failures))
        return convert.result_to_proto(result)

    async def GetPlan(self, request, context) -> planner_pb2.GetPlanResponse:
        if not request.plan_id:
            raise InvalidArgument("plan_id is required", field="plan_id")
        return planner_pb2.GetPlanResponse(plan=convert.plan_to_proto(self._store.get(request.plan_id)))


async def make_spec(cfg: PlannerConfig, resolver: Resolver | None = None) -> ServiceSpec:
    """`resolver` lets tests inject one; by default the configured registry address is used."""
    if resolver is None and cfg.registry_addr:
        resolver = RegistryResolver(cfg.registry_addr, ClientOptions(channel=cfg.server.client_channel()))
    servicer = PlannerServicer(resolver, PlanStore(cfg.plan_store_capacity))
    return ServiceSpec(
        service_names=(SERVICE_NAME,),
        register=lambda server: planner_pb2_grpc.add_PlannerServiceServicer_to_server(servicer, server),
    )
