"""The client side of one installed stage pipeline: admission, FNX2 batches, cancel, release.

The orchestrator drives a `Route`. Everything on the request path goes over the FNX2 channel
to stage 0, and each stage forwards it to the next: admission (CONTROL admit of the
`inband_admission` extension: KV reserved, sampling recorded on the final stage), ragged
batches of token ids, and CANCEL and RELEASE, whose ACKs carry each stage's KV epoch. The
final stage's sampled tokens (or logits) come back along the chain. gRPC stays for control:
load, unload, health, drain.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc
import numpy as np

from fornax.stage_worker.v1 import stage_worker_pb2 as pb
from fornax.stage_worker.v1 import stage_worker_pb2_grpc as pb_grpc
from libs.fnx2 import (
    Batch,
    BatchDescriptor,
    Phase,
    SequenceResult,
    SequenceSlice,
    SequenceStatus,
    derive_execution_lease_id,
)
from libs.fnx2.channel.sender import Fnx2Client, SenderConfig
from libs.fnx2.wire.admission import (
    EXT_INBAND_ADMISSION,
    AckAdmit,
    Admission,
    Grammar,
    OutputMode,
    Sampling,
    f32_bits,
)
from libs.fnx2.wire.control import AckCancel, AckRelease, ChannelBinding
from libs.fnx2.wire.errors import ChannelClosedError, ErrorCode, Fnx2Error
from libs.fnx2.wire.tensor import DType, Tensor, TensorKind
from libs.model.kv_blocks import KV_BLOCK_TOKENS, prefix_chain
from libs.model.sampling import SamplingParams
from libs.security.fnx2_tls import Fnx2Tls
from libs.service.channels import ChannelConfig, open_aio_channel
from libs.service.errors import (
    FailedPrecondition,
    FornaxError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from libs.service.interceptors import reason_of
from services.orchestrator.engine.drift import MeasuredService
from services.orchestrator.engine.unavailable import route_unavailable
from services.orchestrator.route import lease_numbers
from services.orchestrator.route.route_health import (
    DataPlaneMeter,
    StageCondition,
    StageProbe,
    condition_of_rpc_error,
)

GATEWAY = "gateway"
_Ack = TypeVar("_Ack", AckAdmit, AckCancel, AckRelease)
UNLOAD_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RouteTimeouts:
    """Every call on the request path has a deadline, so a dead or stopped stage costs a
    bounded wait, never a hang."""

    admit_s: float = 5.0
    cancel_s: float = 2.0
    release_s: float = 2.0
    health_s: float = 1.0
    # Added to a batch's largest deadline budget: the RESULT may trail the deadline a little.
    batch_grace_s: float = 2.0


@dataclass(frozen=True)
class RouteStage:
    index: int
    control_address: str  # gRPC host:port
    data_plane_address: str  # FNX2 host:port
    manifest_hash: str
    # The identity in that worker's certificate, which the previous hop checks; "" without TLS.
    data_plane_identity: str = ""
    # The block-format activations the loaded MAX stage runs, as it reported them; "" off MAX.
    max_activations: str = ""


@dataclass(frozen=True)
class RoutePlan:
    plan_id: str
    plan_hash: str
    plan_generation_id: str
    stages: tuple[RouteStage, ...]


def sampling_to_pb(sampling: SamplingParams) -> pb.SamplingSpec:
    spec = pb.SamplingSpec(
        temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, seed=sampling.stream_seed,
        presence_penalty=sampling.presence_penalty, frequency_penalty=sampling.frequency_penalty,
        logit_bias=dict(sampling.logit_bias), first_sample_position=sampling.first_sample_position,
        generated_token_ids=sampling.generated_token_ids,
        logprobs=sampling.top_logprobs is not None, top_logprobs=sampling.top_logprobs or 0,
    )
    if sampling.grammar is not None:
        spec.grammar.CopyFrom(pb.GrammarConstraint(lark_grammar=sampling.grammar.lark,
                                                   end_token_ids=sampling.grammar.end_token_ids))
    return spec


@dataclass(frozen=True)
class PrefixQuery:
    """What admission sends for prefix reuse: the tenant's salt and the prompt's first chunk."""

    salt: bytes
    token_ids: tuple[int, ...]


def reusable_tokens(stage_cached: Sequence[int], prompt_tokens: int) -> int:
    """Tokens the route reuses: whole blocks every stage holds, leaving at least one prompt
    token to prefill (its row gives the first sample)."""
    held = min(stage_cached, default=0)
    last_block_start = (max(prompt_tokens - 1, 0) // KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS
    return max(0, min(held - held % KV_BLOCK_TOKENS, last_block_start))


@dataclass(frozen=True)
class StageLoad:
    """One stage to load: its worker's gRPC address and its spec, next hop not yet known."""

    address: str
    spec: pb.StageSpec
    # The identity in the worker's certificate, which its previous hop checks; "" without TLS.
    identity: str = ""


