"""StageWorkerService servicer: convert, call the stage runtime, convert back."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import structlog

from fornax.common.v1 import common_pb2
from fornax.stage_worker.v1 import stage_worker_pb2 as pb
from fornax.stage_worker.v1 import stage_worker_pb2_grpc as pb_grpc
from libs.common.kinds import FLOAT_DTYPES, Backend
from libs.common.proto import BACKEND_TO_PB, DTYPE_TO_PB
from libs.model.kv_blocks import KV_BLOCK_TOKENS
from libs.profiles.sustained_clock import IntervalClock
from libs.security.audit import AuditEvent, open_audit_log
from libs.security.fnx2_tls import Fnx2Tls
from libs.security.identity import Identity, IdentityError
from libs.security.paths import confine
from libs.security.tls import own_identity_uri
from libs.service.cgroup_facts import cgroup_facts, throttled_seconds_reader
from libs.service.errors import InvalidArgument
from libs.service.host import backend_build, host_facts
from libs.service.server import ServiceSpec
from libs.weights.policy import runnable_formats
from services.stage_worker import convert, metrics
from services.stage_worker.backend_compare import DecodeStepComparer
from services.stage_worker.config import StageWorkerConfig
from services.stage_worker.dataplane import DataPlane, stage_id
from services.stage_worker.generations import Generations
from services.stage_worker.kv_fit import measure_host_memory
from services.stage_worker.lifecycle import StageState
from services.stage_worker.operations import SUPPORTED_OPERATIONS
from services.stage_worker.overlap import MemoryFacts
from services.stage_worker.phase_totals import PhaseTotals
from services.stage_worker.profiling import BUSY, Profiler
from services.stage_worker.runtime import StageRuntime

log = structlog.get_logger()
# What the audit log calls an FNX2 channel opening (it is no gRPC method).
DATA_PLANE_HELLO = "fnx2:/hello"


def require_peer_identities(spec) -> None:
    """Under TLS the data plane admits one named peer and sends to one named peer: both must be given."""
    wanted = [("spec.previous_hop_identity", spec.previous_hop_identity)]
    if not spec.last:
        wanted.append(("spec.next_hop_identity", spec.next_hop_identity))
    for field, uri in wanted:
        if not uri:
            raise InvalidArgument("a TLS stage needs the fleet identity of its data-plane peer",
                                  reason="MISSING_PEER_IDENTITY", field=field)
        try:
            Identity.from_uri(uri)
        except IdentityError as exc:
            raise InvalidArgument(str(exc), reason="INVALID_PEER_IDENTITY", field=field) from exc


class StageWorkerServicer(pb_grpc.StageWorkerServiceServicer):
    def __init__(self, cfg: StageWorkerConfig, generations: Generations, dataplane: DataPlane,
                 profiler: Profiler, comparer: DecodeStepComparer):
        self._cfg = cfg
        self._comparer = comparer
        self._generations = generations
        self._dataplane = dataplane  # the listener on the configured port
        self._profiler = profiler

    async def GetCapabilities(self, request, context) -> pb.GetCapabilitiesResponse:
        facts = host_facts()
        limits = cgroup_facts()
        build = backend_build(self._cfg.backend)
        return pb.GetCapabilitiesResponse(
            backend=BACKEND_TO_PB[self._cfg.backend],
            backend_build=build or f"{self._cfg.backend} (not installed)",
            device=pb.DeviceInfo(
                kind=self._cfg.device,
                name=facts.cpu_name,
                memory_total_bytes=facts.memory_total_bytes,
                memory_available_bytes=facts.memory_available_bytes,
                cpu_count=facts.cpu_count,
                cpu_quota_cores=limits.cpu_quota_cores,
                cpuset=limits.cpuset,
                memory_limit_bytes=limits.memory_limit_bytes,
            ),
            supported_dtypes=[DTYPE_TO_PB[dtype] for dtype in FLOAT_DTYPES],
            supported_operations=list(SUPPORTED_OPERATIONS) if build else [],
            fnx2_versions=["2.0"],
            data_plane_address=self._dataplane.address,
            stage_index=self._cfg.stage_index,
            data_plane_host=self._dataplane.advertised_host,
            identity=own_identity_uri(self._cfg.server.tls),
            weight_formats=sorted(runnable_formats(self._cfg.backend.value)) if build else [],
            # The mode its MAX graphs run (and its profiles time) in: the planner matches profiles by it.
            max_activations=self._cfg.max_activations if self._cfg.backend is Backend.MAX else "",
        )

    async def LoadStage(self, request, context) -> pb.LoadStageResponse:
        spec = convert.load_spec_from_pb(request)
        for field, path in (("spec.checkpoint_dir", spec.checkpoint_dir), ("spec.artifact_dir", spec.artifact_dir)):
            if path:
                confine(path, self._cfg.read_roots, field)
        if self._cfg.server.tls is not None:
            require_peer_identities(spec)
        stage, slot = await self._generations.load(spec)
        cfg = stage.config
        hidden_in, hidden_out = (common_pb2.BoundaryContract(
            kind=common_pb2.TENSOR_KIND_ACTIVATION, dtype=DTYPE_TO_PB[dtype], width=cfg.hidden_size
        ) for dtype in (spec.input_dtype, spec.boundary_dtype))
        first_input = common_pb2.BoundaryContract(
            kind=common_pb2.TENSOR_KIND_TOKEN_IDS, dtype=common_pb2.ELEMENT_TYPE_INT32, width=1
        )
        last_output = common_pb2.BoundaryContract(
            kind=common_pb2.TENSOR_KIND_LOGITS if spec.return_logits else common_pb2.TENSOR_KIND_SAMPLED_TOKEN_IDS,
            dtype=common_pb2.ELEMENT_TYPE_FP32 if spec.return_logits else common_pb2.ELEMENT_TYPE_INT32,
            width=cfg.vocab_size if spec.return_logits else 1,
        )
        return pb.LoadStageResponse(
            state=convert.STATE_TO_PB[slot.runtime.lifecycle.state],
            manifest_hash=stage.manifest_hash,
            data_plane_address=slot.plane.address,
            input=first_input if spec.first else hidden_in,
            output=last_output if spec.last else hidden_out,
            weight_bytes=stage.weight_bytes,
            kv_dtype=stage.executor.kv.layout.dtype,
            kv_block_tokens=stage.executor.kv.block_tokens,
            max_activations=stage.max_activations,
            load_time=common_pb2.Figure(
                name="stage_load_time",
                value=stage.load_seconds,
                unit="s",
                evidence_class=common_pb2.EVIDENCE_CLASS_PHYSICAL,
                hardware=host_facts().cpu_name,
                backend_build=backend_build(self._cfg.backend) or "",
                model_snapshot=stage.manifest_hash or (spec.checkpoint_dir or ""),
                command="StageWorkerService/LoadStage",
            ),
        )

    async def GetHealth(self, request, context) -> pb.GetHealthResponse:
        generation = request.plan_generation_id
        if generation and generation not in self._generations.loaded:
            # Not (or no longer) loaded here: an answer, not an error, so a probe reads "not loaded".
            reply = pb.GetHealthResponse(state=convert.STATE_TO_PB[StageState.UNLOADED])
        else:
            runtime = self._generations.health_runtime(generation)
            snapshot = runtime.health()
            stage = runtime.stage
            if stage is not None:  # admissions count prefix hits between batches too
                metrics.record_kv_blocks(stage_id(stage.spec.stage_index), str(id(stage.executor.kv.pool)),
                                         snapshot.kv_blocks)
            reply = convert.health_to_pb(snapshot)
        reply.loaded_plan_generation_ids.extend(self._generations.loaded)
        reply.unix_time_ns = time.time_ns()  # as late as may be: the reader brackets it with its own clock
        return reply

    async def AdmitSequence(self, request, context) -> pb.AdmitSequenceResponse:
        runtime = self._generations.for_lease(request.execution_lease_id, request.target_request_id,
                                              request.plan_generation_id).runtime
        admission = convert.admission_from_pb(request, runtime.kv_block_bytes())
        free, cached = runtime.admit(admission)
        return pb.AdmitSequenceResponse(kv_bytes_reserved=admission.reserve_bytes, kv_bytes_free=free,
                                        cached_tokens=cached, kv_block_tokens=KV_BLOCK_TOKENS)

    async def CancelRequest(self, request, context) -> pb.CancelRequestResponse:
        target = convert._required(request.target_request_id, "target_request_id")
        slot = self._generations.for_request(target, request.plan_generation_id)
        slot.plane.cancel_lease(target, slot.runtime.lease_of(target))
        found, epoch = slot.runtime.cancel(target)
        return pb.CancelRequestResponse(found=found, kv_epoch=epoch)

    async def ReleaseRequest(self, request, context) -> pb.ReleaseRequestResponse:
        target = convert._required(request.target_request_id, "target_request_id")
        slot = self._generations.for_request(target, request.plan_generation_id)
        chain = convert.publish_chain_from_pb(request, slot.runtime.admission_salt(target))
        slot.plane.release_lease(target, slot.runtime.lease_of(target))
        found, epoch, freed = slot.runtime.release(target, chain)
        return pb.ReleaseRequestResponse(found=found, kv_epoch=epoch, kv_bytes_freed=freed)

    async def DrainStage(self, request, context) -> pb.DrainStageResponse:
        timeout_s = request.timeout_ns / 1e9 if request.timeout_ns else self._cfg.server.grace_period_s
        runtimes = ([self._generations.get(request.plan_generation_id).runtime] if request.plan_generation_id
                    else self._generations.runtimes() or [self._generations.health_runtime("")])
        await asyncio.gather(*(runtime.drain(timeout_s) for runtime in runtimes))
        healths = [runtime.health() for runtime in runtimes]
        return pb.DrainStageResponse(state=convert.STATE_TO_PB[healths[-1].state],
                                     inflight_batches=sum(h.inflight_batches for h in healths))

    async def UnloadStage(self, request, context) -> pb.UnloadStageResponse:
        unloaded = await self._generations.unload(request.plan_generation_id, request.keep_plan_generation_id)
        return pb.UnloadStageResponse(state=convert.STATE_TO_PB[self._generations.state()],
                                      live_sequences_at_unload=unloaded.live_sequences,
                                      kv_bytes_used_at_unload=unloaded.kv_bytes_used,
                                      unloaded_plan_generation_ids=list(unloaded.generations))

    async def ProfileStage(self, request, context) -> pb.ProfileStageResponse:
        return await self._profiler.profile_stage(request)

    async def CompareDecodeStep(self, request, context) -> pb.CompareDecodeStepResponse:
        return await self._comparer.compare(request)

    async def OpenLinkProbe(self, request, context) -> pb.OpenLinkProbeResponse:
        return await self._profiler.open_probe(request)

    async def ProfileLink(self, request, context) -> pb.ProfileLinkResponse:
        return await self._profiler.profile_link(request)


def data_plane_tls(cfg: StageWorkerConfig) -> Fnx2Tls | None:
    """The data plane serves TLS whenever the control plane does; refusals go to the audit log."""
    if cfg.server.tls is None:
        return None
    audit = open_audit_log(cfg.server.audit_log) if cfg.server.audit_log else None

    def refused(peer: str, why: str) -> None:
        log.warning("data_plane_peer_refused", peer=peer, detail=why)
        if audit is not None:
            audit.append(AuditEvent(
                time=dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"), caller=peer,
                rpc=DATA_PLANE_HELLO, args_sha256=hashlib.sha256(why.encode()).hexdigest(),
                result="PERMISSION_DENIED:PEER_REFUSED", service="stage_worker"))

    return Fnx2Tls(cfg.server.tls, refused)


def memory_facts(cfg: StageWorkerConfig) -> MemoryFacts:
    """The host's available memory now, and the worker's limit: configured, else its cgroup's."""
    return MemoryFacts(host_facts().memory_available_bytes,
                       cfg.memory_limit_bytes or cgroup_facts().memory_limit_bytes)


