"""ProfileStage, OpenLinkProbe and ProfileLink: this worker measures itself and its links, and
signs what it measured as physical evidence.

A stage profile needs no installed plan: the worker loads the ranges it is asked to profile
(from a checkpoint under its read roots, or artifacts it fetches from the builder over gRPC)
into private kernels on its device thread, measures them with libs/profiles/measure.py, and
drops them. A link profile uses real FNX2 frames over the real link (libs/profiles/link.py),
with the data plane's TLS and a probe listener that admits one named peer.
"""

from __future__ import annotations

import asyncio
import hashlib
import platform
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from fornax.stage_worker.v1 import stage_worker_pb2 as pb
from libs.artifacts.verify import verify_artifact
from libs.fnx2.channel.sender import Fnx2Client, SenderConfig
from libs.fnx2.wire.errors import Fnx2Error
from libs.model.config import DeepseekV2Config, load_config
from libs.model.errors import ModelError
from libs.model.kernels import make_kernels
from libs.model.weights import load_stage_weights
from libs.profiles import link as link_probe
from libs.profiles.measure import (
    Clock,
    Grid,
    kinds_to_measure,
    measure_kinds,
    weight_copy_bytes,
)
from libs.profiles.resident import read_resident_sample
from libs.profiles.schema import (
    DECODE_CONTEXTS,
    LAYER_KINDS,
    Figure,
    HostFacts,
    LayerKindProfile,
    LinkProfile,
    ResidentSample,
    RuntimeResident,
    StageProfile,
)
from libs.profiles.sustained_clock import profile_clock
from libs.security.fnx2_tls import Fnx2Tls
from libs.security.identity import Identity, IdentityError
from libs.security.paths import confine
from libs.security.tls import own_identity_uri
from libs.service.cgroup_facts import cgroup_facts
from libs.service.errors import FailedPrecondition, InvalidArgument, Unavailable
from libs.service.host import backend_build, host_facts
from services.evidence_registry.convert import content_to_proto
from services.evidence_registry.domain import RecordContent
from services.evidence_registry.profile_records import link_profile_record, stage_profile_record
from services.evidence_registry.signatures import sign_content
from services.stage_worker.config import StageWorkerConfig
from services.stage_worker.fetch import fetch_artifact
from services.stage_worker.generations import Generations
from services.stage_worker.leases import ReceiverLimits, ReceiverState
from services.stage_worker.lifecycle import StageState
from services.stage_worker.runtime import StageRuntime, _compile_progress
from services.stage_worker.step_profile import measure_step_overhead, step_grid_figures

if TYPE_CHECKING:
    from libs.model.max_kernels import MaxOptions

log = structlog.get_logger()
SNAPSHOT = re.compile(r"^sha256:[0-9a-f]{64}$")
DEFAULT_RUNS = 3
MAX_CONTEXTS = 8
DEFAULT_VALID_FOR_S = 7 * 24 * 3600
DEFAULT_RTT_ITERS = 20
MAX_RUNS = 50
MAX_RUN_S = 10.0
MAX_PREFILL = 32768
MAX_BATCH = 1024
MAX_CONTEXT = 131072
PROBE_TTL_S = 60
MAX_PROBE_TTL_S = 600
# A probe's own session rules: four frames in flight, room for every probe request.
PROBE_LIMITS = ReceiverLimits(frames=4, live_requests=4096, sequences=4096)
PROFILE_DTYPE = "fp32"  # both backends hold a stage's weights and KV as float32
BUSY = (StageState.LOADING, StageState.EXECUTING, StageState.DRAINING)


def weights_policy_of(sources: list[ProfileSource]) -> str:
    """The weight policy of the timed weights: each artifact's manifest says; a checkpoint
    directory is timed as float32 ("fp32"). Sources of different policies are refused."""
    from libs.artifacts.manifest import MANIFEST_FILE, decode_manifest

    policies = set()
    for source in sources:
        manifest = Path(source.directory) / MANIFEST_FILE
        policies.add(decode_manifest(manifest.read_bytes()).weights_policy if manifest.is_file() else "fp32")
    if len(policies) > 1:
        raise FailedPrecondition(f"profile sources hold different weight policies: {sorted(policies)}",
                                 reason="PROFILE_MIXED_WEIGHTS")
    return policies.pop() if policies else "fp32"