async def load_route(loads: Sequence[StageLoad], load_timeout_s: float = 3600.0,
                     progress: Callable[[str], None] = lambda message: None,
                     channel: ChannelConfig = ChannelConfig(), keep_generation: str = "",
                     replace_generation: str = "") -> RoutePlan:
    """Load last to first, so each stage is told its next hop's FNX2 address and manifest hash.

    Every spec carries the same plan binding. Whatever a worker had loaded before is unloaded,
    except plan generation `keep_generation`: the serving route, which the new one loads beside
    (a worker refuses with INSUFFICIENT_MEMORY_FOR_OVERLAP when both do not fit). With
    `replace_generation` only that generation is unloaded first (a reload of a lost route, which
    leaves any other generation alone, such as one an install is loading). A failed load
    unloads the new generation from every worker that took it, leaving the kept one serving.
    """
    next_address, next_manifest, loaded = "", "", []
    generation = loads[0].spec.plan.plan_generation_id
    try:
        for load in reversed(loads):
            spec = pb.StageSpec()
            spec.CopyFrom(load.spec)
            spec.next_hop_address, spec.next_hop_manifest_hash = next_address, next_manifest
            layers = spec.layer_range
            async with open_aio_channel(load.address, channel) as opened:
                stub = pb_grpc.StageWorkerServiceStub(opened)
                await stub.UnloadStage(pb.UnloadStageRequest(request_id=str(uuid.uuid4()),
                                                             plan_generation_id=replace_generation,
                                                             keep_plan_generation_id=keep_generation),
                                       timeout=UNLOAD_TIMEOUT_S)
                progress(f"loading stage {spec.stage_index} (layers {layers.layer_start}-"
                         f"{layers.layer_end_exclusive - 1}) on {load.address}"
                         + (" beside the serving generation" if keep_generation else ""))
                try:
                    reply = await stub.LoadStage(pb.LoadStageRequest(request_id=str(uuid.uuid4()), spec=spec),
                                                 timeout=load_timeout_s)
                except grpc.aio.AioRpcError as exc:
                    raise _load_refusal(spec.stage_index, load.address, exc) from exc
            next_address, next_manifest = reply.data_plane_address, reply.manifest_hash
            loaded.append(RouteStage(spec.stage_index, load.address, reply.data_plane_address, reply.manifest_hash,
                                     load.identity, reply.max_activations))
    except BaseException:
        await unload_generation([load.address for load in loads], generation, channel)
        raise
    binding = loads[0].spec.plan
    return RoutePlan(binding.plan_id, binding.plan_hash, binding.plan_generation_id, tuple(reversed(loaded)))


