"""EvidenceRegistryService servicer: convert, call the store, convert back."""

from __future__ import annotations

from fornax.evidence_registry.v1 import evidence_registry_pb2 as pb
from fornax.evidence_registry.v1 import evidence_registry_pb2_grpc as pb_grpc

from libs.service.errors import Unimplemented
from libs.service.server import ServiceSpec
from services.evidence_registry.config import RegistryConfig


class EvidenceRegistryServicer(pb_grpc.EvidenceRegistryServiceServicer):
    def __init__(self, cfg: RegistryConfig):
        self._cfg = cfg

    async def PutRecord(self, request, context) -> pb.PutRecordResponse:
        raise Unimplemented("PutRecord is not available in this build")

    async def GetRecord(self, request, context) -> pb.GetRecordResponse:
        raise Unimplemented("GetRecord is not available in this build")

    async def ListRecords(self, request, context) -> pb.ListRecordsResponse:
        raise Unimplemented("ListRecords is not available in this build")

    async def RevokeRecord(self, request, context) -> pb.RevokeRecordResponse:
        raise Unimplemented("RevokeRecord is not available in this build")

    async def ResolveRecords(self, request, context) -> pb.ResolveRecordsResponse:
        raise Unimplemented("ResolveRecords is not available in this build")


async def make_spec(cfg: RegistryConfig) -> ServiceSpec:
    servicer = EvidenceRegistryServicer(cfg)
    return ServiceSpec(
        service_names=(pb.DESCRIPTOR.services_by_name["EvidenceRegistryService"].full_name,),
        register=lambda server: pb_grpc.add_EvidenceRegistryServiceServicer_to_server(servicer, server),
    )