@dataclass(frozen=True)
class ProfileSource:
    """Layers [layer_start, layer_end) of a checkpoint or artifact directory."""

    directory: str
    layer_start: int
    layer_end: int
    first: bool
    last: bool
    label: str  # what the provenance calls it: the checkpoint, or the artifact's manifest hash


def grid_from(request: pb.ProfileStageRequest) -> Grid:
    defaults = Grid()
    grid = Grid(
        prefill_lengths=tuple(request.prefill_lengths) or defaults.prefill_lengths,
        decode_batches=tuple(request.decode_batches) or defaults.decode_batches,
        decode_contexts=_decode_contexts(request),
        runs=request.runs or DEFAULT_RUNS,
        min_run_s=request.min_run_ms / 1000 if request.min_run_ms else defaults.min_run_s,
    )
    checks = (("prefill_lengths", grid.prefill_lengths, MAX_PREFILL),
              ("decode_batches", grid.decode_batches, MAX_BATCH))
    for field, values, limit in checks:
        if min(values) < 1 or max(values) > limit:
            raise InvalidArgument(f"{field} must lie in [1, {limit}], got {list(values)}", reason="INVALID_GRID",
                                  field=field)
    if min(grid.decode_contexts) < 1 or grid.context_tokens > MAX_CONTEXT:
        raise InvalidArgument(f"decode contexts must lie in [1, {MAX_CONTEXT}], got {list(grid.decode_contexts)}",
                              reason="INVALID_GRID", field="decode_contexts")
    if len(set(grid.decode_contexts)) > MAX_CONTEXTS:
        raise InvalidArgument(f"at most {MAX_CONTEXTS} decode contexts, got {len(set(grid.decode_contexts))}",
                              reason="INVALID_GRID", field="decode_contexts")
    if grid.min_run_s > MAX_RUN_S:
        raise InvalidArgument(f"min_run_ms must be at most {MAX_RUN_S * 1000:g}", reason="INVALID_GRID",
                              field="min_run_ms")
    if grid.runs > MAX_RUNS:
        raise InvalidArgument(f"runs must be at most {MAX_RUNS}", reason="INVALID_GRID", field="runs")
    return grid


def _decode_contexts(request: pb.ProfileStageRequest) -> tuple[int, ...]:
    """The request's context grid; else its single `context_tokens` (an older client); else the
    default grid."""
    if request.decode_contexts:
        return tuple(sorted(set(request.decode_contexts)))
    if request.context_tokens:
        return (request.context_tokens,)
    return DECODE_CONTEXTS


def _required(value: str, field: str) -> str:
    if not value:
        raise InvalidArgument(f"{field} is required", reason="MISSING_FIELD", field=field)
    return value


def _snapshot(value: str) -> str:
    if not SNAPSHOT.match(value):
        raise InvalidArgument(f"model_snapshot must be 'sha256:<64 lowercase hex>', got {value[:80]!r}",
                              reason="INVALID_SNAPSHOT", field="model_snapshot")
    return value


@dataclass(frozen=True)
class Measured:
    cfg: DeepseekV2Config
    kinds: list[LayerKindProfile]
    layers: list[int]
    step: dict[int, dict[int, Figure]]  # context -> batch -> step overhead
    resident: RuntimeResident | None = None


# (point, directories of the weight files mapped now, bytes of weights held as converted copies)
# -> this process's resident sample.
Sampler = Callable[[str, tuple[str, ...], int], ResidentSample]