def _load_refusal(stage_index: int, address: str, error: grpc.aio.AioRpcError) -> BaseException:
    """A worker's precondition refusal (memory for an overlap, a backend mismatch...) as the
    same reason, naming the stage; a worker lost in the middle of the load (its process ended,
    e.g. killed by its host's memory limit) as STAGE_WORKER_LOST, naming the stage and worker;
    any other failure passes through unchanged."""
    reason = reason_of(error)
    if error.code() is grpc.StatusCode.FAILED_PRECONDITION and reason:
        return FailedPrecondition(f"stage {stage_index} refused the load: {error.details()}", reason=reason)
    if error.code() is grpc.StatusCode.UNAVAILABLE and not reason:
        return Unavailable(f"stage {stage_index}: the worker at {address} was lost while loading "
                           f"({error.details()}); see its log and its host's OOM kills", reason="STAGE_WORKER_LOST")
    return error


@dataclass(frozen=True)
class UnloadOutcome:
    """What one generation's stages still held when unloaded (0 after a clean drain)."""

    live_sequences: int
    kv_bytes_used: int
    failures: tuple[str, ...]  # per unreachable worker: why it could not be told


async def unload_generation(addresses: Sequence[str], generation: str,
                            channel: ChannelConfig = ChannelConfig()) -> UnloadOutcome:
    """Unloads plan generation `generation` on each worker, leaving any other generation loaded.
    Never raises for a worker that cannot be reached: it frees the generation when its leases expire."""
    message = pb.UnloadStageRequest(request_id=str(uuid.uuid4()), plan_generation_id=generation)

    async def one(address: str) -> pb.UnloadStageResponse:
        async with open_aio_channel(address, channel) as opened:
            return await pb_grpc.StageWorkerServiceStub(opened).UnloadStage(message, timeout=UNLOAD_TIMEOUT_S)

    replies = await asyncio.gather(*(one(a) for a in dict.fromkeys(addresses)), return_exceptions=True)
    done = [r for r in replies if isinstance(r, pb.UnloadStageResponse)]
    failures = tuple(f"{type(r).__name__}" for r in replies if isinstance(r, BaseException))
    return UnloadOutcome(sum(r.live_sequences_at_unload for r in done), sum(r.kv_bytes_used_at_unload for r in done),
                         failures)


def lease_id_for(plan: RoutePlan, request_id: str) -> str:
    return derive_execution_lease_id(plan.plan_generation_id, plan.plan_id, plan.plan_hash, request_id)


def route_slice(plan: RoutePlan, request_id: str, sequence_no: int, position_start: int, kv_epoch: int,
                row_count: int, deadline_budget_ns: int) -> SequenceSlice:
    """An FNX2 slice of the request's lease on this plan (trace and span ids: the request id),
    for callers that drive a `Route` directly: warm-up, qualification and tests."""
    return SequenceSlice(request_id, sequence_no, 0, row_count, position_start, kv_epoch, deadline_budget_ns,
                         lease_id_for(plan, request_id), request_id, request_id)


