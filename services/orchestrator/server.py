"""OrchestratorService servicer: convert, call the serving core, convert back."""

from __future__ import annotations

from fornax.orchestrator.v1 import orchestrator_pb2 as pb
from fornax.orchestrator.v1 import orchestrator_pb2_grpc as pb_grpc

from libs.service.errors import Unimplemented
from libs.service.server import ServiceSpec
from services.orchestrator.config import OrchestratorConfig


class OrchestratorServicer(pb_grpc.OrchestratorServiceServicer):
    def __init__(self, cfg: OrchestratorConfig):
        self._cfg = cfg

    async def Generate(self, request, context):
        raise Unimplemented("Generate is not available in this build")
        yield  # a server-streaming handler is an async generator

    async def Cancel(self, request, context) -> pb.CancelResponse:
        raise Unimplemented("Cancel is not available in this build")

    async def InstallPlan(self, request, context) -> pb.InstallPlanResponse:
        raise Unimplemented("InstallPlan is not available in this build")

    async def DrainPlan(self, request, context) -> pb.DrainPlanResponse:
        raise Unimplemented("DrainPlan is not available in this build")

    async def RollbackPlan(self, request, context) -> pb.RollbackPlanResponse:
        raise Unimplemented("RollbackPlan is not available in this build")

    async def GetPlanStatus(self, request, context) -> pb.GetPlanStatusResponse:
        return pb.GetPlanStatusResponse(current=pb.PlanStatus(state=pb.ROUTE_STATE_EMPTY))


async def make_spec(cfg: OrchestratorConfig) -> ServiceSpec:
    servicer = OrchestratorServicer(cfg)
    return ServiceSpec(
        service_names=(pb.DESCRIPTOR.services_by_name["OrchestratorService"].full_name,),
        register=lambda server: pb_grpc.add_OrchestratorServiceServicer_to_server(servicer, server),
    )
