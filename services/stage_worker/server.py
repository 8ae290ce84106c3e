"""StageWorkerService servicer: convert, call the stage runtime, convert back."""

from __future__ import annotations

from fornax.common.v1 import common_pb2
from fornax.stage_worker.v1 import stage_worker_pb2 as pb
from fornax.stage_worker.v1 import stage_worker_pb2_grpc as pb_grpc

from libs.service.errors import Unimplemented
from libs.service.server import ServiceSpec
from services.stage_worker.config import StageWorkerConfig
from services.stage_worker.device import backend_build, host_facts

_BACKENDS = {"max": common_pb2.BACKEND_MAX, "numpy": common_pb2.BACKEND_NUMPY}


class StageWorkerServicer(pb_grpc.StageWorkerServiceServicer):
    def __init__(self, cfg: StageWorkerConfig):
        self._cfg = cfg

    async def GetCapabilities(self, request, context) -> pb.GetCapabilitiesResponse:
        facts = host_facts()
        return pb.GetCapabilitiesResponse(
            backend=_BACKENDS[self._cfg.backend],
            backend_build=backend_build(self._cfg.backend) or f"{self._cfg.backend} (not installed)",
            device=pb.DeviceInfo(
                kind=self._cfg.device,
                name=facts.cpu_name,
                memory_total_bytes=facts.memory_total_bytes,
                memory_available_bytes=facts.memory_available_bytes,
                cpu_count=facts.cpu_count,
            ),
            fnx2_versions=["2.0"],
            stage_index=self._cfg.stage_index,
        )

    async def GetHealth(self, request, context) -> pb.GetHealthResponse:
        return pb.GetHealthResponse(state=pb.STAGE_STATE_UNLOADED, kv_bytes_limit=self._cfg.kv_limit_bytes)

    async def LoadStage(self, request, context) -> pb.LoadStageResponse:
        raise Unimplemented("LoadStage is not available in this build")

    async def CancelRequest(self, request, context) -> pb.CancelRequestResponse:
        raise Unimplemented("CancelRequest is not available in this build")

    async def ReleaseRequest(self, request, context) -> pb.ReleaseRequestResponse:
        raise Unimplemented("ReleaseRequest is not available in this build")

    async def DrainStage(self, request, context) -> pb.DrainStageResponse:
        raise Unimplemented("DrainStage is not available in this build")

    async def UnloadStage(self, request, context) -> pb.UnloadStageResponse:
        raise Unimplemented("UnloadStage is not available in this build")


async def make_spec(cfg: StageWorkerConfig) -> ServiceSpec:
    servicer = StageWorkerServicer(cfg)
    return ServiceSpec(
        service_names=(pb.DESCRIPTOR.services_by_name["StageWorkerService"].full_name,),
        register=lambda server: pb_grpc.add_StageWorkerServiceServicer_to_server(servicer, server),
    )