class Route:
    def __init__(self, plan: RoutePlan, timeouts: RouteTimeouts = RouteTimeouts(),
                 channel: ChannelConfig = ChannelConfig(), data_plane_tls: Fnx2Tls | None = None,
                 numbers: lease_numbers.LeaseNumbers | None = None):
        """`numbers`: the lease counter to draw from; by default the one this process shares
        among every route on the plan generation."""
        self.plan = plan
        self.timeouts = timeouts
        self._tls = data_plane_tls
        self._channels = [open_aio_channel(s.control_address, channel) for s in plan.stages]
        self._stubs = [pb_grpc.StageWorkerServiceStub(c) for c in self._channels]
        self._client: Fnx2Client | None = None
        self._batch_numbers = itertools.count()
        # Each lease's place in this generation's opening order (the FNX2 lease_sequence
        # extension), from its opening frame until its release; the counter is the
        # generation's, shared with every other route opened on it.
        self._lease_numbers = (numbers if numbers is not None
                               else lease_numbers.for_generation(plan.plan_generation_id))
        self._lease_sequences: dict[str, int] = {}
        # Batches out and RESULTs back: the route health's data-plane progress signal.
        self.meter = DataPlaneMeter()

    async def open(self) -> None:
        """Opens (or reopens, after `abort`) the FNX2 channel to stage 0."""
        first = self.plan.stages[0]
        binding = ChannelBinding(
            self.plan.plan_id, self.plan.plan_hash, first.manifest_hash, "stage-0", self.plan.plan_generation_id
        )
        host, _, port = first.data_plane_address.rpartition(":")
        if self._tls is not None:
            self._client = await self._tls.connect(host, int(port), SenderConfig(binding), first.data_plane_identity)
        else:
            self._client = await Fnx2Client.connect(host, int(port), SenderConfig(binding))
        if self._client.lease_sequence_next is not None:  # never below what stage 0 has seen
            self._lease_numbers.raise_to(self._client.lease_sequence_next)

    async def abort(self) -> None:
        """Closes the FNX2 channel: every batch still waiting fails at once."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def close(self) -> None:
        await self.abort()
        for channel in self._channels:
            await channel.close()

    async def admit(self, request_id: str, reserve_tokens: int, sampling: SamplingParams,
                    logits: bool = False, prefix: PrefixQuery | None = None) -> int:
        """Reserve KV on every stage, in band: one CONTROL admit to stage 0, which each stage
        applies and forwards down the chain; a refusal anywhere leaves no stage reserved.

        With a prefix query, returns the prompt tokens every stage holds (the minimum over the
        stages, whole blocks): the request's first slice may start there. Otherwise 0.
        """
        admission = inband_admission(self.plan, request_id, reserve_tokens, sampling, logits, prefix)
        sent = self._client is not None
        try:
            ack = await self._lease_control(lambda client: client.admit(admission), self.timeouts.admit_s,
                                            "admit")
        except Unavailable:
            if sent:  # some stages may have admitted before the answer was lost: undo, best effort
                try:
                    await self.release(request_id)
                except Exception:  # noqa: BLE001 - the lease expires on the stages that admitted it
                    pass
            raise
        if not ack.admitted:
            raise stage_refusal(ack)
        if prefix is None:
            return 0
        return reusable_tokens(ack.cached_tokens, len(prefix.token_ids))

    async def _lease_control(self, send: Callable[[Fnx2Client], Awaitable[_Ack]], timeout_s: float,
                             what: str) -> _Ack:
        """One in-band lease control to stage 0 (and on down the chain), with a deadline; a
        lost or silent data plane makes the route unavailable, never a hang."""
        client = self._client
        if client is None:
            raise route_unavailable("the route's data plane is closed")
        if EXT_INBAND_ADMISSION not in client.extensions:
            raise route_unavailable(f"stage 0 did not accept {EXT_INBAND_ADMISSION}: it cannot {what} in band")
        try:
            return await asyncio.wait_for(send(client), timeout_s * len(self.plan.stages))
        except TimeoutError:
            raise route_unavailable(f"the stages did not answer {what} in time") from None
        except (ChannelClosedError, ConnectionError, OSError) as exc:
            raise route_unavailable("the data plane connection to stage 0 was lost") from exc
        except Fnx2Error as exc:
            if exc.terminal or exc.code is ErrorCode.FAILED:
                raise route_unavailable(f"a stage could not {what} ({exc.code.value})") from exc
            raise FailedPrecondition(f"stage 0 refused {what}: {exc.message}", reason=exc.code.value) from exc

    async def run(self, phase: Phase, slices: Sequence[SequenceSlice], token_ids: np.ndarray,
                  traceparent: str | None = None) -> list[tuple[SequenceResult, np.ndarray | None]]:
        """One ragged batch through every stage: `token_ids` holds each slice's
        `input_row_count` rows in slice order (the route lays out their row starts and lease
        sequence numbers). Returns each slice's FNX2 result with its output rows (an int32
        sampled token, or float32 logits; None unless OK), in slice order."""
        if self._client is None:
            raise route_unavailable("the route's data plane is closed")
        batch = self._batch(phase, slices, token_ids, traceparent)
        budget_s = max(s.deadline_budget_ns for s in slices) / 1e9
        served = False
        self.meter.submitted()
        try:
            result = await asyncio.wait_for(self._client.submit(batch),
                                            budget_s + self.timeouts.batch_grace_s)
            served = any(r.status is SequenceStatus.OK for r in result.results)
        except TimeoutError:
            raise route_unavailable("stage 0 did not answer a batch before its deadline") from None
        except (ChannelClosedError, ConnectionError, OSError) as exc:
            raise route_unavailable("the data plane connection to stage 0 was lost") from exc
        except Fnx2Error as exc:
            if exc.terminal:
                raise route_unavailable(f"the data plane failed ({exc.code.value})") from exc
            raise
        finally:
            self.meter.answered(served)
        by_id = {r.request_id: r for r in result.results}
        answers = []
        for item in slices:
            r = by_id[item.request_id]
            answers.append((r, np.array(result.rows_for(r)) if r.status is SequenceStatus.OK else None))
        return answers

    def _batch(self, phase: Phase, slices: Sequence[SequenceSlice], token_ids: np.ndarray,
               traceparent: str | None = None) -> Batch:
        laid, row = [], 0
        for item in slices:
            if item.request_sequence_no == 0 and item.request_id not in self._lease_sequences:
                self._lease_sequences[item.request_id] = self._lease_numbers.take()
            number = self._lease_sequences.get(item.request_id)
            if (item.input_row_start, item.lease_sequence) != (row, number):
                item = SequenceSlice(item.request_id, item.request_sequence_no, row, item.input_row_count,
                                     item.token_position_start, item.kv_epoch, item.deadline_budget_ns,
                                     item.execution_lease_id, item.trace_id, item.span_id, number)
            laid.append(item)
            row += item.input_row_count
        ids = np.asarray(token_ids, dtype=np.int32)
        if ids.shape != (row,):
            raise ValueError(f"the slices name {row} rows, the batch holds {ids.shape}")
        descriptor = BatchDescriptor(str(uuid.uuid4()), next(self._batch_numbers), phase, row, tuple(laid))
        return Batch(
            self.plan.plan_id, self.plan.plan_hash, self.plan.stages[0].manifest_hash, GATEWAY, "stage-0",
            descriptor, Tensor.from_array(TensorKind.TOKEN_IDS, DType.INT32, ids), traceparent,
        )

    async def cancel(self, request_id: str) -> list[int]:
        """Cancel in band (FNX2 CANCEL down the chain); returns each stage's KV epoch."""
        lease = lease_id_for(self.plan, request_id)
        ack = await self._lease_control(lambda client: client.cancel(request_id, lease), self.timeouts.cancel_s,
                                        "cancel")
        return list(ack.stage_kv_epochs or ())

    async def release(self, request_id: str, publish_token_ids: Sequence[int] = ()) -> list[int]:
        """Free the request's KV on every stage in band (FNX2 RELEASE down the chain); returns
        each stage's final KV epoch. With `publish_token_ids` (every token its KV holds) each
        stage first publishes its full blocks under the salt it admitted the request with."""
        self._lease_sequences.pop(request_id, None)
        lease = lease_id_for(self.plan, request_id)
        tokens = tuple(int(t) for t in publish_token_ids)
        ack = await self._lease_control(lambda client: client.release(request_id, lease, publish_token_ids=tokens),
                                        self.timeouts.release_s, "release")
        return list(ack.stage_kv_epochs or ())

    async def health(self) -> list[pb.GetHealthResponse]:
        return list(await asyncio.gather(*(stub.GetHealth(self._health_request(), timeout=self.timeouts.health_s)
                                           for stub in self._stubs)))

    def _health_request(self) -> pb.GetHealthRequest:
        return pb.GetHealthRequest(plan_generation_id=self.plan.plan_generation_id)

    async def probe(self) -> list[StageProbe]:
        """Each stage's condition, from one bounded GetHealth call per stage."""
        replies = await asyncio.gather(*(stub.GetHealth(self._health_request(), timeout=self.timeouts.health_s)
                                         for stub in self._stubs), return_exceptions=True)
        probes = []
        for index, reply in enumerate(replies):
            if isinstance(reply, grpc.aio.AioRpcError):
                probes.append(StageProbe(index, condition_of_rpc_error(reply.code())))
            elif isinstance(reply, BaseException):
                probes.append(StageProbe(index, StageCondition.UNREACHABLE))
            elif reply.plan.plan_generation_id != self.plan.plan_generation_id:
                probes.append(StageProbe(index, StageCondition.NOT_LOADED))  # restarted or reloaded
            else:
                probes.append(StageProbe(index, _condition_of_state(reply.state), measured_service(reply)))
        return probes


