"""`fornax profile`: every stage worker profiles itself, every ordered pair of stage hosts profiles
its link, and each signed profile becomes a physical measurement record in the fleet's registry.

The layers come from the artifact builder: it cuts the checkpoint so that the first artifact
holds the embeddings, the first dense and the first MoE layer, and the last one the final layer
and the head (libs/profiles/measure.profiling_ranges); each worker fetches those two over gRPC.
Workers are profiled one at a time, so hosts that share physical cores do not disturb each other.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from fornax.artifact_builder.v1 import artifact_builder_pb2 as ab_pb
from fornax.artifact_builder.v1 import artifact_builder_pb2_grpc as ab_grpc
from fornax.common.v1 import common_pb2
from fornax.stage_worker.v1 import stage_worker_pb2 as sw_pb
from fornax.stage_worker.v1 import stage_worker_pb2_grpc as sw_grpc
from libs.model.config import load_config
from libs.profiles.measure import Grid, profiling_ranges
from libs.profiles.schema import LinkProfile, StageProfile, link_profile_from_json, stage_profile_from_json
from libs.service.channels import ChannelConfig, open_aio_channel
from libs.service.errors import FailedPrecondition, Unavailable
from services.evidence_registry.client import AsyncRegistryClient, ClientOptions
from services.evidence_registry.convert import content_from_proto
from services.evidence_registry.domain import Record
from services.planner.model import describe_checkpoint

PROFILE_TIMEOUT_S = 3600.0  # a first MAX compile of a layer kind takes minutes
BUILD_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class Worker:
    host: str  # the fleet host it runs on
    grpc: str


@dataclass(frozen=True)
class ProfileRequest:
    checkpoint_dir: str
    grid: Grid
    command: str
    link_runs: int = 3
    rtt_iters: int = 20
    valid_for_s: int = 0


@dataclass(frozen=True)
class StoredStage:
    profile: StageProfile
    record: Record


@dataclass(frozen=True)
class StoredLink:
    profile: LinkProfile
    record: Record


@dataclass(frozen=True)
class FleetProfiles:
    model_snapshot: str
    stages: tuple[StoredStage, ...]
    links: tuple[StoredLink, ...]


def ordered_pairs(hosts: list[str]) -> list[tuple[str, str]]:
    """Every ordered pair of distinct hosts: any two stage hosts may be adjacent in some plan."""
    return [(a, b) for a in hosts for b in hosts if a != b]


async def build_profiling_artifacts(builder: str, checkpoint_dir: str, channel: ChannelConfig) -> list[str]:
    """Manifest hashes of the first and last profiling artifacts (one when the cut is one range)."""
    ranges = profiling_ranges(load_config(checkpoint_dir))
    request = ab_pb.BuildStageArtifactsRequest(
        request_id=str(uuid.uuid4()), checkpoint_dir=checkpoint_dir, boundary_dtype=common_pb2.ELEMENT_TYPE_FP32,
        layer_ranges=[common_pb2.LayerRange(layer_start=a, layer_end_exclusive=b) for a, b in ranges])
    result = None
    async with open_aio_channel(builder, channel) as ch:
        async for event in ab_grpc.ArtifactBuilderServiceStub(ch).BuildStageArtifacts(request, timeout=BUILD_TIMEOUT_S):
            if event.HasField("result"):
                result = event.result
    if result is None or not result.stages:
        raise Unavailable("the artifact builder ended without a result", reason="BUILD_INCOMPLETE")
    stages = sorted(result.stages, key=lambda s: s.stage_index)
    wanted = [stages[0], stages[-1]] if len(stages) > 1 else [stages[0]]
    return [s.manifest_hash for s in wanted]


async def _identity(worker: Worker, channel: ChannelConfig) -> str:
    async with open_aio_channel(worker.grpc, channel) as ch:
        caps = await sw_grpc.StageWorkerServiceStub(ch).GetCapabilities(sw_pb.GetCapabilitiesRequest())
    if not caps.identity:
        raise FailedPrecondition(f"the worker on {worker.host} serves without TLS; profiles must be signed",
                                 reason="NO_SIGNING_IDENTITY")
    return caps.identity


async def profile_fleet(workers: list[Worker], builder: str, registry: str, request: ProfileRequest,
                        channel: ChannelConfig, progress: Callable[[str], None] = lambda _: None) -> FleetProfiles:
    snapshot = describe_checkpoint(request.checkpoint_dir).model_snapshot
    progress(f"building the profiling artifacts of {snapshot} on {builder}")
    manifests = await build_profiling_artifacts(builder, request.checkpoint_dir, channel)
    identities = {w.host: await _identity(w, channel) for w in workers}
    by_host = {w.host: w for w in workers}
    stages, links = [], []
    async with AsyncRegistryClient(registry, ClientOptions(channel=channel)) as reg:
        for worker in workers:
            progress(f"profiling the stage worker on {worker.host}")
            grid = request.grid
            async with open_aio_channel(worker.grpc, channel) as ch:
                reply = await sw_grpc.StageWorkerServiceStub(ch).ProfileStage(sw_pb.ProfileStageRequest(
                    request_id=str(uuid.uuid4()), artifact_source_address=builder, manifest_hashes=manifests,
                    host=worker.host, model_snapshot=snapshot, prefill_lengths=grid.prefill_lengths,
                    decode_batches=grid.decode_batches, decode_contexts=grid.decode_contexts, runs=grid.runs,
                    min_run_ms=round(grid.min_run_s * 1000),
                    valid_for_s=request.valid_for_s, command=request.command), timeout=PROFILE_TIMEOUT_S)
            record = await reg.put_record(content_from_proto(reply.record), reply.profile_json)
            stages.append(StoredStage(stage_profile_from_json(reply.profile_json), record))
        for a, b in ordered_pairs([w.host for w in workers]):
            progress(f"profiling the link {a} -> {b}")
            async with open_aio_channel(by_host[b].grpc, channel) as ch:
                probe = await sw_grpc.StageWorkerServiceStub(ch).OpenLinkProbe(sw_pb.OpenLinkProbeRequest(
                    request_id=str(uuid.uuid4()), peer_identity=identities[a]))
            async with open_aio_channel(by_host[a].grpc, channel) as ch:
                reply = await sw_grpc.StageWorkerServiceStub(ch).ProfileLink(sw_pb.ProfileLinkRequest(
                    request_id=str(uuid.uuid4()), probe_address=probe.address, probe_id=probe.probe_id,
                    probe_identity=probe.identity, from_host=a, to_host=b, runs=request.link_runs,
                    rtt_iters=request.rtt_iters, valid_for_s=request.valid_for_s, command=request.command),
                    timeout=PROFILE_TIMEOUT_S)
            record = await reg.put_record(content_from_proto(reply.record), reply.profile_json)
            links.append(StoredLink(link_profile_from_json(reply.profile_json), record))
    return FleetProfiles(snapshot, tuple(stages), tuple(links))
