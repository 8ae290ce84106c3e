"""The stage's FNX2 data plane: receive from the previous hop, execute, forward to the next.

Each hop is a BATCH answered by a RESULT. A middle stage forwards its activation to the
next stage and answers its own RESULT with what came back, so the final stage's sampled
token ids (or logits) travel back along the chain while activations only ever move
forward, stage to stage. With the multi-inflight extension several batches are in flight
on every hop, so the stages of a pipeline work at the same time.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import numpy as np
import structlog
from opentelemetry import trace

from libs.fnx2.channel.listener import ListenerLimits
from libs.fnx2.channel.receiver import (
    Fnx2Receiver,
    ReceiverConfig,
    SequenceFailure,
    StageOutput,
    StageWork,
)
from libs.fnx2.channel.sender import Fnx2Client, SenderConfig
from libs.fnx2.wire.admission import AckAdmit, Admission
from libs.fnx2.wire.control import EXT_SAMPLE_LOGPROBS, ChannelBinding
from libs.fnx2.wire.errors import ErrorCode, Fnx2Error
from libs.fnx2.wire.messages import Batch, BatchDescriptor, SequenceStatus
from libs.fnx2.wire.messages import Phase as BatchPhase
from libs.fnx2.wire.tensor import DType, Tensor, TensorKind, boundary_payload
from libs.model.errors import KvLimitExceededError, ModelError
from libs.model.executor import StageBatch, StageResult
from libs.model.kv_blocks import prefix_chain
from libs.model.logprobs import RECORD_WIDTH, sample_records
from libs.security.fnx2_tls import Fnx2Tls
from libs.service.errors import FailedPrecondition, FornaxError
from libs.service.trace_context import context_from, current_traceparent
from services.stage_worker import convert, metrics
from services.stage_worker.leases import ReceiverLimits, ReceiverState
from services.stage_worker.leases.epochs import StageKvEpochs
from services.stage_worker.phase_totals import Phase
from services.stage_worker.runtime import LoadedStage, StageRuntime

log = structlog.get_logger()
_TRACER = trace.get_tracer("fornax.stage_worker")

# Frames one hop may have in flight when the peer negotiates multi-inflight.
INFLIGHT_FRAMES = 8


def stage_id(index: int) -> str:
    return f"stage-{index}"


def binding_for(stage: LoadedStage, index: int) -> ChannelBinding:
    plan = stage.spec.plan
    return ChannelBinding(plan.plan_id, plan.plan_hash, stage.manifest_hash, stage_id(index), plan.plan_generation_id)


class DataPlane:
    def __init__(self, runtime: StageRuntime, host: str, port: int, advertise_host: str = "",
                 tls: Fnx2Tls | None = None):
        self._runtime = runtime
        # With TLS the listener requires fleet certificates and each bound stage admits only
        # its planned previous hop; without it (explicitly insecure) anyone may connect.
        self._tls = tls
        self._host, self._requested_port = host, port
        self._advertise_host = advertise_host or host
        self._server: asyncio.AbstractServer | None = None
        self._receiver: Fnx2Receiver | None = None
        self._leases: ReceiverState | None = None  # the bound stage's session rules, its receiver's
        self._next_hop: Fnx2Client | None = None
        self._next_hop_lock = asyncio.Lock()
        self._stage: LoadedStage | None = None
        self.port = 0

    @property
    def advertised_host(self) -> str:
        return self._advertise_host

    @property
    def address(self) -> str:
        return f"{self._advertise_host}:{self.port}" if self.port else ""

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        options = self._tls.listener_options(ListenerLimits()) if self._tls else {}
        self._server = await loop.create_server(self._protocol, self._host, self._requested_port, **options)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        await self.unbind()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def _protocol(self) -> asyncio.BaseProtocol:
        """New channels go to the bound stage's receiver; with no stage bound they are closed."""
        receiver = self._receiver
        if self._tls is not None:
            self._tls.reload()  # a rotated certificate serves this connection's handshake
        return receiver.protocol() if receiver is not None else _Refuse()

    @property
    def bound(self) -> bool:
        return self._stage is not None

    async def bind(self, stage: LoadedStage, runtime: StageRuntime | None = None) -> None:
        """Accept traffic for a freshly loaded stage (run by `runtime`, when the worker holds
        one runtime per plan generation); earlier channels are closed."""
        await self.unbind()
        if runtime is not None:
            self._runtime = runtime
        self._stage = stage
        spec = stage.spec
        first = spec.first
        limits = ReceiverLimits(
            frames=INFLIGHT_FRAMES,
            kv_bytes=stage.executor.spec.kv_limit_bytes,
            kv_bytes_per_row=stage.executor.kv.layout.bytes_per_token,
            prefix_block_tokens=stage.executor.kv.block_tokens,
        )
        binding = binding_for(stage, spec.stage_index)
        self._leases = ReceiverState(binding, limits, epochs=StageKvEpochs(stage.executor.kv))
        self._receiver = Fnx2Receiver(
            ReceiverConfig(
                binding=binding,
                source_stage="gateway" if first else stage_id(spec.stage_index - 1),
                input_kind=TensorKind.TOKEN_IDS if first else TensorKind.ACTIVATION,
                input_dtype=DType.INT32 if first else DType(spec.input_dtype),
                input_width=None if first else stage.config.hidden_size,
                # No named previous hop admits nobody: "" is in no certificate.
                peer_policy=self._tls.admit_only(spec.previous_hop_identity or "") if self._tls else None,
            ),
            _Handler(self),
            self._leases,
        )

    async def unbind(self) -> None:
        """Stop serving the bound stage: its channels end, so none outlives it onto another."""
        receiver, self._receiver = self._receiver, None
        self._leases = None
        self._stage = None
        client, self._next_hop = self._next_hop, None
        if client is not None:
            await client.close()
        if receiver is not None:
            await receiver.close()

    def release_lease(self, request_id: str, lease_id: str | None) -> None:
        """Tombstone a lease released through the control plane, so no late frame revives it."""
        if self._leases is not None and lease_id is not None:
            try:
                self._leases.release(request_id, lease_id, None)
            except Fnx2Error as exc:
                raise FailedPrecondition(exc.message, reason=exc.code.value) from exc

    def cancel_lease(self, request_id: str, lease_id: str | None) -> None:
        if self._leases is not None and lease_id is not None:
            self._leases.cancel(request_id, lease_id)

    # ---- in-band lease control (the inband_admission extension) -----------------------------
    async def admit(self, admission: Admission) -> AckAdmit:
        """Admit on this stage, then on every stage after it; a refusal further down undoes
        this stage's reservation. The refusal names its stage and the same stable reason the
        control plane's AdmitSequence gives."""
        stage = self._stage
        label = stage_id(stage.spec.stage_index) if stage is not None else "stage"
        runtime = self._runtime
        try:
            local = convert.admission_from_pb(convert.admission_pb_from_inband(admission), runtime.kv_block_bytes())
            _, cached = runtime.admit(local)
        except FornaxError as exc:
            return AckAdmit.refusal(admission, exc.reason, exc.message, label)
        assert stage is not None  # runtime.kv_block_bytes() raised otherwise
        if stage.spec.last:
            return AckAdmit(admission.request_id, admission.execution_lease_id, True, (cached,))
        try:
            client = await self.next_hop(stage)
            down = await client.admit(admission)
        except BaseException:
            runtime.release(admission.request_id)
            raise
        if not down.admitted:
            runtime.release(admission.request_id)
            return down
        return replace(down, cached_tokens=(cached, *down.cached_tokens))

    async def cancel(self, request_id: str, lease_id: str) -> tuple[int, ...]:
        """Marks the request cancelled here and on every stage after it; each one's KV epoch."""
        stage = self._stage
        if stage is None:
            raise RuntimeError("no stage is bound")
        _, epoch = self._runtime.cancel(request_id)
        if stage.spec.last:
            return (epoch,)
        ack = await (await self.next_hop(stage)).cancel(request_id, lease_id)
        return (epoch, *(ack.stage_kv_epochs or ()))

    async def release(self, request_id: str, lease_id: str,
                      publish_token_ids: tuple[int, ...] = ()) -> tuple[int, ...]:
        """Frees the request's KV here and on every stage after it; each one's final epoch.
        With `publish_token_ids` each stage first publishes the lease's full blocks under the
        salt it admitted the request with. A publish this stage refuses (no salt, or tokens that
        do not extend the admitted prompt: PREFIX_CHAIN) is logged and counted; the KV is
        released all the same, and the release goes on down the chain."""
        stage = self._stage
        if stage is None:
            raise RuntimeError("no stage is bound")
        epoch = self._runtime.epoch(request_id)
        try:
            _, epoch, _ = self._runtime.release(request_id, self._publish_chain(request_id, publish_token_ids))
        except FornaxError as exc:  # the publish was refused; the KV is released all the same
            log.warning("prefix_publish_refused", request_id=request_id, reason=exc.reason, message=exc.message)
            metrics.PREFIX_PUBLISH_REFUSED.labels(stage_id(stage.spec.stage_index)).inc()
            self._runtime.release(request_id)
        if stage.spec.last:
            return (epoch,)
        ack = await (await self.next_hop(stage)).release(request_id, lease_id, publish_token_ids=publish_token_ids)
        return (epoch, *(ack.stage_kv_epochs or ()))

    def _publish_chain(self, request_id: str, tokens: tuple[int, ...]) -> tuple[bytes, ...]:
        if not tokens:
            return ()
        salt = self._runtime.admission_salt(request_id)
        if not salt:
            raise FailedPrecondition("publish_token_ids need a lease admitted with a prefix_salt",
                                     reason="PREFIX_CHAIN", field="publish_token_ids")
        return tuple(prefix_chain(salt, tokens))

    async def next_hop(self, stage: LoadedStage) -> Fnx2Client:
        async with self._next_hop_lock:
            if self._next_hop is None:
                address, manifest_hash = stage.spec.downstream()
                host, _, port = address.rpartition(":")
                plan = stage.spec.plan
                binding = ChannelBinding(
                    plan.plan_id, plan.plan_hash, manifest_hash,
                    stage_id(stage.spec.stage_index + 1),
                    plan.plan_generation_id,
                )
                if self._tls is not None:
                    self._next_hop = await self._tls.connect(host, int(port), SenderConfig(binding),
                                                             stage.spec.next_hop_identity or "")
                else:
                    self._next_hop = await Fnx2Client.connect(host, int(port), SenderConfig(binding))
            return self._next_hop

    # ---- execution -------------------------------------------------------------------------
    async def execute(self, work: StageWork) -> StageOutput:
        stage = self._stage
        if stage is None:
            raise RuntimeError("no stage is bound")
        label = stage_id(stage.spec.stage_index)
        name = f"{label} {work.batch.batch.phase.value}"
        with _TRACER.start_as_current_span(name, context=context_from(work.traceparent)) as span:
            span.set_attribute("fornax.stage_index", stage.spec.stage_index)
            span.set_attribute("fornax.batch_rows", work.batch.batch.input_row_count)
            span.set_attribute("fornax.sequences", len(work.sequences))
            occupancy = self._runtime.phase_totals.occupancy
            occupancy.begin_work()
            try:
                output = await self._execute(stage, work, label)
            finally:
                occupancy.end_work()
            for failure in output.failures:
                metrics.SEQUENCE_FAILURES.labels(label, failure.code).inc()
            usage = stage.executor.kv_usage()
            metrics.KV_BYTES.labels(label).set(usage.bytes_used)
            metrics.KV_SEQUENCES.labels(label).set(usage.live_sequences)
            metrics.record_kv_blocks(label, str(id(stage.executor.kv.pool)), usage.blocks)
            leases = self._leases
            if leases is not None:
                metrics.LEASE_TOMBSTONES.labels(label).set(leases.tombstones)
                metrics.LEASE_FENCE_ENTRIES.labels(label).set(leases.fence_entries)
            return output

    async def _execute(self, stage: LoadedStage, work: StageWork, label: str) -> StageOutput:
        live, failures = self._split_cancelled(work)
        if not live:
            return StageOutput(None, tuple(failures))
        phase = work.batch.batch.phase.value
        with _TRACER.start_as_current_span("unpack"):
            mark = self._runtime.service_clock.mark()
            batch = self._stage_batch(stage, work, live)
            unpack_s = self._runtime.service_clock.since(mark)
            self._runtime.phase_totals.observe(Phase.UNPACK, unpack_s, label)
        try:
            result, pending, queue_s, compute_s = await self._runtime.execute(batch)
        except ModelError as exc:
            failed = [SequenceFailure(s.request_id, _fnx2_code(exc), exc.message) for s in live]
            return StageOutput(None, tuple(failures + failed))
        _record_phase_spans(queue_s, compute_s)
        self._runtime.phase_totals.observe(Phase.QUEUE, queue_s, label, phase)
        self._runtime.phase_totals.observe(Phase.COMPUTE, compute_s, label, phase)
        pack_s = 0.0
        if stage.spec.last:
            output = self._final_output(stage, work, live, result, failures)
        else:
            output, pack_s = await self._forward(stage, work, live, result, failures)
        self._observe_service(work, live, unpack_s + compute_s + pack_s)
        # KV advances only for sequences the whole rest of the pipeline completed too.
        failed_ids = {f.request_id for f in output.failures}
        completed = frozenset(s.request_id for s in live if s.request_id not in failed_ids)
        await self._runtime.commit(pending, completed)
        metrics.KV_EPOCH_CHANGES.labels(label).inc(len(completed))
        return output

    def _observe_service(self, work: StageWork, live, service_s: float) -> None:
        """Decode per microbatch (rows = sequences), prefill per token (rows = prompt tokens)."""
        if work.batch.batch.phase is BatchPhase.DECODE:
            self._runtime.service_times.observe_decode(service_s, len(live),
                                                       sum(s.token_position_start for s in live))
        else:
            self._runtime.service_times.observe_prefill(service_s, sum(s.input_row_count for s in live))

    def _split_cancelled(self, work: StageWork):
        live, failures = [], []
        for item in work.sequences:
            if self._runtime.is_cancelled(item.request_id):
                failures.append(SequenceFailure(item.request_id, ErrorCode.CANCELLED, "request was cancelled"))
            else:
                live.append(item)
        return live, failures

    def _stage_batch(self, stage: LoadedStage, work: StageWork, live) -> StageBatch:
        slices = tuple(live)  # the BATCH's own FNX2 slices: the executor reads them as they came
        stacked = _input_rows(work, live)
        sampling = (
            tuple(self._runtime.sampling_for(s.request_id) for s in live)
            if stage.spec.last and not stage.spec.return_logits
            else ()
        )
        filters = _token_filters(stage, slices) if sampling else ()
        # Logits mode answers every input row, as a plain FNX2 2.0 final stage does.
        all_logits = stage.spec.last and stage.spec.return_logits
        if stage.spec.first:
            ids = np.ascontiguousarray(stacked, dtype=np.int32)
            return StageBatch(slices, token_ids=ids, sampling=sampling, token_filters=filters, all_logits=all_logits)
        tensor = work.batch.tensor
        hidden = Tensor(tensor.descriptor.with_rows(stacked.shape[0]), stacked).to_float32()
        return StageBatch(slices, hidden=hidden, sampling=sampling, token_filters=filters, all_logits=all_logits)

    def _final_output(self, stage: LoadedStage, work: StageWork, live, result: StageResult, failures) -> StageOutput:
        if stage.spec.return_logits:
            logits = np.ascontiguousarray(result.logits, dtype=np.float32)
            return StageOutput(Tensor.from_array(TensorKind.LOGITS, DType.FP32, logits), tuple(failures))
        tokens = np.ascontiguousarray(result.token_ids, dtype=np.int32)
        if stage.decoding is not None:  # grammar and penalty state advance with each accepted token
            stage.decoding.accept([s.request_id for s in live], _sample_positions(live), tokens.tolist())
        if any(self._runtime.sampling_for(s.request_id).top_logprobs is not None for s in live):
            if EXT_SAMPLE_LOGPROBS not in work.extensions:
                failed = [SequenceFailure(s.request_id, "FAILED", "logprobs need the sample_logprobs extension")
                          for s in live]
                return StageOutput(None, tuple(failures + failed))
            records = sample_records(np.asarray(result.logits, dtype=np.float32), tokens)
            tensor = Tensor.from_array(TensorKind.LOGITS, DType.FP32, records)
            return StageOutput(tensor, tuple(failures), rows_per_sequence=tuple(1 for _ in live))
        tensor = Tensor.from_array(TensorKind.TOKEN_IDS, DType.INT32, tokens)
        return StageOutput(tensor, tuple(failures), rows_per_sequence=tuple(1 for _ in live))

    async def _forward(self, stage: LoadedStage, work: StageWork, live, result: StageResult,
                       failures) -> tuple[StageOutput, float]:
        """The output, and the seconds spent packing the outgoing boundary tensor."""
        label = stage_id(stage.spec.stage_index)
        dtype = DType(stage.spec.boundary_dtype)
        with _TRACER.start_as_current_span("pack"):
            mark = self._runtime.service_clock.mark()
            payload = boundary_payload(result.hidden, dtype)
            outgoing = _next_batch(work.batch, live, stage, Tensor.from_array(TensorKind.ACTIVATION, dtype, payload))
            pack_s = self._runtime.service_clock.since(mark)
            self._runtime.phase_totals.observe(Phase.PACK, pack_s, label)
        metrics.BOUNDARY_BYTES.labels(label).inc(payload.nbytes)
        client = await self.next_hop(stage)
        with _TRACER.start_as_current_span(f"transfer to {stage_id(stage.spec.stage_index + 1)}"):
            outgoing = replace(outgoing, traceparent=current_traceparent())
            started = time.perf_counter()
            occupancy = self._runtime.phase_totals.occupancy
            occupancy.begin_handoff()  # this batch now waits on the next hop, not on this stage
            occupancy.end_work()
            try:
                reply = await client.submit(outgoing)
            finally:
                occupancy.begin_work()
                occupancy.end_handoff()
            round_trip = time.perf_counter() - started
        downstream_ns = max((r.timings.queue_ns + r.timings.execute_ns for r in reply.results), default=0)
        self._runtime.phase_totals.observe(Phase.TRANSFER, max(0.0, round_trip - downstream_ns / 1e9), label)
        by_id = {r.request_id: r for r in reply.results}
        parts, counts = [], []
        for item in live:
            downstream = by_id.get(item.request_id)
            if downstream is None or downstream.status is not SequenceStatus.OK:
                code = (downstream.error_code if downstream else None) or ErrorCode.FAILED
                message = downstream.error_message if downstream else "next stage did not answer this sequence"
                failures.append(SequenceFailure(item.request_id, code, message or code))
                continue
            parts.append(reply.rows_for(downstream))
            counts.append(downstream.output_row_count)
        if not parts or reply.tensor is None:
            return StageOutput(None, tuple(failures)), pack_s
        descriptor = reply.tensor.descriptor
        array = np.ascontiguousarray(parts[0] if len(parts) == 1 else np.concatenate(parts))
        if _is_sample_records(reply.tensor) and EXT_SAMPLE_LOGPROBS not in work.extensions:
            # The hop before this one speaks plain token ids: keep the tokens, drop the logprobs.
            array = np.ascontiguousarray(array[:, 0], dtype=np.int32)
            return StageOutput(Tensor.from_array(TensorKind.TOKEN_IDS, DType.INT32, array), tuple(failures),
                               rows_per_sequence=tuple(counts)), pack_s
        return StageOutput(
            Tensor(descriptor.with_rows(array.shape[0]), array), tuple(failures), rows_per_sequence=tuple(counts)
        ), pack_s