def measured_service(reply: pb.GetHealthResponse) -> MeasuredService:
    times = reply.service_times
    return MeasuredService(times.decode_microbatches, times.recent_decode_service_ns / 1e9,
                           times.recent_decode_microbatches, times.recent_decode_rows)


def _condition_of_state(state: int) -> StageCondition:
    if state in (pb.STAGE_STATE_READY, pb.STAGE_STATE_EXECUTING):
        return StageCondition.READY
    if state == pb.STAGE_STATE_DRAINING:
        return StageCondition.DRAINING
    if state == pb.STAGE_STATE_FAILED:
        return StageCondition.FAILED
    return StageCondition.NOT_LOADED


def inband_admission(plan: RoutePlan, request_id: str, reserve_tokens: int, sampling: SamplingParams,
                     logits: bool = False, prefix: PrefixQuery | None = None) -> Admission:
    """The admission every stage applies, as FNX2 CONTROL admit carries it (the sampling
    parameters at the control plane's binary32 precision)."""
    spec = sampling_to_pb(sampling)
    grammar = (Grammar(spec.grammar.lark_grammar, tuple(spec.grammar.end_token_ids))
               if spec.HasField("grammar") else None)
    wire = Sampling(
        f32_bits(spec.temperature), spec.top_k, f32_bits(spec.top_p), spec.seed, f32_bits(spec.presence_penalty),
        f32_bits(spec.frequency_penalty), tuple(sorted((t, f32_bits(b)) for t, b in spec.logit_bias.items())),
        grammar, spec.first_sample_position, tuple(spec.generated_token_ids),
        spec.top_logprobs if spec.logprobs else None,
    )
    salt = b""
    tokens: tuple[int, ...] = ()
    hashes: tuple[bytes, ...] = ()
    if prefix is not None:
        salt, tokens = prefix.salt, tuple(prefix.token_ids)
        hashes = tuple(prefix_chain(prefix.salt, prefix.token_ids))
    return Admission(request_id, lease_id_for(plan, request_id), reserve_tokens,
                     OutputMode.LOGITS if logits else OutputMode.SAMPLED_TOKENS, wire, salt, tokens, hashes)


# A stage's in-band refusal, by its stable reason, as the same error its AdmitSequence gave.
_REFUSAL_ERRORS: dict[str, type[FornaxError]] = {
    "KV_CAPACITY": ResourceExhausted, "DRAINING": FailedPrecondition, "STAGE_NOT_LOADED": FailedPrecondition,
    "UNKNOWN_LEASE": NotFound,
}


class StageRefusal:
    """Mixin: a refusal reads as the stage's own words, as a gRPC error's details did."""

    message: str

    def __str__(self) -> str:
        return self.message


def stage_refusal(ack: AckAdmit) -> FornaxError:
    """An ADMISSION refusal: the stage's reason (KV_CAPACITY, PREFIX_CHAIN, SAMPLING...)
    and its message, as the error class that reason had on the control plane."""
    base = _REFUSAL_ERRORS.get(ack.reason or "", InvalidArgument)
    refusal = type(f"Stage{base.__name__}", (StageRefusal, base), {})
    return refusal(ack.error_message or "", reason=ack.reason)