def measure_sources(backend: str, device: str, sources: list[ProfileSource], grid: Grid,
                    options: object | None, sample: Sampler | None = None,
                    clock: Clock = time.perf_counter) -> Measured:
    """Blocking: load each source into private kernels, measure the kinds it adds, then the
    served step overhead over its whole range, every figure on `clock` (`sustained_clock`).
    `sample` takes the worker's own resident memory after each source loads (weights mapped,
    kernels built) and after its timed steps (graphs a backend compiles on first call built by
    then, the profile's own KV stores dropped)."""
    profiles: dict[str, LayerKindProfile] = {}
    layers: list[int] = []
    steps: list[dict[int, dict[int, list[float]]]] = []
    samples: list[ResidentSample] = []
    cfg: DeepseekV2Config | None = None
    for source in sources:
        cfg = load_config(source.directory)
        weights = load_stage_weights(source.directory, cfg, source.layer_start, source.layer_end,
                                     source.first, source.last)
        kernels = make_kernels(backend, cfg, weights, device, options)
        where = f"layers [{source.layer_start}, {source.layer_end})"
        if sample is not None:
            samples.append(sample(f"after load of {where}", (source.directory,), weight_copy_bytes(weights)))
        wanted = kinds_to_measure(cfg, source.layer_start, source.layer_end, frozenset(profiles))
        profiles.update(measure_kinds(cfg, kernels, weights, wanted, source.first and "embed" not in profiles,
                                      source.last and "head" not in profiles, grid, clock))
        layers.extend(wanted.values())
        steps.append(measure_step_overhead(cfg, kernels, source.layer_start, source.layer_end, source.first,
                                           source.last, profiles, grid, clock))
        if sample is not None:
            samples.append(sample(f"after the profiled steps of {where}", (source.directory,),
                                  weight_copy_bytes(weights)))
        del kernels, weights  # one source's weights in memory at a time
    if cfg is None:
        raise InvalidArgument("nothing to profile", reason="MISSING_FIELD", field="layer_ranges")
    return Measured(cfg, [profiles[k] for k in LAYER_KINDS if k in profiles], layers, step_grid_figures(steps),
                    RuntimeResident(tuple(samples)) if samples else None)


def model_shapes(cfg: DeepseekV2Config) -> str:
    return (f"hidden {cfg.hidden_size}, heads {cfg.num_attention_heads}, kv_lora_rank {cfg.kv_lora_rank}, "
            f"rope dim {cfg.qk_rope_head_dim}, dense inner {cfg.intermediate_size}, experts {cfg.n_routed_experts} "
            f"(top {cfg.num_experts_per_tok}, shared {cfg.n_shared_experts}, inner {cfg.moe_intermediate_size}), "
            f"vocab {cfg.vocab_size}, layers {cfg.num_hidden_layers}")


def profile_options(cfg: StageWorkerConfig) -> MaxOptions | None:
    """What a MAX worker's profile builds its graphs with: its device and its own block-format
    activations, the mode the profile then records (`StageProfile.max_activations`); None on numpy."""
    if cfg.backend.value != "max":
        return None
    from libs.model.max_kernels import MaxOptions

    return MaxOptions(device=cfg.device, block_activations=cfg.max_activations, progress=_compile_progress)


