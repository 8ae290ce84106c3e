"""ArtifactBuilderService servicer: convert, call the core, convert back."""

from __future__ import annotations

from fornax.artifact_builder.v1 import artifact_builder_pb2 as pb
from fornax.artifact_builder.v1 import artifact_builder_pb2_grpc as pb_grpc

from libs.service.errors import Unimplemented
from libs.service.server import ServiceSpec
from services.artifact_builder.config import BuilderConfig


class ArtifactBuilderServicer(pb_grpc.ArtifactBuilderServiceServicer):
    def __init__(self, cfg: BuilderConfig):
        self._cfg = cfg

    async def InspectCheckpoint(self, request, context) -> pb.InspectCheckpointResponse:
        raise Unimplemented("InspectCheckpoint is not available in this build")

    async def BuildStageArtifacts(self, request, context):
        raise Unimplemented("BuildStageArtifacts is not available in this build")
        yield  # a server-streaming handler is an async generator

    async def VerifyArtifact(self, request, context) -> pb.VerifyArtifactResponse:
        raise Unimplemented("VerifyArtifact is not available in this build")


async def make_spec(cfg: BuilderConfig) -> ServiceSpec:
    servicer = ArtifactBuilderServicer(cfg)
    return ServiceSpec(
        service_names=(pb.DESCRIPTOR.services_by_name["ArtifactBuilderService"].full_name,),
        register=lambda server: pb_grpc.add_ArtifactBuilderServiceServicer_to_server(servicer, server),
    )
