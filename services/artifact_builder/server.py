"""ArtifactBuilderService servicer: convert, call the core, convert back.

Inspection, building and verification are blocking file I/O, so each runs on a worker thread;
builds are serialised, since they are disk-bound and share the artifact store.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import structlog

from fornax.artifact_builder.v1 import artifact_builder_pb2 as pb
from fornax.artifact_builder.v1 import artifact_builder_pb2_grpc as pb_grpc
from libs.artifacts.errors import ARTIFACT_ERRORS
from libs.artifacts.transfer import artifact_file, read_chunks
from libs.artifacts.verify import verify_artifact
from libs.security.paths import confine
from libs.service.errors import InvalidArgument
from libs.service.server import ServiceSpec
from libs.weights.policy import DEFAULT_POLICY
from services.artifact_builder import convert
from services.artifact_builder.build import STORE_DIR, BuildOptions, BuildResult, build_stage_artifacts
from services.artifact_builder.config import BuilderConfig
from services.artifact_builder.evidence import register_snapshot
from services.artifact_builder.snapshot import Inspection, inspect_checkpoint, model_files

log = structlog.get_logger()


class ArtifactBuilderServicer(pb_grpc.ArtifactBuilderServiceServicer):
    def __init__(self, cfg: BuilderConfig):
        self._cfg = cfg
        self._build_lock = asyncio.Lock()

    async def _inspect(self, checkpoint_dir: str, source: str, revision: str) -> Inspection:
        if not checkpoint_dir:
            raise InvalidArgument("checkpoint_dir is required", field="checkpoint_dir")
        confine(checkpoint_dir, self._cfg.read_roots, "checkpoint_dir")
        return await asyncio.to_thread(inspect_checkpoint, checkpoint_dir, source, revision)

    async def InspectCheckpoint(self, request, context) -> pb.InspectCheckpointResponse:
        inspection = await self._inspect(request.checkpoint_dir, request.source, request.revision)
        record_id = ""
        if self._cfg.registry_addr and inspection.valid:
            record_id = await asyncio.to_thread(register_snapshot, self._cfg.registry_addr, inspection.snapshot,
                                                self._cfg.server.client_channel())
        log.info("checkpoint_inspected", snapshot_id=inspection.snapshot.snapshot_id,
                 valid=inspection.valid, problems=len(inspection.problems), model_record_id=record_id)
        return convert.inspection_to_pb(inspection, record_id)

    async def BuildStageArtifacts(self, request, context):
        # Paths before anything else: a refused destination is refused whatever the plan says.
        out_dir = confine(request.out_dir or self._cfg.artifact_store, self._cfg.write_roots, "out_dir")
        plan = convert.plan_from_request(request)
        options = BuildOptions(
            # A caller-chosen out_dir is served by no FetchArtifact; workers fetch from the store.
            out_dir=out_dir,
            boundary_dtype=convert.boundary_dtype_from_pb(request.boundary_dtype),
            chunk_bytes=self._cfg.build_chunk_bytes,
            hop_dtypes=tuple(convert.boundary_dtype_from_pb(d) for d in request.hop_boundary_dtypes),
            weights_policy=request.weights_policy or DEFAULT_POLICY,
            stage_policies=tuple(request.stage_weights_policies),
            stage_backends=convert.stage_backends(request),
        )
        async with self._build_lock:
            inspection = await self._inspect(request.checkpoint_dir, request.source, request.revision)
            log.info("build_started", request_id=request.request_id, plan_id=plan.plan_id,
                     snapshot_id=inspection.snapshot.snapshot_id, stages=len(plan.stages))
            events = build_stage_artifacts(inspection, plan, options)
            try:
                while (event := await asyncio.to_thread(next, events, None)) is not None:
                    if isinstance(event, BuildResult):
                        log.info("build_finished", request_id=request.request_id, plan_id=event.plan_id,
                                 manifest_hashes=[s.manifest_hash for s in event.stages])
                    yield convert.event_to_pb(event)
            finally:
                # Abandoning the stream closes the build, which removes its partial output.
                await asyncio.to_thread(events.close)

    async def VerifyArtifact(self, request, context) -> pb.VerifyArtifactResponse:
        if not request.artifact_dir:
            raise InvalidArgument("artifact_dir is required", field="artifact_dir")
        confine(request.artifact_dir, (*self._cfg.write_roots, *self._cfg.read_roots), "artifact_dir")
        try:
            verified = await asyncio.to_thread(
                verify_artifact, request.artifact_dir, request.expected_manifest_hash, request.expected_plan_hash
            )
        except ARTIFACT_ERRORS as exc:
            log.warning("artifact_refused", artifact_dir=request.artifact_dir, reason=exc.reason)
            return convert.refused_to_pb(exc.reason, exc.message)
        return convert.verified_to_pb(verified)

    async def FetchArtifact(self, request, context):
        path = await asyncio.to_thread(artifact_file, Path(self._cfg.artifact_store) / STORE_DIR,
                                       request.manifest_hash, request.path)
        chunks = read_chunks(path, request.offset_bytes, request.max_chunk_bytes)
        sent = 0
        while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
            offset, data, size = chunk
            sent += len(data)
            yield pb.FetchArtifactResponse(offset_bytes=offset, data=data, file_size_bytes=size)
        log.info("artifact_file_sent", manifest_hash=request.manifest_hash, path=request.path,
                 offset_bytes=request.offset_bytes, bytes_sent=sent)

    async def GetModelFiles(self, request, context) -> pb.GetModelFilesResponse:
        inspection = await self._inspect(request.checkpoint_dir, "", "")
        files = await asyncio.to_thread(model_files, request.checkpoint_dir)
        return convert.model_files_to_pb(files, inspection)


async def make_spec(cfg: BuilderConfig) -> ServiceSpec:
    servicer = ArtifactBuilderServicer(cfg)
    return ServiceSpec(
        service_names=(pb.DESCRIPTOR.services_by_name["ArtifactBuilderService"].full_name,),
        register=lambda server: pb_grpc.add_ArtifactBuilderServiceServicer_to_server(servicer, server),
    )