def _next_batch(batch: Batch, live, stage: LoadedStage, tensor: Tensor) -> Batch:
    rows, slices = 0, []
    for item in live:
        slices.append(item._replace(input_row_start=rows))
        rows += item.input_row_count
    descriptor = BatchDescriptor(
        batch.batch.batch_id, batch.batch.batch_sequence_no, batch.batch.phase, rows, tuple(slices)
    )
    return Batch(
        batch.plan_id, batch.plan_hash, stage.spec.downstream()[1], stage_id(stage.spec.stage_index),
        stage_id(stage.spec.stage_index + 1), descriptor, tensor, batch.traceparent,
    )


def _is_sample_records(tensor: Tensor) -> bool:
    d = tensor.descriptor
    return d.kind is TensorKind.LOGITS and d.dtype is DType.FP32 and d.shape[1:] == (RECORD_WIDTH,)


def _sample_positions(live) -> list[int]:
    """Position of each sequence's last row: the row its sampled token follows."""
    return [s.token_position_start + s.input_row_count - 1 for s in live]


def _token_filters(stage: LoadedStage, slices) -> tuple:
    if stage.decoding is None or not len(stage.decoding):
        return ()
    return stage.decoding.filters([s.request_id for s in slices],
                                  _sample_positions(slices))


def _input_rows(work: StageWork, live) -> np.ndarray:
    """The executed sequences' input rows: a view when they are contiguous (the usual case)."""
    first, total = live[0].input_row_start, sum(s.input_row_count for s in live)
    starts = np.cumsum([first] + [s.input_row_count for s in live[:-1]])
    if all(int(start) == s.input_row_start for start, s in zip(starts, live, strict=True)):
        return work.batch.tensor.rows(first, total)
    return np.concatenate([work.rows(s) for s in live])


