"""PlannerService servicer: convert, call the core, convert back."""

from __future__ import annotations

from fornax.planner.v1 import planner_pb2, planner_pb2_grpc

from libs.service.errors import Unimplemented
from libs.service.server import ServiceSpec
from services.planner.config import PlannerConfig


class PlannerServicer(planner_pb2_grpc.PlannerServiceServicer):
    def __init__(self, cfg: PlannerConfig):
        self._cfg = cfg

    async def CreatePlan(self, request, context) -> planner_pb2.CreatePlanResponse:
        raise Unimplemented("CreatePlan is not available in this build")

    async def GetPlan(self, request, context) -> planner_pb2.GetPlanResponse:
        raise Unimplemented("GetPlan is not available in this build")


async def make_spec(cfg: PlannerConfig) -> ServiceSpec:
    servicer = PlannerServicer(cfg)
    return ServiceSpec(
        service_names=(planner_pb2.DESCRIPTOR.services_by_name["PlannerService"].full_name,),
        register=lambda server: planner_pb2_grpc.add_PlannerServiceServicer_to_server(servicer, server),
    )
