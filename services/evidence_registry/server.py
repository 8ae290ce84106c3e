"""EvidenceRegistryService servicer: convert, call the registry core, convert back.

Store calls block (SQLite commits and blob fsyncs), so each runs on a worker thread and the
event loop keeps serving; the SQLite store keeps one connection per thread.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import structlog
from prometheus_client import Counter

from fornax.evidence_registry.v1 import evidence_registry_pb2 as pb
from fornax.evidence_registry.v1 import evidence_registry_pb2_grpc as pb_grpc
from libs.service.server import ServiceSpec
from services.evidence_registry import convert
from services.evidence_registry.blobs import DiskBlobStore
from services.evidence_registry.config import RegistryConfig
from services.evidence_registry.registry import EvidenceRegistry, RegistryLimits
from services.evidence_registry.signatures import SignaturePolicy
from services.evidence_registry.sqlite_store import SqliteRecordStore

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["EvidenceRegistryService"].full_name
RECORDS_PUT = Counter("fornax_evidence_records_put_total", "Records stored (or re-put)", ["type", "evidence_class"])
RESOLUTIONS = Counter("fornax_evidence_resolutions_total", "Resolution answers by reason", ["reason"])

log = structlog.get_logger()


class EvidenceRegistryServicer(pb_grpc.EvidenceRegistryServiceServicer):
    def __init__(self, registry: EvidenceRegistry):
        self._registry = registry

    async def PutRecord(self, request, context) -> pb.PutRecordResponse:
        command = convert.put_command_from_proto(request)
        record = await asyncio.to_thread(self._registry.put, command, time.time_ns())
        RECORDS_PUT.labels(record.content.type.value, record.content.evidence_class.value).inc()
        log.info("record_put", record_id=record.record_id, type=record.content.type.value,
                 evidence_class=record.content.evidence_class.value, blob_sha256=record.blob.digest,
                 blob_size_bytes=record.blob.size_bytes)
        return pb.PutRecordResponse(record=convert.record_to_proto(record))

    async def GetRecord(self, request, context) -> pb.GetRecordResponse:
        record, blob = await asyncio.to_thread(self._registry.get, request.record_id, request.include_blob)
        return pb.GetRecordResponse(record=convert.record_to_proto(record), blob=blob or b"")

    async def ListRecords(self, request, context) -> pb.ListRecordsResponse:
        page = await asyncio.to_thread(self._registry.list, convert.list_query_from_proto(request))
        return convert.list_page_to_proto(page)

    async def RevokeRecord(self, request, context) -> pb.RevokeRecordResponse:
        record = await asyncio.to_thread(self._registry.revoke, convert.revoke_command_from_proto(request))
        log.info("record_revoked", record_id=record.record_id, reason=record.revocation_reason)
        return pb.RevokeRecordResponse(record=convert.record_to_proto(record))

    async def ResolveRecords(self, request, context) -> pb.ResolveRecordsResponse:
        expectations = convert.expectations_from_proto(request)
        at_unix_ns = convert.resolve_instant(request, time.time_ns())
        outcome = await asyncio.to_thread(self._registry.resolve, expectations, at_unix_ns)
        for resolution in outcome.resolutions:
            RESOLUTIONS.labels(resolution.reason_code or "OK").inc()
        if not outcome.all_ok:
            log.info("records_unresolved", failures=[f"{r.record_id}:{r.reason_code}" for r in outcome.failures])
        return convert.resolve_outcome_to_proto(outcome)


def open_registry(cfg: RegistryConfig) -> EvidenceRegistry:
    records = SqliteRecordStore(Path(cfg.db_path), busy_timeout_ms=cfg.sqlite_busy_timeout_ms)
    limits = RegistryLimits(max_blob_bytes=cfg.max_blob_bytes)
    blobs = DiskBlobStore(Path(cfg.blob_dir))
    swept = blobs.sweep(records.referenced_blobs())
    log.info("blob_store_swept", temp_files_removed=swept.temp_files_removed,
             unreferenced_blobs_removed=swept.unreferenced_blobs_removed)
    ca_pem = Path(cfg.evidence_ca).read_bytes() if cfg.evidence_ca else None
    return EvidenceRegistry(records, blobs, limits, SignaturePolicy(ca_pem))


async def make_spec(cfg: RegistryConfig, registry: EvidenceRegistry | None = None) -> ServiceSpec:
    """`registry` lets tests serve an in-memory registry; by default the durable one is opened."""
    registry = registry or open_registry(cfg)
    servicer = EvidenceRegistryServicer(registry)

    async def close() -> None:
        registry.records.close()

    return ServiceSpec(
        service_names=(SERVICE_NAME,),
        register=lambda server: pb_grpc.add_EvidenceRegistryServiceServicer_to_server(servicer, server),
        on_stop=close,
    )