async def make_spec(cfg: StageWorkerConfig) -> ServiceSpec:
    device_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"stage-{cfg.device}")
    phase_totals = PhaseTotals()
    # The clock its profiles are timed on: sustained cost under a CPU quota.
    service_clock = IntervalClock(cgroup_facts().cpu_quota_cores, throttled=throttled_seconds_reader())

    def new_runtime() -> StageRuntime:
        return StageRuntime(cfg.backend, cfg.device, cfg.kv_limit_bytes,
                            artifact_cache_dir=str(Path(cfg.state_dir) / "artifact_cache"),
                            fetch_channel=cfg.server.client_channel(), device_thread=device_thread,
                            phase_totals=phase_totals, kv_dtype=cfg.kv_dtype,
                            max_activations=cfg.max_activations, service_clock=service_clock,
                            kv_fit=measure_host_memory if cfg.kv_limit_fit else None)

    tls = data_plane_tls(cfg)
    idle = new_runtime()
    dataplane = DataPlane(idle, cfg.server.host, cfg.data_plane_port, cfg.advertise_host, tls)
    await dataplane.start()

    async def overlap_plane() -> DataPlane:
        plane = DataPlane(idle, cfg.server.host, cfg.overlap_data_plane_port, cfg.advertise_host, tls)
        await plane.start()
        return plane

    generations = Generations(new_runtime, dataplane, overlap_plane, lambda: memory_facts(cfg))
    profiler = Profiler(cfg, generations, tls, dataplane.advertised_host)
    comparer = DecodeStepComparer(
        cfg, lambda: generations.health_runtime(""),
        lambda: [r.lifecycle.state.value for r in generations.runtimes() if r.lifecycle.state in BUSY])
    servicer = StageWorkerServicer(cfg, generations, dataplane, profiler, comparer)

    async def on_drain() -> None:
        await asyncio.gather(*(runtime.drain(cfg.server.grace_period_s) for runtime in generations.runtimes()))

    return ServiceSpec(
        service_names=(pb.DESCRIPTOR.services_by_name["StageWorkerService"].full_name,),
        register=lambda server: pb_grpc.add_StageWorkerServiceServicer_to_server(servicer, server),
        on_drain=on_drain,
        on_stop=lambda: _stop_all(generations, dataplane, profiler),
        extra_ports={"data_plane": dataplane.port},
    )


async def _stop_all(generations: Generations, dataplane: DataPlane, profiler: Profiler) -> None:
    await profiler.close()
    await generations.stop()
    await dataplane.stop()
