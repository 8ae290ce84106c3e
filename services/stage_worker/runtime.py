"""One loaded stage: weights, executor, admissions and KV accounting, behind the lifecycle.

Blocking model work runs on one dedicated thread per device, so the event loop keeps
serving control RPCs and the data plane while a batch executes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import structlog

from libs.artifacts.transfer import ArtifactCache
from libs.common.kinds import FLOAT_DTYPES, Backend, DType, block_activations_refusal
from libs.common.proto import dtype_pb_name
from libs.model.config import DeepseekV2Config, load_config
from libs.model.errors import KvEpochError, ModelError
from libs.model.executor import PendingKv, StageBatch, StageExecutor, StageResult
from libs.model.executor import StageSpec as ExecutorSpec
from libs.model.kernels import make_kernels
from libs.model.kv_blocks import KV_BLOCK_TOKENS, PoolStats, require_kv_backend
from libs.model.kv_store import KvLayout
from libs.model.sampling import SamplingParams
from libs.model.weights import load_stage_weights
from libs.profiles.sustained_clock import IntervalClock
from libs.service.channels import ChannelConfig
from libs.service.errors import FailedPrecondition, FornaxError, InvalidArgument, NotFound, ResourceExhausted
from libs.structured.decoding import DecodingTable
from libs.structured.grammar import GrammarVocabulary
from services.stage_worker.fetch import fetch_artifact
from services.stage_worker.kv_fit import HostMemory, KvFit, fit_kv
from services.stage_worker.lifecycle import Lifecycle, StageState
from services.stage_worker.overlap import Footprint
from services.stage_worker.phase_totals import PhaseTotals
from services.stage_worker.service_times import ServiceTimes


@dataclass(frozen=True)
class PlanBinding:
    plan_id: str
    plan_hash: str
    plan_generation_id: str


@dataclass(frozen=True)
class LoadSpec:
    stage_index: int
    stage_count: int
    layer_start: int
    layer_end: int  # exclusive
    plan: PlanBinding
    backend: Backend
    boundary_dtype: DType  # one of FLOAT_DTYPES: the hop out of this stage
    device: str = "cpu"
    # The hop into this stage; None = boundary_dtype.
    input_boundary_dtype: DType | None = None
    checkpoint_dir: str | None = None
    artifact_dir: str | None = None
    # gRPC address of the artifact builder to fetch artifact `manifest_hash` from.
    artifact_source: str | None = None
    manifest_hash: str | None = None
    next_hop: str | None = None
    next_hop_manifest_hash: str | None = None
    kv_limit_bytes: int = 0
    return_logits: bool = False
    # Fleet identities (spiffe URIs) of the peers on the data plane; None without TLS.
    previous_hop_identity: str | None = None
    next_hop_identity: str | None = None
    # KV element type (libs.model.kv_store.KV_DTYPES); None = the worker's --kv-dtype.
    kv_dtype: str | None = None
    # A MAX stage's block-format activations (BLOCK_ACTIVATIONS); None = the worker's --max-activations.
    max_activations: str | None = None

    @property
    def input_dtype(self) -> DType:
        return self.input_boundary_dtype or self.boundary_dtype

    @property
    def first(self) -> bool:
        return self.stage_index == 0

    @property
    def last(self) -> bool:
        return self.stage_index == self.stage_count - 1

    def downstream(self) -> tuple[str, str]:
        """(next hop FNX2 address, its manifest hash); only the last stage has neither."""
        if not self.next_hop or not self.next_hop_manifest_hash:
            raise FailedPrecondition(f"stage {self.stage_index} has no next hop", reason="NO_NEXT_HOP")
        return self.next_hop, self.next_hop_manifest_hash


@dataclass(frozen=True)
class SequenceAdmission:
    request_id: str
    lease_id: str
    reserve_bytes: int
    sampling: SamplingParams
    # Prefix reuse: the prompt's block hashes as this stage computed them (empty: no reuse).
    prefix_chain: tuple[bytes, ...] = ()
    prefix_salt: bytes = b""  # the salt that chain was hashed with (publish_chain hashes with it too)
    # Tokens of the prompt this stage holds for the lease, set when admitted.
    cached_tokens: int = 0


@dataclass(frozen=True)
class HealthSnapshot:
    state: StageState
    inflight_batches: int
    live_sequences: int
    kv_bytes_used: int
    kv_bytes_limit: int
    kv_bytes_high_water: int
    inflight_high_water: int
    batches_executed: int
    failure_reason: str
    plan: PlanBinding | None
    phase_totals: PhaseTotals | None = None
    service_times: ServiceTimes | None = None
    kv_blocks: PoolStats | None = None
    kv_block_tokens: int = KV_BLOCK_TOKENS


@dataclass
class _Counters:
    inflight: int = 0
    inflight_high_water: int = 0
    executed: int = 0


@dataclass
class LoadedStage:
    spec: LoadSpec
    config: DeepseekV2Config
    executor: StageExecutor
    manifest_hash: str
    weight_bytes: int
    load_seconds: float
    admissions: dict[str, SequenceAdmission] = field(default_factory=dict)
    cancelled: set[str] = field(default_factory=set)
    # Final stage: per-request grammar and penalty state (empty on other stages).
    decoding: DecodingTable | None = None
    # KV limit mode "fit": how the KV budget was derived from the host's memory (None: fixed).
    kv_fit: KvFit | None = None
    # The block-format activations the stage's MAX graphs run ("" on other backends).
    max_activations: str = ""


def _compile_progress(message: str) -> None:
    structlog.get_logger().info("compile_progress", message=message)


def _timed(executor: StageExecutor, batch: StageBatch, submitted: float,
           clock: IntervalClock) -> tuple[StageResult, PendingKv, float, float]:
    """Queue seconds on the wall clock (waiting costs no CPU); compute on the service clock."""
    queue_s = time.perf_counter() - submitted
    mark = clock.mark()
    result, pending = executor.run(batch)
    return result, pending, queue_s, clock.since(mark)


def checkpoint_stage_hash(spec: LoadSpec) -> str:
    """Identity of a stage loaded straight from a checkpoint: its config bytes and layer range.

    Artifact loads use the artifact's manifest hash instead; this stands in for it so that the
    data plane is bound to exactly this slice of exactly this checkpoint.
    """
    if not spec.checkpoint_dir:
        raise InvalidArgument("the stage is not loaded from a checkpoint", field="spec.checkpoint_dir")
    config_sha = hashlib.sha256(Path(spec.checkpoint_dir, "config.json").read_bytes()).hexdigest()
    identity = {
        "config_sha256": config_sha,
        "layer_start": spec.layer_start,
        "layer_end_exclusive": spec.layer_end,
        "stage_index": spec.stage_index,
        "stage_count": spec.stage_count,
    }
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def _grammar_vocabulary(source: str, config: DeepseekV2Config) -> GrammarVocabulary | None:
    """The final stage constrains sampling with the tokenizer its artifact carries (verified
    with the artifact); without one, constrained requests are refused at admission."""
    path = Path(source, "tokenizer.json")
    if not path.exists():
        return None
    return GrammarVocabulary(path.read_text(encoding="utf-8"), config.vocab_size)


def check_max_activations(value: str | None, backend: Backend) -> None:
    """A stage's block-format activations: a value MAX knows, and only on a MAX stage (a numpy
    stage has no such products: the value is refused, never ignored): MAX_ACTIVATIONS_UNSUPPORTED /
    MAX_ACTIVATIONS_BACKEND (`libs.common.kinds.block_activations_refusal`)."""
    refusal = block_activations_refusal(value or "", backend)
    if refusal is not None:
        reason, message = refusal
        raise InvalidArgument(message, reason=reason, field="spec.max_activations")


def _check_boundary_contract(spec: LoadSpec, manifest) -> None:
    """The hops' dtypes are part of the stage contract the artifact was built for."""
    expected = [(manifest.boundary_input, spec.input_dtype, not spec.first),
                (manifest.boundary_output, spec.boundary_dtype, not spec.last)]
    for side, dtype, is_activation in expected:
        if is_activation and side.dtype != dtype_pb_name(dtype):
            raise FailedPrecondition(
                f"the artifact's boundary is {side.dtype}, the stage spec asks for {dtype}",
                reason="BOUNDARY_CONTRACT_MISMATCH", field="spec.boundary_dtype")