class Profiler:
    """The servicer's profiling half: one per worker."""

    def __init__(self, cfg: StageWorkerConfig, generations: Generations, tls: Fnx2Tls | None,
                 advertise_host: str):
        self._cfg = cfg
        self._generations = generations
        self._tls = tls
        self._advertise_host = advertise_host
        self._probes: dict[str, link_probe.Probe] = {}

    @property
    def _runtime(self) -> StageRuntime:
        """Any runtime: they share the worker's device thread, artifact cache and fetch channel."""
        return self._generations.health_runtime("")

    # ---- signing -------------------------------------------------------------------------
    def _require_identity(self):
        paths = self._cfg.server.tls
        if paths is None or self._tls is None:
            raise FailedPrecondition("a profile is physical evidence and must be signed; this worker serves "
                                     "without TLS and has no identity to sign with", reason="NO_SIGNING_IDENTITY")
        return paths

    def _signed(self, content: RecordContent, blob: bytes) -> RecordContent:
        paths = self._require_identity()
        material = paths.read()
        if material.cert_pem is None or material.key_pem is None:
            raise FailedPrecondition("this worker has no certificate and key to sign with",
                                     reason="NO_SIGNING_IDENTITY")
        signer = Identity.from_uri(own_identity_uri(paths))
        return sign_content(content, hashlib.sha256(blob).hexdigest(), signer, material.cert_pem, material.key_pem)

    def _host_facts(self, host: str) -> HostFacts:
        limits = cgroup_facts()
        return HostFacts(host=host, cpu_model=host_facts().cpu_name, cpu_quota_cores=limits.cpu_quota_cores,
                         cpuset=limits.cpuset, memory_limit_bytes=limits.memory_limit_bytes,
                         cpu_shared_with=self._cfg.cpu_shared_with)

    def _backend_build(self) -> str:
        build = backend_build(self._cfg.backend)
        if build is None:
            raise FailedPrecondition(f"backend {self._cfg.backend} is not installed", reason="BACKEND_UNAVAILABLE")
        return build

    def _resident_sample(self, point: str, weight_dirs: tuple[str, ...], copied_bytes: int) -> ResidentSample:
        """This worker's resident memory now, beside the weights of the profiled range and those
        of any stage it holds loaded, and less the KV those stages hold."""
        loaded = [r.stage for r in self._generations.runtimes() if r.stage is not None]
        dirs = weight_dirs + tuple(d for s in loaded for d in (s.spec.artifact_dir, s.spec.checkpoint_dir) if d)
        copied = copied_bytes + sum(weight_copy_bytes(getattr(s.executor.kernels, "weights", None)) for s in loaded)
        return read_resident_sample(point, dirs, copied, sum(s.executor.kv.bytes_allocated() for s in loaded))

    # ---- stage ---------------------------------------------------------------------------
    async def profile_stage(self, request: pb.ProfileStageRequest) -> pb.ProfileStageResponse:
        host = _required(request.host, "host")
        snapshot = _snapshot(request.model_snapshot)
        grid = grid_from(request)
        self._require_identity()
        busy = [r.lifecycle.state for r in self._generations.runtimes() if r.lifecycle.state in BUSY]
        if busy:
            raise FailedPrecondition(f"the worker is {busy[0].value}; profile it idle", reason="STAGE_BUSY")
        build = self._backend_build()
        sources = await self._sources(request, snapshot)
        options = profile_options(self._cfg)
        facts = self._host_facts(host)
        clock, timing = profile_clock(facts.cpu_quota_cores)
        loop = asyncio.get_running_loop()
        try:
            measured_sources = await loop.run_in_executor(
                self._runtime.device_thread, measure_sources, self._cfg.backend.value, self._cfg.device, sources,
                grid, options, self._resident_sample, clock)
        except ModelError as exc:
            raise FailedPrecondition(f"{exc.reason}: {exc.message}", reason="PROFILE_LOAD_FAILED") from exc
        cfg, kinds, layers = measured_sources.cfg, measured_sources.kinds, measured_sources.layers
        profile = StageProfile(
            host=facts, worker=own_identity_uri(self._cfg.server.tls),
            backend=self._cfg.backend.value, backend_build=build, device=self._cfg.device, model_snapshot=snapshot,
            dtype=PROFILE_DTYPE, context_tokens=grid.context_tokens,
            concurrency=request.concurrency or max(grid.decode_batches), kinds=tuple(kinds),
            command=request.command or "StageWorkerService/ProfileStage", measured_unix_ns=time.time_ns(),
            valid_for_s=request.valid_for_s or DEFAULT_VALID_FOR_S,
            step_s_per_microbatch=measured_sources.step.get(grid.context_tokens, {}),
            step_s_by_context=measured_sources.step, weights_policy=weights_policy_of(sources),
            runtime_resident=measured_sources.resident,
            max_activations=options.block_activations if options is not None else "", timing=timing)
        measured = layers or [sources[0].layer_start]
        shapes = model_shapes(cfg) + "; sources " + ", ".join(s.label for s in sources)
        content, blob = stage_profile_record(profile, (min(measured), max(measured) + 1), shapes)
        log.info("stage_profiled", host=host, kinds=[k.kind for k in kinds], runs=grid.runs)
        return pb.ProfileStageResponse(profile_json=blob, record=content_to_proto(self._signed(content, blob)))

    async def _sources(self, request: pb.ProfileStageRequest, snapshot: str) -> list[ProfileSource]:
        if bool(request.checkpoint_dir) == bool(request.artifact_source_address):
            raise InvalidArgument("give exactly one of checkpoint_dir or artifact_source_address",
                                  reason="INVALID_SOURCE", field="checkpoint_dir")
        if request.checkpoint_dir:
            return self._checkpoint_sources(request, snapshot)
        if not request.manifest_hashes:
            raise InvalidArgument("artifact_source_address needs manifest_hashes", reason="MISSING_FIELD",
                                  field="manifest_hashes")
        cache = self._runtime.artifact_cache
        if cache is None:
            raise FailedPrecondition("this worker has no state directory to fetch artifacts into",
                                     reason="NO_ARTIFACT_CACHE", field="artifact_source_address")
        sources = []
        for manifest_hash in request.manifest_hashes:
            local = await fetch_artifact(request.artifact_source_address, manifest_hash, cache,
                                         config=self._runtime.fetch_channel)
            manifest = (await asyncio.to_thread(verify_artifact, local, expected_manifest_hash=manifest_hash)).manifest
            sources.append(ProfileSource(str(local), manifest.layers.layer_start, manifest.layers.layer_end,
                                         manifest.owns_embeddings, manifest.owns_head,
                                         f"artifact {manifest_hash} (snapshot {manifest.source.snapshot_id})"))
        return sources

    def _checkpoint_sources(self, request: pb.ProfileStageRequest, snapshot: str) -> list[ProfileSource]:
        from services.planner.model import describe_checkpoint

        directory = confine(request.checkpoint_dir, self._cfg.read_roots, "checkpoint_dir")
        try:
            cfg = load_config(directory)
            found = describe_checkpoint(directory).model_snapshot
        except (ModelError, ValueError) as exc:
            raise InvalidArgument(f"not a checkpoint: {exc}", reason="INVALID_CHECKPOINT",
                                  field="checkpoint_dir") from exc
        if found != snapshot:
            raise FailedPrecondition(f"the checkpoint is {found}, the request names {snapshot}",
                                     reason="MODEL_SNAPSHOT_MISMATCH", field="model_snapshot")
        if not request.layer_ranges:
            raise InvalidArgument("checkpoint_dir needs layer_ranges", reason="MISSING_FIELD", field="layer_ranges")
        layers = cfg.num_hidden_layers
        sources = []
        for index, r in enumerate(request.layer_ranges):
            start, end = r.layer_start, r.layer_end_exclusive
            if not 0 <= start < end <= layers:
                raise InvalidArgument(f"layer range [{start}, {end}) is outside the model's {layers} layers",
                                      reason="INVALID_LAYER_RANGE", field=f"layer_ranges[{index}]")
            sources.append(ProfileSource(str(directory), start, end, start == 0, end == layers,
                                         f"checkpoint layers [{start}, {end})"))
        return sources

    # ---- link ----------------------------------------------------------------------------
    async def open_probe(self, request: pb.OpenLinkProbeRequest) -> pb.OpenLinkProbeResponse:
        ttl = request.ttl_s or PROBE_TTL_S
        if ttl > MAX_PROBE_TTL_S:
            raise InvalidArgument(f"ttl_s must be at most {MAX_PROBE_TTL_S}", reason="INVALID_TTL", field="ttl_s")
        policy = None
        if self._tls is not None:
            peer = _required(request.peer_identity, "peer_identity")
            try:
                Identity.from_uri(peer)
            except IdentityError as exc:
                raise InvalidArgument(str(exc), reason="INVALID_PEER_IDENTITY", field="peer_identity") from exc
            policy = self._tls.admit_only(peer)
        probe_id = str(uuid.uuid4())
        state = ReceiverState(link_probe.probe_binding(probe_id), PROBE_LIMITS)
        probe = await link_probe.open_probe(probe_id, self._cfg.server.host, policy, state)
        self._probes[probe_id] = probe
        asyncio.get_running_loop().call_later(ttl, lambda: asyncio.ensure_future(self._close_probe(probe_id)))
        log.info("link_probe_opened", probe_id=probe_id, port=probe.port, peer=request.peer_identity, ttl_s=ttl)
        return pb.OpenLinkProbeResponse(probe_id=probe_id, address=f"{self._advertise_host}:{probe.port}",
                                        identity=own_identity_uri(self._cfg.server.tls))

    async def _close_probe(self, probe_id: str) -> None:
        probe = self._probes.pop(probe_id, None)
        if probe is not None:
            await probe.close()

    async def close(self) -> None:
        for probe_id in list(self._probes):
            await self._close_probe(probe_id)

    async def profile_link(self, request: pb.ProfileLinkRequest) -> pb.ProfileLinkResponse:
        from_host, to_host = _required(request.from_host, "from_host"), _required(request.to_host, "to_host")
        address = _required(request.probe_address, "probe_address")
        try:
            binding = link_probe.probe_binding(_required(request.probe_id, "probe_id"))
        except ValueError as exc:
            raise InvalidArgument("probe_id must be the UUID OpenLinkProbe answered", reason="INVALID_PROBE",
                                  field="probe_id") from exc
        self._require_identity()
        assert self._tls is not None  # _require_identity checked it
        peer = _required(request.probe_identity, "probe_identity")
        host, _, port = address.rpartition(":")
        runs = request.runs or DEFAULT_RUNS
        if runs > MAX_RUNS:
            raise InvalidArgument(f"runs must be at most {MAX_RUNS}", reason="INVALID_GRID", field="runs")
        try:
            client: Fnx2Client = await self._tls.connect(host, int(port), SenderConfig(binding), peer)
        except (OSError, ValueError, Fnx2Error) as exc:
            raise Unavailable(f"cannot open the probe channel to {address}: {exc}", reason="PROBE_UNREACHABLE",
                              field="probe_address") from exc
        try:
            samples = await link_probe.measure_link(client, binding, runs, request.rtt_iters or DEFAULT_RTT_ITERS)
        except (Fnx2Error, RuntimeError) as exc:
            raise Unavailable(f"the probe channel to {address} failed: {exc}", reason="PROBE_FAILED") from exc
        finally:
            await client.close()
        rtt, throughput = samples.figures()
        profile = LinkProfile(from_host=from_host, to_host=to_host, rtt_32kib_s=rtt, throughput_bytes_per_s=throughput,
                              transport="fnx2+tls", command=request.command or "StageWorkerService/ProfileLink",
                              measured_unix_ns=time.time_ns(), valid_for_s=request.valid_for_s or DEFAULT_VALID_FOR_S)
        facts = self._host_facts(from_host)
        build = f"fnx2 2.0 over TLS, python {platform.python_version()}, {backend_build(self._cfg.backend) or ''}"
        shapes = (f"round trip: {link_probe.rows_for(link_probe.LINK_RTT_BYTES)} decode rows x "
                  f"{link_probe.WIDTH} bf16 echoed, median of {request.rtt_iters or DEFAULT_RTT_ITERS} per run; "
                  f"throughput: one {link_probe.LINK_THROUGHPUT_BYTES} B bf16 frame per run, send to answer; "
                  f"to {to_host} at {address} ({peer})")
        content, blob = link_profile_record(profile, facts.describe(), build, shapes)
        log.info("link_profiled", from_host=from_host, to_host=to_host, rtt_s=rtt.median,
                 throughput_bytes_per_s=throughput.median)
        return pb.ProfileLinkResponse(profile_json=blob, record=content_to_proto(self._signed(content, blob)))