def _record_phase_spans(queue_s: float, compute_s: float) -> None:
    """Queue and compute spans with their measured durations, ending now."""
    end = time.time_ns()
    compute_start = end - int(compute_s * 1e9)
    queue_start = compute_start - int(queue_s * 1e9)
    _TRACER.start_span("queue", start_time=queue_start).end(end_time=compute_start)
    _TRACER.start_span("compute", start_time=compute_start).end(end_time=end)


# Model failures that FNX2 names with the same code; any other failure is FAILED.
_SHARED_CODES = frozenset({ErrorCode.STALE_KV, ErrorCode.UNKNOWN_LEASE, ErrorCode.RELEASED, ErrorCode.SEQUENCE,
                           ErrorCode.POSITION, ErrorCode.PHASE})


def _fnx2_code(exc: ModelError) -> ErrorCode:
    if exc.reason == KvLimitExceededError.default_reason:
        return ErrorCode.ADMISSION
    return ErrorCode(exc.reason) if exc.reason in _SHARED_CODES else ErrorCode.FAILED


class _Refuse(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _Handler:
    def __init__(self, plane: DataPlane):
        self._plane = plane

    async def execute(self, work: StageWork) -> StageOutput:
        return await self._plane.execute(work)

    async def admit(self, admission: Admission) -> AckAdmit:
        return await self._plane.admit(admission)

    async def cancel(self, request_id: str, execution_lease_id: str) -> tuple[int, ...]:
        return await self._plane.cancel(request_id, execution_lease_id)

    async def release(self, request_id: str, execution_lease_id: str,
                      publish_token_ids: tuple[int, ...] = ()) -> tuple[int, ...]:
        return await self._plane.release(request_id, execution_lease_id, publish_token_ids)

    def forget(self, request_id: str, execution_lease_id: str) -> None:
        stage = self._plane._stage
        if stage is not None:
            stage.executor.release(request_id, execution_lease_id)