class StageRuntime:
    def __init__(self, backend: Backend, device: str, default_kv_limit_bytes: int,
                 artifact_cache_dir: str | None = None, fetch_channel: ChannelConfig = ChannelConfig(),
                 device_thread: ThreadPoolExecutor | None = None, phase_totals: PhaseTotals | None = None,
                 kv_dtype: str = "fp32", kv_fit: Callable[[], HostMemory] | None = None,
                 max_activations: str = "int8", service_clock: IntervalClock | None = None):
        self.backend = backend
        # What a batch's unpack, compute and pack are timed on: the clock this host's profiles are
        # timed on (sustained cost under a CPU quota), so the route's service times and the plan's
        # predictions count the same thing.
        self.service_clock = service_clock or IntervalClock()
        # Block-format activations of this worker's MAX stages (--max-activations).
        self.max_activations = max_activations
        # KV limit mode "fit": the host's memory facts, read after the weights load; the
        # budget is what they leave (default_kv_limit_bytes, or the spec's, then caps it; 0 = none).
        self.kv_fit = kv_fit
        # Element type of this host's KV store (libs.model.kv_store.KV_DTYPES; --kv-dtype).
        self.kv_dtype = kv_dtype
        # How artifacts are fetched from the builder (this worker's certificate, under mTLS).
        self.fetch_channel = fetch_channel
        self.artifact_cache = ArtifactCache(Path(artifact_cache_dir)) if artifact_cache_dir else None
        self.device = device
        self.default_kv_limit_bytes = default_kv_limit_bytes
        self.lifecycle = Lifecycle()
        self.stage: LoadedStage | None = None
        self._counters = _Counters()
        # The worker's data-plane time since it started, across every plan generation it held.
        self.phase_totals = phase_totals or PhaseTotals()
        self.service_times = ServiceTimes(self.service_clock.timing)
        # Shared by every plan generation the worker holds: one device, one thread.
        self._device_thread = device_thread or ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"stage-{device}")
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def device_thread(self) -> ThreadPoolExecutor:
        """The one thread that runs this worker's model work (batches, loads and profiles)."""
        return self._device_thread

    # ---- load / unload -------------------------------------------------------------------
    async def load(self, spec: LoadSpec) -> LoadedStage:
        self._check_spec(spec)
        if self.lifecycle.state in (StageState.READY, StageState.EXECUTING):
            raise FailedPrecondition("a stage is already loaded; unload it first", reason="STAGE_LOADED")
        self.lifecycle.move(StageState.LOADING)
        self.service_times = ServiceTimes(self.service_clock.timing)  # a new stage: its own measurements only
        loop = asyncio.get_running_loop()
        try:
            spec = await self._fetched(spec)
            self.stage = await loop.run_in_executor(self._device_thread, self._load_blocking, spec)
        except ModelError as exc:
            self.lifecycle.fail(f"{exc.reason}: {exc.message}")
            raise
        except Exception as exc:
            self.lifecycle.fail(f"{type(exc).__name__}: {exc}")
            raise
        self.lifecycle.move(StageState.READY)
        return self.stage

    async def prepare(self, spec: LoadSpec) -> LoadSpec:
        """The spec checked, and its artifact fetched: what `load` then loads without fetching,
        and whose footprint can be judged before anything is loaded."""
        self._check_spec(spec)
        return await self._fetched(spec)

    def footprint(self, spec: LoadSpec) -> Footprint:
        """What a prepared spec will hold resident: its source's weight files and its KV limit."""
        source = spec.checkpoint_dir or spec.artifact_dir or ""
        weight_bytes = sum(p.stat().st_size for p in Path(source).glob("*.safetensors"))
        return Footprint(weight_bytes, spec.kv_limit_bytes or self.default_kv_limit_bytes)

    def loaded_footprint(self) -> Footprint:
        stage = self.loaded()
        return Footprint(stage.weight_bytes, stage.executor.spec.kv_limit_bytes, stage.executor.kv.bytes_used())

    async def _fetched(self, spec: LoadSpec) -> LoadSpec:
        """A spec naming an artifact source loads from this worker's own fetched copy."""
        if not spec.artifact_source:
            return spec
        if self.artifact_cache is None:
            raise FailedPrecondition("this worker has no state directory to fetch artifacts into",
                                     reason="NO_ARTIFACT_CACHE", field="spec.artifact_source_address")
        local = await fetch_artifact(spec.artifact_source, spec.manifest_hash or "", self.artifact_cache,
                                     config=self.fetch_channel)
        return replace(spec, artifact_dir=str(local), artifact_source=None)

    def _check_spec(self, spec: LoadSpec) -> None:
        if spec.backend != self.backend:
            raise FailedPrecondition(
                f"this worker runs backend '{self.backend}'; the stage asks for '{spec.backend}'",
                reason="BACKEND_MISMATCH",
                field="spec.backend",
            )
        # Before any weights load or graphs compile: a backend that cannot hold the KV dtype
        # refuses it (KV_DTYPE_BACKEND), never falls back to another dtype.
        require_kv_backend(spec.kv_dtype or self.kv_dtype, str(spec.backend), field="spec.kv_dtype")
        check_max_activations(spec.max_activations, spec.backend)
        if spec.device != self.device:
            raise FailedPrecondition(
                f"this worker runs on {self.device!r}; the stage asks for {spec.device!r}",
                reason="DEVICE_MISMATCH",
                field="spec.device",
            )
        if sum(map(bool, (spec.checkpoint_dir, spec.artifact_dir, spec.artifact_source))) != 1:
            raise InvalidArgument("give exactly one of checkpoint_dir, artifact_dir or artifact_source_address",
                                  field="spec")
        if spec.artifact_source and not spec.manifest_hash:
            raise InvalidArgument(
                "artifact_source_address needs the manifest_hash to fetch", field="spec.manifest_hash"
            )
        if spec.artifact_source and self.artifact_cache is None:
            raise FailedPrecondition("this worker has no state directory to fetch artifacts into",
                                     reason="NO_ARTIFACT_CACHE", field="spec.artifact_source_address")
        if not 0 <= spec.stage_index < spec.stage_count:
            raise InvalidArgument("stage_index must be below stage_count", field="spec.stage_index")
        if spec.layer_end <= spec.layer_start:
            raise InvalidArgument("the layer range is empty", field="spec.layer_range")
        if not spec.last and not (spec.next_hop and spec.next_hop_manifest_hash):
            raise InvalidArgument(
                "every stage but the last needs next_hop_address and next_hop_manifest_hash",
                field="spec.next_hop_address",
            )
        if spec.boundary_dtype not in FLOAT_DTYPES or spec.input_dtype not in FLOAT_DTYPES:
            raise InvalidArgument(f"boundary dtypes must be one of {', '.join(FLOAT_DTYPES)}",
                                  field="spec.boundary_dtype")

    def _load_blocking(self, spec: LoadSpec) -> LoadedStage:
        started = time.perf_counter()
        source, manifest_hash = self._resolve_source(spec)
        config = load_config(source)
        weights = load_stage_weights(source, config, spec.layer_start, spec.layer_end, spec.first, spec.last)
        kernels = make_kernels(spec.backend, config, weights, spec.device, self._backend_options(spec))
        kv_dtype = spec.kv_dtype or self.kv_dtype
        limit = spec.kv_limit_bytes or self.default_kv_limit_bytes
        fitted = None
        if self.kv_fit is not None:
            layout = KvLayout(spec.layer_end - spec.layer_start, config.kv_lora_rank, config.qk_rope_head_dim,
                              kv_dtype)
            fitted = fit_kv(self.kv_fit(), layout.block_bytes(), cap_bytes=limit)
            limit = fitted.kv_bytes
            structlog.get_logger().info("kv_fit", kv_bytes=limit, derivation=fitted.describe())
        executor = StageExecutor(
            config, ExecutorSpec(spec.layer_start, spec.layer_end, spec.first, spec.last, limit,
                                 kv_dtype),
            kernels
        )
        weight_bytes = sum(p.stat().st_size for p in Path(source).glob("*.safetensors"))
        decoding = DecodingTable(config.vocab_size, _grammar_vocabulary(source, config)) if spec.last else None
        return LoadedStage(spec, config, executor, manifest_hash, weight_bytes, time.perf_counter() - started,
                           decoding=decoding, kv_fit=fitted, max_activations=self.activations_of(spec))

    def activations_of(self, spec: LoadSpec) -> str:
        """The block-format activations `spec` runs: its own, else this worker's; "" off MAX."""
        if spec.backend != Backend.MAX:
            return ""
        return spec.max_activations or self.max_activations

    def _backend_options(self, spec: LoadSpec) -> object | None:
        if spec.backend != Backend.MAX:
            return None
        from libs.model.max_kernels import MaxOptions

        return MaxOptions(device=spec.device, block_activations=self.activations_of(spec),
                          progress=_compile_progress)

    def _resolve_source(self, spec: LoadSpec) -> tuple[str, str]:
        if spec.checkpoint_dir:
            return spec.checkpoint_dir, checkpoint_stage_hash(spec)
        from libs.artifacts.verify import verify_artifact

        if not spec.artifact_dir:
            raise InvalidArgument("give exactly one of checkpoint_dir or artifact_dir", field="spec")
        verified = verify_artifact(spec.artifact_dir, expected_manifest_hash=spec.manifest_hash or None,
                                   expected_plan_hash=spec.plan.plan_hash or None)
        _check_boundary_contract(spec, verified.manifest)
        return str(spec.artifact_dir), verified.manifest_hash

    async def unload(self) -> None:
        if self.lifecycle.state in (StageState.EXECUTING, StageState.DRAINING):
            await self._idle.wait()
        if self.lifecycle.state != StageState.UNLOADED:
            self.lifecycle.move(StageState.UNLOADED)
        self.stage = None

    async def drain(self, timeout_s: float) -> None:
        self.lifecycle.require(StageState.READY, StageState.EXECUTING, StageState.DRAINING)
        self.lifecycle.move(StageState.DRAINING)
        try:
            await asyncio.wait_for(self._idle.wait(), timeout=timeout_s)
        except TimeoutError:
            pass

    # ---- requests ------------------------------------------------------------------------
    def loaded(self) -> LoadedStage:
        if self.stage is None or self.lifecycle.state not in (
            StageState.READY,
            StageState.EXECUTING,
            StageState.DRAINING,
        ):
            raise FailedPrecondition(
                f"no stage is loaded (state {self.lifecycle.state.value})", reason="STAGE_NOT_LOADED"
            )
        return self.stage

    def admit(self, admission: SequenceAdmission) -> tuple[int, int]:
        """Reserve KV for a request and pin its resident prompt prefix.

        Returns (bytes still free after the reservation, prompt tokens this stage holds).
        """
        stage = self.loaded()
        if self.lifecycle.state == StageState.DRAINING:
            raise FailedPrecondition("the stage is draining and admits nothing new", reason="DRAINING")
        try:
            admission.sampling.validate()
        except ModelError as exc:
            raise InvalidArgument(exc.message, reason="SAMPLING", field="sampling") from exc
        if admission.request_id in stage.admissions:
            return self._kv_free(stage), stage.admissions[admission.request_id].cached_tokens
        free = self._kv_free(stage)
        if admission.reserve_bytes > free:
            kv = stage.executor.kv
            raise ResourceExhausted(
                f"stage {stage.spec.stage_index} has {free // kv.block_bytes} of {kv.pool.total_blocks} KV blocks "
                f"({kv.block_tokens} tokens each) unreserved, the request needs "
                f"{admission.reserve_bytes // kv.block_bytes}",
                reason="KV_CAPACITY",
            )
        if stage.decoding is not None:
            try:
                stage.decoding.open(admission.request_id, admission.sampling)
            except FornaxError as exc:
                raise InvalidArgument(exc.message, reason=exc.reason, field="sampling") from exc
        cached = 0
        if admission.prefix_chain:
            cached = stage.executor.kv.attach_prefix((admission.request_id, admission.lease_id),
                                                     admission.prefix_chain)
        stage.admissions[admission.request_id] = replace(admission, cached_tokens=cached)
        stage.cancelled.discard(admission.request_id)
        return free - admission.reserve_bytes, cached

    def _kv_free(self, stage: LoadedStage) -> int:
        """Bytes of whole blocks not reserved by an admitted request (reservations are in blocks)."""
        reserved = sum(a.reserve_bytes for a in stage.admissions.values())
        kv = stage.executor.kv
        return kv.pool.total_blocks * kv.block_bytes - reserved

    def kv_block_bytes(self) -> int:
        return self.loaded().executor.kv.block_bytes

    def kv_bytes_per_token(self) -> int:
        return self.loaded().executor.kv.layout.bytes_per_token

    def lease_of(self, request_id: str) -> str | None:
        admission = self.loaded().admissions.get(request_id)
        return admission.lease_id if admission else None

    def cancel(self, request_id: str) -> tuple[bool, int]:
        stage = self.loaded()
        found = request_id in stage.admissions
        stage.cancelled.add(request_id)
        return found, self._epoch(stage, request_id)

    def admission_salt(self, request_id: str) -> bytes:
        """The prefix salt a request was admitted with (empty: none, or not admitted)."""
        admission = self.loaded().admissions.get(request_id)
        return b"" if admission is None else admission.prefix_salt

    def release(self, request_id: str, publish_chain: tuple[bytes, ...] = ()) -> tuple[bool, int, int]:
        """Release a request's KV; with `publish_chain` (its tokens' hashes under its admission's
        salt) its full blocks are published first. A chain that does not extend the admitted
        prompt's publishes nothing: the KV is released all the same, then PREFIX_CHAIN."""
        stage = self.loaded()
        epoch = self._epoch(stage, request_id)
        admission = stage.admissions.pop(request_id, None)
        before = stage.executor.kv.bytes_used()
        refused: KvEpochError | None = None
        if admission is not None and publish_chain:
            try:
                stage.executor.kv.publish_chain((request_id, admission.lease_id), publish_chain)
            except KvEpochError as exc:
                refused = exc
        if admission is not None:
            stage.executor.release(request_id, admission.lease_id)
        stage.executor.kv.release_request(request_id)
        stage.cancelled.discard(request_id)
        if stage.decoding is not None:
            stage.decoding.close(request_id)
        if refused is not None:
            raise InvalidArgument(refused.message, reason="PREFIX_CHAIN", field="publish_token_ids")
        return admission is not None, epoch, before - stage.executor.kv.bytes_used()

    def epoch(self, request_id: str) -> int:
        """The request's KV epoch on this stage (0: none held)."""
        return self._epoch(self.loaded(), request_id)

    @staticmethod
    def _epoch(stage: LoadedStage, request_id: str) -> int:
        admission = stage.admissions.get(request_id)
        if admission is None:
            return 0
        try:
            return stage.executor.kv.epoch((request_id, admission.lease_id))
        except ModelError:
            return 0

    def sampling_for(self, request_id: str) -> SamplingParams:
        admission = self.loaded().admissions.get(request_id)
        if admission is None:
            raise NotFound(f"request {request_id!r} was not admitted on this stage", reason="UNKNOWN_LEASE")
        return admission.sampling

    def is_cancelled(self, request_id: str) -> bool:
        return self.stage is not None and request_id in self.stage.cancelled

    async def execute(self, batch: StageBatch) -> tuple[StageResult, PendingKv, float, float]:
        """Run a batch on the device thread, KV not yet committed.

        Returns (result, pending KV, queue seconds, compute seconds).
        """
        stage = self.loaded()
        self._enter()
        submitted = time.perf_counter()
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._device_thread, _timed, stage.executor, batch, submitted,
                                              self.service_clock)
        finally:
            self._leave()

    async def commit(self, pending: PendingKv, request_ids: frozenset[str] | None = None) -> None:
        """Commit the named requests' new KV on the device thread, which owns the KV store."""
        stage = self.loaded()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._device_thread, stage.executor.commit, pending, request_ids)

    def _enter(self) -> None:
        counters = self._counters
        counters.inflight += 1
        counters.inflight_high_water = max(counters.inflight_high_water, counters.inflight)
        self._idle.clear()
        if self.lifecycle.state == StageState.READY:
            self.lifecycle.move(StageState.EXECUTING)

    def _leave(self) -> None:
        counters = self._counters
        counters.inflight -= 1
        counters.executed += 1
        if counters.inflight == 0:
            self._idle.set()
            if self.lifecycle.state == StageState.EXECUTING:
                self.lifecycle.move(StageState.READY)

    def health(self) -> HealthSnapshot:
        stage = self.stage
        usage = stage.executor.kv_usage() if stage else None
        return HealthSnapshot(
            state=self.lifecycle.state,
            inflight_batches=self._counters.inflight,
            live_sequences=usage.live_sequences if usage else 0,
            kv_bytes_used=usage.bytes_used if usage else 0,
            kv_bytes_limit=usage.bytes_limit if usage else self.default_kv_limit_bytes,
            kv_bytes_high_water=usage.bytes_high_water if usage else 0,
            inflight_high_water=self._counters.inflight_high_water,
            batches_executed=self._counters.executed,
            failure_reason=self.lifecycle.failure_reason,
            plan=stage.spec.plan if stage else None,
            phase_totals=self.phase_totals,
            service_times=self.service_times,
            kv_blocks=usage.blocks if usage else None,
        )
