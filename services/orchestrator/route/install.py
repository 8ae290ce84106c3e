"""Install a plan on the fleet: plan it, build its artifacts, load every stage, warm the route.

Only an installed, warmed and health-checked route admits traffic. Each install is a new plan
generation: its lease ids differ from every earlier generation's, which fences old frames.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fornax.artifact_builder.v1 import artifact_builder_pb2 as ab_pb
from fornax.artifact_builder.v1 import artifact_builder_pb2_grpc as ab_grpc
from fornax.common.v1 import common_pb2
from fornax.stage_worker.v1 import stage_worker_pb2 as sw_pb
from fornax.stage_worker.v1 import stage_worker_pb2_grpc as sw_grpc
from libs.common.kinds import Backend, DType
from libs.common.proto import BACKEND_TO_PB, DTYPE_TO_PB
from libs.fnx2 import Phase, SequenceStatus
from libs.model.config import load_config
from libs.model.sampling import GREEDY
from libs.security.fnx2_tls import Fnx2Tls
from libs.service.channels import ChannelConfig, open_aio_channel
from libs.service.errors import FailedPrecondition, Unavailable
from libs.text.context import TextPins
from libs.weights.policy import DEFAULT_POLICY
from services.evidence_registry.client import ClientOptions
from services.orchestrator.route.remote_files import fetch_model_files
from services.orchestrator.route.stage_chain import (
    Route,
    RoutePlan,
    StageLoad,
    UnloadOutcome,
    load_route,
    route_slice,
    unload_generation,
)
from services.planner import convert as planner_convert
from services.planner.client import AsyncPlannerClient
from services.planner.domain import Plan
from services.planner.inventory import Target
from services.planner.inventory_facts import describe_facts, hosts_from_profiles, inventory_from, node_name
from services.planner.model import describe_checkpoint
from services.planner.profile_source import fetch_profile_records
from services.planner.profiles import ProfileRecordInput

WARMUP_BUDGET_NS = 600 * 10**9


@dataclass(frozen=True)
class WeightsChoice:
    """The weight policy of every stage, or per worker (aligned with `Fleet.workers`), so a
    small-memory host can hold q4_k_m beside a bf16 host in one route."""

    policy: str = DEFAULT_POLICY
    worker_policies: tuple[str, ...] = ()

    def planning_policy(self) -> str | None:
        """The policy the planner counts bytes in: the uniform one (None for fp32, whose plans
        keep counting the checkpoint's stored dtype so calibrated fleets do not shift), or for a
        mixed fleet the one whose weights are largest, so that every host's memory suffices."""
        policies = set(self.worker_policies) or {self.policy}
        if policies == {"fp32"}:
            return None
        return max(policies, key=lambda p: ("fp32", "bf16", "q8_0", "q4_k_m")[::-1].index(p))

    def for_plan(self, plan: Plan) -> list[str]:
        """One policy per planned stage, by the worker the stage was placed on ([] = uniform)."""
        if not self.worker_policies:
            return []
        by_node = {node_name(i): p for i, p in enumerate(self.worker_policies)}
        return [by_node.get(stage.node, self.policy) for stage in plan.stages]


UNIFORM_FP32 = WeightsChoice()


def gguf_planning_policy(path: str) -> tuple[str | None, float]:
    """(the planning policy nearest the file's stored bits per weight, None for fp32; the bits)."""
    from libs.model.gguf_source import planning_policy

    nearest, bits = planning_policy(path)
    return (None if nearest == "fp32" else nearest), bits


@dataclass(frozen=True)
class InstallSpec:
    checkpoint_dir: str
    stages: int
    # None: each stage runs the backend its own worker reports (an unlike fleet).
    backend: Backend | None
    boundary_dtype: DType
    # The orchestrator's own state: model files fetched from the builder live here.
    state_dir: Path
    kv_limit_bytes: int = 0
    # Per hop, hop i from stage i to i+1; empty = boundary_dtype on every hop.
    hop_dtypes: tuple[DType, ...] = ()
    context_tokens: int = 2048
    concurrency: int = 32
    weights: WeightsChoice = UNIFORM_FP32


@dataclass(frozen=True)
class Fleet:
    planner: str
    artifact_builder: str
    workers: tuple[str, ...]  # gRPC addresses in stage order
    # How the orchestrator reaches them (its certificate, under mTLS).
    channel: ChannelConfig = ChannelConfig()
    # The orchestrator's own fleet identity URI, which stage 0 admits as its gateway; "" without TLS.
    identity: str = ""
    # TLS for the gateway's FNX2 channel to stage 0; None without TLS.
    data_plane_tls: Fnx2Tls | None = None
    # The evidence registry holding stage/link profiles and route calibrations; "" = none.
    registry: str = ""
    # "exploratory": plan from profiles when the registry has any, declared figures fill gaps;
    # "deployment": plan only from valid profiles on a calibrated route, else refuse.
    plan_mode: str = "exploratory"


@dataclass(frozen=True)
class InstalledPlan:
    plan: Plan
    route_plan: RoutePlan
    layer_ranges: tuple[tuple[int, int], ...]
    # The model files as fetched from the builder, and their tokenizer/template hashes.
    model_dir: Path
    text_pins: TextPins
    stored: StoredPlan


async def _capabilities(workers: tuple[str, ...], config: ChannelConfig) -> list[sw_pb.GetCapabilitiesResponse]:
    async def one(address: str) -> sw_pb.GetCapabilitiesResponse:
        async with open_aio_channel(address, config) as channel:
            return await sw_grpc.StageWorkerServiceStub(channel).GetCapabilities(
                sw_pb.GetCapabilitiesRequest(), timeout=30
            )

    return list(await asyncio.gather(*(one(a) for a in workers)))


async def profile_records(fleet: Fleet) -> list[ProfileRecordInput] | None:
    """The newest profile and calibration records of the fleet's registry. None: plan from
    declared figures (an exploratory fleet whose registry holds no profiles, or has no registry)."""
    if not fleet.registry:
        if fleet.plan_mode == "deployment":
            raise FailedPrecondition("deployment mode plans only from registry evidence, and this fleet names no "
                                     "evidence registry (FORNAX_REGISTRY_ADDR)", reason="NO_EVIDENCE_REGISTRY")
        return None
    options = ClientOptions(channel=fleet.channel)
    records = await asyncio.to_thread(fetch_profile_records, fleet.registry, options)
    return records if records or fleet.plan_mode == "deployment" else None


async def create_plan(spec: InstallSpec, fleet: Fleet, model_dir: Path,
                      progress: Callable[[str], None] = lambda _: None) -> Plan:
    capabilities = await _capabilities(fleet.workers, fleet.channel)
    records = await profile_records(fleet)
    progress(f"inventory: {describe_facts(capabilities, profiled=records is not None)}")
    policy = spec.weights.planning_policy()
    if policy is None and Path(spec.checkpoint_dir).suffix == ".gguf":
        policy, bits = await asyncio.to_thread(gguf_planning_policy, spec.checkpoint_dir)
        progress(f"planning the GGUF's bytes as the {policy or 'fp32'} policy's (the file stores {bits:.2f} bits "
                 "per weight on average; an estimate)")
    model = describe_checkpoint(model_dir, policy)
    if len(set(spec.weights.worker_policies)) > 1:  # each host's profile holds its own policy
        model = dataclasses.replace(model, weights_policy="")
    target = Target(
        context_tokens=spec.context_tokens, concurrency=spec.concurrency, min_stages=spec.stages,
        max_stages=spec.stages, boundary_dtype=spec.boundary_dtype, mode=fleet.plan_mode,
    )
    hosts = hosts_from_profiles(capabilities, records) if records is not None else ()
    if records is not None:
        progress(f"planning in {fleet.plan_mode} mode from {len(records)} profile/calibration record(s) of "
                 f"{fleet.registry}; hosts {', '.join(hosts)}")
    async with AsyncPlannerClient(fleet.planner, channel=fleet.channel) as planner:
        result = await planner.create_plan(model, inventory_from(capabilities, hosts), target, profiles=records)
    if not result.feasible or result.plan is None:
        reasons = "; ".join(f"{r.subject}: {r.reason} {r.detail}" for r in result.rejections)
        raise FailedPrecondition(
            f"no feasible plan: {result.infeasibility} {reasons}".strip(), reason="PLAN_INFEASIBLE"
        )
    return result.plan


async def build_artifacts(spec: InstallSpec, fleet: Fleet, plan: Plan,
                          progress: Callable[[str], None]) -> list[ab_pb.StageArtifact]:
    # No out_dir: artifacts stay in the builder's own store, and workers fetch them from it.
    request = ab_pb.BuildStageArtifactsRequest(
        request_id=str(uuid.uuid4()), checkpoint_dir=spec.checkpoint_dir,
        plan=planner_convert.plan_to_proto(plan), boundary_dtype=DTYPE_TO_PB[spec.boundary_dtype],
        hop_boundary_dtypes=[DTYPE_TO_PB[d] for d in spec.hop_dtypes],
        weights_policy=spec.weights.policy, stage_weights_policies=spec.weights.for_plan(plan),
    )
    result = None
    async with open_aio_channel(fleet.artifact_builder, fleet.channel) as channel:
        async for event in ab_grpc.ArtifactBuilderServiceStub(channel).BuildStageArtifacts(request, timeout=3600):
            if event.HasField("result"):
                result = event.result
    progress(f"built {len(result.stages) if result else 0} stage artifacts on {fleet.artifact_builder}")
    if result is None:
        raise Unavailable("the artifact builder ended without a result", reason="BUILD_INCOMPLETE")
    return sorted(result.stages, key=lambda s: s.stage_index)


async def _worker_identities(fleet: Fleet) -> dict[str, str]:
    """Node name to the identity in that worker's certificate (empty without TLS)."""
    if not fleet.identity:
        return {}
    capabilities = await _capabilities(fleet.workers, fleet.channel)
    return {node_name(i): c.identity for i, c in enumerate(capabilities)}


def _previous_hop(plan: Plan, stage_index: int, identities: dict[str, str], gateway: str) -> str:
    """Who may open a stage's FNX2 channel: the stage before it, or the orchestrator's gateway."""
    if stage_index == 0:
        return gateway
    return identities.get(plan.stages[stage_index - 1].node, "")


def _next_hop(plan: Plan, stage_index: int, identities: dict[str, str]) -> str:
    if stage_index + 1 >= len(plan.stages):
        return ""
    return identities.get(plan.stages[stage_index + 1].node, "")


async def load_stages(spec: InstallSpec, fleet: Fleet, plan: Plan, artifacts: list[ab_pb.StageArtifact],
                      generation: str, progress: Callable[[str], None], keep_generation: str = "",
                      replace_generation: str = "") -> RoutePlan:
    """One stage per planned stage, on the worker the plan names, as plan generation `generation`,
    beside generation `keep_generation` (the serving route) when one is named. A MAX stage is
    loaded in the block-format activations the plan names for it (the mode its profile was timed
    in), not in whatever its worker defaults to; a worker that cannot run that mode refuses the
    load (MAX_ACTIVATIONS_UNSUPPORTED), which fails the install. A stage the install runs on
    another backend (the serve-at-once reference route: numpy over a MAX plan) gets no mode."""
    binding = common_pb2.PlanBinding(
        plan_id=fnx2_plan_id(plan), plan_hash=plan.plan_hash, plan_generation_id=generation
    )
    workers = {node_name(i): address for i, address in enumerate(fleet.workers)}
    identities = await _worker_identities(fleet)
    count = len(plan.stages)
    backends = [spec.backend or Backend(stage.backend) for stage in plan.stages]
    loads = [StageLoad(workers[stage.node], sw_pb.StageSpec(
        stage_index=stage.stage_index, stage_count=count,
        layer_range=common_pb2.LayerRange(layer_start=stage.layer_start, layer_end_exclusive=stage.layer_end),
        plan=binding, artifact_source_address=fleet.artifact_builder, manifest_hash=artifact.manifest_hash,
        backend=BACKEND_TO_PB[backends[stage.stage_index]],
        boundary_dtype=DTYPE_TO_PB[stage_dtypes(spec, stage.stage_index, count)[1]],
        input_boundary_dtype=DTYPE_TO_PB[stage_dtypes(spec, stage.stage_index, count)[0]],
        kv_limit_bytes=stage_kv_limit(spec.kv_limit_bytes, stage.kv_bytes),
        output_mode=sw_pb.OUTPUT_MODE_SAMPLED_TOKENS, device="cpu",
        previous_hop_identity=_previous_hop(plan, stage.stage_index, identities, fleet.identity),
        next_hop_identity=_next_hop(plan, stage.stage_index, identities),
        max_activations=stage.max_activations if backends[stage.stage_index] == Backend.MAX else "",
    ), identities.get(stage.node, "")) for stage, artifact in zip(plan.stages, artifacts, strict=True)]
    return await load_route(loads, progress=progress, channel=fleet.channel, keep_generation=keep_generation,
                            replace_generation=replace_generation)


def stage_kv_limit(route_limit_bytes: int, planned_kv_bytes: int) -> int:
    """The KV pool a stage is given: what its plan counted for it (KV for the target's context x
    concurrency), so the pool never outgrows the memory the plan verified; a route-wide limit
    (FORNAX_STAGE_KV_LIMIT_BYTES) only lowers it. 0 (neither known) leaves the worker's default."""
    limits = [x for x in (route_limit_bytes, planned_kv_bytes) if x > 0]
    return min(limits) if limits else 0


def stage_dtypes(spec: InstallSpec, stage_index: int, stage_count: int) -> tuple[DType, DType]:
    """(into, out of) a stage: the hops around it; the route's ends take their one hop's."""
    if not spec.hop_dtypes:
        return spec.boundary_dtype, spec.boundary_dtype
    if len(spec.hop_dtypes) != stage_count - 1:
        raise FailedPrecondition(f"{stage_count} stages need {stage_count - 1} hop dtypes, got {len(spec.hop_dtypes)}",
                                 reason="HOP_DTYPES_MISMATCH")
    hops = spec.hop_dtypes
    return hops[max(stage_index - 1, 0)], hops[min(stage_index, len(hops) - 1)]


def fnx2_plan_id(plan: Plan) -> str:
    """FNX2 binds plan ids as UUIDs: a name-based UUID of the planner's content hash."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"fornax:plan:{plan.plan_hash}"))


async def warm(route: Route, bos_token_id: int) -> None:
    """One prefill and one decode through every stage, then release; raises if any fails."""
    request_id = str(uuid.uuid4())
    await route.admit(request_id, 4, GREEDY)
    try:
        ((first, rows),) = await route.run(
            Phase.PREFILL, [route_slice(route.plan, request_id, 0, 0, 0, 1, WARMUP_BUDGET_NS)],
            np.array([bos_token_id], np.int32))
        if rows is None:
            raise FailedPrecondition(
                f"warm-up prefill failed: {first.error_code} {first.error_message}", reason="WARMUP_FAILED"
            )
        ((second, _),) = await route.run(
            Phase.DECODE, [route_slice(route.plan, request_id, 1, 1, first.kv_epoch_after, 1, WARMUP_BUDGET_NS)],
            np.array([int(rows[0])], np.int32))
        if second.status is not SequenceStatus.OK:
            raise FailedPrecondition(
                f"warm-up decode failed: {second.error_code} {second.error_message}", reason="WARMUP_FAILED"
            )
    finally:
        await route.release(request_id)
    for index, health in enumerate(await route.health()):
        if health.state != sw_pb.STAGE_STATE_READY:
            raise FailedPrecondition(
                f"stage {index} is {sw_pb.StageState.Name(health.state)} after warm-up", reason="STAGE_UNHEALTHY"
            )


async def discard(route: Route, fleet: Fleet) -> UnloadOutcome:
    """Closes a route and unloads its generation from its workers (any other stays loaded)."""
    await route.close()
    return await unload_generation([s.control_address for s in route.plan.stages], route.plan.plan_generation_id,
                                   fleet.channel)


@dataclass(frozen=True)
class StoredPlan:
    """A planned and built install: what rollback reloads exactly, without re-planning."""

    plan: Plan
    artifacts: tuple[ab_pb.StageArtifact, ...]
    model_dir: Path
    text_pins: TextPins


async def prepare(spec: InstallSpec, fleet: Fleet, progress: Callable[[str], None]) -> StoredPlan:
    """Plans and builds; touches no stage worker, so the current route keeps serving."""
    if len(fleet.workers) < spec.stages:
        raise FailedPrecondition(
            f"{spec.stages} stages need {spec.stages} workers; the fleet has {len(fleet.workers)}",
            reason="NOT_ENOUGH_WORKERS",
        )
    model_dir, pins = await fetch_model_files(
        fleet.artifact_builder, spec.checkpoint_dir, spec.state_dir, fleet.channel
    )
    progress("planning")
    plan = await create_plan(spec, fleet, model_dir, progress)
    progress(
        f"plan {plan.plan_id} ({plan.label}): "
        + ", ".join(f"{s.node}@{s.host or s.node} layers [{s.layer_start},{s.layer_end})" for s in plan.stages)
    )
    if plan.choice:
        progress(f"placement: {plan.choice}")
    artifacts = tuple(await build_artifacts(spec, fleet, plan, progress))
    return StoredPlan(plan, artifacts, model_dir, pins)


async def install(spec: InstallSpec, fleet: Fleet, progress: Callable[[str], None],
                  stored: StoredPlan | None = None, keep_generation: str = "",
                  replace_generation: str = "") -> tuple[InstalledPlan, Route]:
    """Loads and warms `stored` (prepared now when None) as a new plan generation, beside
    generation `keep_generation` (which keeps serving) when one is named, or in place of only
    generation `replace_generation` (a reload). On failure the new generation is unloaded again
    and the kept one is untouched."""
    stored = stored or await prepare(spec, fleet, progress)
    plan = stored.plan
    route_plan = await load_stages(spec, fleet, plan, list(stored.artifacts), str(uuid.uuid4()), progress,
                                   keep_generation, replace_generation)
    route = Route(route_plan, channel=fleet.channel, data_plane_tls=fleet.data_plane_tls)
    try:
        await route.open()
        progress("warming the route")
        await warm(route, load_config(stored.model_dir).bos_token_id or 0)
    except BaseException:
        await discard(route, fleet)
        raise
    ranges = tuple((s.layer_start, s.layer_end) for s in plan.stages)
    return InstalledPlan(plan, route_plan, ranges, stored.model_dir, stored.text_pins, stored), route
