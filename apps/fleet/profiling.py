"""`fornax profile`: every stage worker profiles itself, every ordered pair of stage hosts profiles
its link, and each signed profile becomes a physical measurement record in the fleet's registry.

The layers come from the artifact builder: it cuts the checkpoint so that the first artifact
holds the embeddings, the first dense and the first MoE layer, and the last one the final layer
and the head (libs/profiles/measure.profiling_ranges); each worker fetches those two over gRPC.
They are built in the weight policy the worker's host serves (its fleet-file `weights:` or
`--weights`) and for the worker's backend, so a profile times the formats a route would run
and records the policy (a plan in another policy refuses it: PROFILE_MISMATCH).
Workers are profiled one at a time; `--all-at-once` profiles them together, as a route keeps
them busy (hosts on one machine slow each other even on disjoint CPUs: shared caches and memory
bandwidth, SMT siblings and steal under a hypervisor). Links are profiled after, one pair at a time.
"""

from __future__ import annotations

import asyncio
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
    weights: str = "fp32"  # the weight policy its profile times


@dataclass(frozen=True)
class ProfileRequest:
    checkpoint_dir: str
    grid: Grid
    command: str
    link_runs: int = 3
    rtt_iters: int = 20
    valid_for_s: int = 0
    concurrent: bool = False  # every stage host at once, as a route runs them


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


def profiling_build_request(checkpoint_dir: str, weights: str = "fp32",
                            backend: common_pb2.Backend = common_pb2.BACKEND_UNSPECIFIED,
                            ) -> ab_pb.BuildStageArtifactsRequest:
    """The build of the profiling cut in `weights` for stages of `backend` (unspecified: as the
    policy chooses, with no conversion for a backend)."""
    ranges = profiling_ranges(load_config(checkpoint_dir))
    return ab_pb.BuildStageArtifactsRequest(
        request_id=str(uuid.uuid4()), checkpoint_dir=checkpoint_dir, boundary_dtype=common_pb2.ELEMENT_TYPE_FP32,
        layer_ranges=[common_pb2.LayerRange(layer_start=a, layer_end_exclusive=b) for a, b in ranges],
        weights_policy=weights,
        stage_backends=[backend] * len(ranges) if backend != common_pb2.BACKEND_UNSPECIFIED else [])


async def build_profiling_artifacts(builder: str, checkpoint_dir: str, channel: ChannelConfig, weights: str = "fp32",
                                    backend: common_pb2.Backend = common_pb2.BACKEND_UNSPECIFIED,
                                    ) -> list[str]:
    """Manifest hashes of the first and last profiling artifacts (one when the cut is one range)."""
    request = profiling_build_request(checkpoint_dir, weights, backend)
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


async def _capabilities(worker: Worker, channel: ChannelConfig) -> sw_pb.GetCapabilitiesResponse:
    async with open_aio_channel(worker.grpc, channel) as ch:
        caps = await sw_grpc.StageWorkerServiceStub(ch).GetCapabilities(sw_pb.GetCapabilitiesRequest())
    if not caps.identity:
        raise FailedPrecondition(f"the worker on {worker.host} serves without TLS; profiles must be signed",
                                 reason="NO_SIGNING_IDENTITY")
    return caps


async def profile_fleet(workers: list[Worker], builder: str, registry: str, request: ProfileRequest,
                        channel: ChannelConfig, progress: Callable[[str], None] = lambda _: None) -> FleetProfiles:
    snapshot = describe_checkpoint(request.checkpoint_dir).model_snapshot
    caps = {w.host: await _capabilities(w, channel) for w in workers}
    identities = {host: c.identity for host, c in caps.items()}
    manifests: dict[tuple[str, common_pb2.Backend], list[str]] = {}
    for w in workers:
        key = (w.weights, caps[w.host].backend)
        if key not in manifests:
            progress(f"building the profiling artifacts of {snapshot} in {w.weights} for "
                     f"{common_pb2.Backend.Name(key[1])} on {builder}")
            manifests[key] = await build_profiling_artifacts(builder, request.checkpoint_dir, channel, *key)
    by_host = {w.host: w for w in workers}
    links = []
    async with AsyncRegistryClient(registry, ClientOptions(channel=channel)) as reg:
        async def profile_one(worker: Worker) -> StoredStage:
            progress(f"profiling the stage worker on {worker.host} ({worker.weights})")
            grid = request.grid
            async with open_aio_channel(worker.grpc, channel) as ch:
                reply = await sw_grpc.StageWorkerServiceStub(ch).ProfileStage(sw_pb.ProfileStageRequest(
                    request_id=str(uuid.uuid4()), artifact_source_address=builder,
                    manifest_hashes=manifests[(worker.weights, caps[worker.host].backend)],
                    host=worker.host, model_snapshot=snapshot, prefill_lengths=grid.prefill_lengths,
                    decode_batches=grid.decode_batches, decode_contexts=grid.decode_contexts, runs=grid.runs,
                    min_run_ms=round(grid.min_run_s * 1000),
                    valid_for_s=request.valid_for_s, command=request.command), timeout=PROFILE_TIMEOUT_S)
            record = await reg.put_record(content_from_proto(reply.record), reply.profile_json)
            return StoredStage(stage_profile_from_json(reply.profile_json), record)

        if request.concurrent:
            stages = list(await asyncio.gather(*(profile_one(w) for w in workers)))
        else:
            stages = [await profile_one(w) for w in workers]
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
