"""The receiving end of FNX2 channels: one `Fnx2Receiver` per stage, many channels.

`Fnx2Receiver.serve(reader, writer)` runs one channel: hello, ACK check, credits, then
BATCH -> handler -> RESULT + CREDIT, with cancel, release, credit_refresh and shutdown.
All rule checks are in `ReceiverState`; this module only moves frames and measures time.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from libs.fnx2.codec import DEFAULT_LIMITS, CodecLimits, ExpectedBinding
from libs.fnx2.control import (
    ABI_VERSION, EXT_COMPACT_OUTPUT, EXT_MULTI_INFLIGHT, EXT_TIMINGS, KNOWN_EXTENSIONS, Ack, AckHello, AckStage,
    Cancel, ChannelBinding, Control, Credit, ErrorMessage, Release,
)
from libs.fnx2.errors import ChannelClosedError, ErrorCode, Fnx2Error
from libs.fnx2.messages import Batch, Result, SequenceResult, SequenceSlice, Timings
from libs.fnx2.receiver_state import Admission, Entry, Outcome, ReceiverLimits, ReceiverState
from libs.fnx2.stream import FrameStream, Received
from libs.fnx2.tensor import DType, Tensor, TensorDescriptor, TensorKind
from libs.fnx2.transport import BufferPool, FrameProtocol


@dataclass(frozen=True, slots=True)
class StageWork:
    """A validated BATCH as the backend sees it: only the sequences to execute."""

    batch: Batch
    sequences: tuple[SequenceSlice, ...]
    traceparent: str | None
    # Extensions negotiated on the channel this batch arrived on.
    extensions: frozenset[str] = frozenset()

    @property
    def inputs(self) -> np.ndarray:
        """The whole input tensor (storage dtype; bf16 as uint16 bits), read-only."""
        return self.batch.tensor.array

    def rows(self, item: SequenceSlice) -> np.ndarray:
        return self.batch.tensor.rows(item.input_row_start, item.input_row_count)


@dataclass(frozen=True, slots=True)
class SequenceFailure:
    request_id: str
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class StageOutput:
    """Output rows of the executed sequences that did not fail, in `StageWork` order."""

    tensor: Tensor | None
    failures: tuple[SequenceFailure, ...] = ()
    # Output rows per ok sequence, in order; None = as many as it sent. Fewer rows need the
    # compact_output extension on the channel.
    rows_per_sequence: tuple[int, ...] | None = None


class StageHandler(Protocol):
    async def execute(self, work: StageWork) -> StageOutput: ...

    def forget(self, request_id: str, execution_lease_id: str) -> None:
        """Drop this request's KV: it was released or expired."""


@dataclass(frozen=True)
class ReceiverConfig:
    binding: ChannelBinding
    limits: ReceiverLimits = field(default_factory=ReceiverLimits)
    codec: CodecLimits = DEFAULT_LIMITS
    source_stage: str | None = None
    input_kind: TensorKind | None = None
    input_dtype: DType | None = None
    input_width: int | None = None
    extensions: frozenset[str] = KNOWN_EXTENSIONS
    plain_frames: int = 1

    def expected(self) -> ExpectedBinding:
        return ExpectedBinding(self.binding, self.source_stage, self.input_kind,
                               self.input_dtype, self.input_width)


class Fnx2Receiver:
    def __init__(self, config: ReceiverConfig, handler: StageHandler,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.config, self.handler, self.clock = config, handler, clock
        self.state = ReceiverState(config.binding, config.limits)

        self._connections: set[asyncio.Task] = set()
        self._pool = BufferPool()  # shared by all channels: memory stays mapped and warm

    async def serve(self, reader, writer) -> None:
        """Run one channel over (StreamReader, StreamWriter) or (FrameProtocol, FrameProtocol)."""
        channel = _Channel(self, FrameStream(reader, writer, self.config.codec,
                                             allow_extensions=bool(self.config.extensions)))
        try:
            await channel.run()
        except ChannelClosedError:
            pass
        finally:
            await channel.stop()

    def protocol(self) -> FrameProtocol:
        """Protocol factory for `loop.create_server(receiver.protocol, host, port, ssl=...)`:
        the fast path (pooled receive buffers, CRC32C computed as data arrives)."""
        return FrameProtocol(self.config.codec, self.accept, self._pool)

    def accept(self, protocol: FrameProtocol) -> None:
        task = asyncio.get_running_loop().create_task(self.serve(protocol, protocol))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    def forget(self, freed: list[tuple[str, str]]) -> None:
        for request_id, lease_id in freed:
            self.handler.forget(request_id, lease_id)


async def serve_channel(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        receiver: Fnx2Receiver) -> None:
    await receiver.serve(reader, writer)


async def start_server(receiver: Fnx2Receiver, host: str = "127.0.0.1", port: int = 0,
                       ssl=None) -> asyncio.AbstractServer:
    """Listen for FNX2 channels; frames are received straight into per-frame buffers."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(receiver.protocol, host, port, ssl=ssl)


class _Channel:
    def __init__(self, receiver: Fnx2Receiver, stream: FrameStream) -> None:
        self.r, self.stream = receiver, stream
        self.extensions: frozenset[str] = frozenset()
        self.tasks: set[asyncio.Task] = set()
        self.busy = 0
        self.batches_received = 0

    @property
    def frame_cap(self) -> int:
        if EXT_MULTI_INFLIGHT in self.extensions:
            return self.r.config.limits.frames
        return self.r.config.plain_frames

    def credit(self) -> Credit:
        credit = self.r.state.credit()
        frames = max(0, min(credit.frames, self.frame_cap - self.busy))
        received = self.batches_received if EXT_MULTI_INFLIGHT in self.extensions else None
        return replace(credit, frames=frames, batches_received=received)

    async def run(self) -> None:
        binding = self.r.config.binding
        hello_id = str(uuid.uuid4())
        await self.stream.send(Control("hello", hello_id, binding, (ABI_VERSION,)))
        got = await self._read()
        if got is None:
            return
        ack = got.frame.message if got.frame else None
        if not (isinstance(ack, Ack) and ack.operation == "hello" and ack.control_id == hello_id
                and isinstance(ack.fields, AckHello) and ack.fields.binding == binding):
            code = got.error.code if got.error else ErrorCode.STALE_PLAN
            await self._try_send(ErrorMessage(code.value, "expected the hello ACK echoing the "
                                              "binding", hello_id))
            return
        await self.stream.send(self.credit())
        while True:
            got = await self._read()
            if got is None:
                return
            if not await self._dispatch(got):
                return

    async def _read(self) -> Received | None:
        try:
            return await self.stream.read(self.r.config.expected())
        except ChannelClosedError:
            return None
        except Fnx2Error as exc:  # terminal: one ERROR, then close
            await self._try_send(ErrorMessage(exc.code.value, exc.message, None))
            return None

    async def _dispatch(self, got: Received) -> bool:
        if got.error is not None:
            await self.stream.send(ErrorMessage(got.error.code.value, got.error.message, None))
            return True
        message = got.frame.message
        if isinstance(message, Batch):
            await self._on_batch(message, got)
        elif isinstance(message, (Cancel, Release)):
            await self._on_lease_control(message)
        elif isinstance(message, Control):
            return await self._on_control(message)
        else:
            await self.stream.send(ErrorMessage(ErrorCode.METADATA.value,
                                                "unexpected message kind for a receiver", None))
        return True

    async def _on_batch(self, batch: Batch, got: Received) -> None:
        self.batches_received += 1
        if self.busy >= self.frame_cap:
            await self._reject_batch(batch, Fnx2Error(ErrorCode.CREDIT, "no frame credit"))
            return
        try:
            admission = self.r.state.admit(batch, self.r.clock())
        except Fnx2Error as exc:
            await self._reject_batch(batch, exc)
            return
        self.busy += 1
        if EXT_MULTI_INFLIGHT in self.extensions:
            task = asyncio.create_task(self._execute(admission, got))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        else:
            await self._execute(admission, got)

    async def _reject_batch(self, batch: Batch, exc: Fnx2Error) -> None:
        await self.stream.send(ErrorMessage(exc.code.value, exc.message, batch.batch.batch_id),
                               self.credit())

    async def _execute(self, admission: Admission, got: Received) -> None:
        started = time.monotonic_ns()  # durations only; deadlines use the injected clock
        outcomes = await self._run_handler(admission)
        executed = time.monotonic_ns()
        real = EXT_TIMINGS in self.extensions
        timings = Timings(max(0, started - got.received_ns), max(1, executed - started), 0,
                          got.unpack_ns) if real else Timings()
        entries = self.r.state.complete(admission, outcomes, timings)
        result = _assemble(admission, entries, time.monotonic_ns, timings)
        self.busy -= 1
        await self._try_send(result, self.credit())

    async def _run_handler(self, admission: Admission) -> dict[tuple[str, str], Outcome]:
        if not admission.execute:
            return {}
        work = StageWork(admission.batch, admission.execute, admission.batch.traceparent,
                         self.extensions)
        try:
            output = await self.r.handler.execute(work)
        except Exception as exc:  # a backend failure fails its sequences, not the channel
            message = f"{type(exc).__name__}: {exc}"
            return {s.identity: Outcome(False, None, "FAILED", message) for s in work.sequences}
        return _outcomes(work, output, EXT_COMPACT_OUTPUT in self.extensions)

    async def _on_lease_control(self, message: Cancel | Release) -> None:
        if message.binding != self.r.config.binding:
            await self.stream.send(ErrorMessage(ErrorCode.STALE_PLAN.value,
                                                "control binding differs", message.control_id))
            return
        if isinstance(message, Cancel):
            fields = self.r.state.cancel(message.request_id, message.execution_lease_id)
            await self.stream.send(Ack("cancel", message.control_id, fields))
            return
        try:
            fields = self.r.state.release(message.request_id, message.execution_lease_id,
                                          message.expected_final_epoch)
        except Fnx2Error as exc:
            await self.stream.send(ErrorMessage(exc.code.value, exc.message, message.control_id))
            return
        if fields.released:
            self.r.forget([(message.request_id, message.execution_lease_id)])
        await self.stream.send(Ack("release", message.control_id, fields), self.credit())

    async def _on_control(self, message: Control) -> bool:
        stage = self.r.config.binding.stage_id
        if message.binding != self.r.config.binding:
            await self.stream.send(ErrorMessage(ErrorCode.STALE_PLAN.value,
                                                "control binding differs", message.control_id))
            return True
        if message.control == "extensions":
            self.extensions = frozenset(message.extensions) & self.r.config.extensions
            accepted = tuple(sorted(self.extensions))
            await self.stream.send(Ack("extensions", message.control_id, AckStage(stage, accepted)),
                                   self.credit())
        elif message.control == "credit_refresh":
            self.r.forget(self.r.state.sweep(self.r.clock()))
            await self.stream.send(Ack("credit_refresh", message.control_id, AckStage(stage)),
                                   self.credit())
        elif message.control == "shutdown":
            await self._drain_tasks()
            await self.stream.send(Ack("shutdown", message.control_id, AckStage(stage)))
            return False
        else:
            await self.stream.send(ErrorMessage(ErrorCode.METADATA.value,
                                                "a receiver does not take hello", message.control_id))
        return True

    async def _drain_tasks(self) -> None:
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _try_send(self, *messages) -> None:
        try:
            await self.stream.send(*messages)
        except (ChannelClosedError, ConnectionError, OSError):
            pass

    async def stop(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await self._drain_tasks()
        await self.stream.close()


def _outcomes(work: StageWork, output: StageOutput,
              compact_output: bool = False) -> dict[tuple[str, str], Outcome]:
    failed = {f.request_id: f for f in output.failures}
    outcomes: dict[tuple[str, str], Outcome] = {}
    counts = iter(output.rows_per_sequence or ())
    cursor = 0
    rows_available = 0 if output.tensor is None else output.tensor.descriptor.rows
    kind = None if output.tensor is None else (output.tensor.descriptor.kind,
                                               output.tensor.descriptor.dtype)
    for item in work.sequences:
        failure = failed.get(item.request_id)
        if failure is not None:
            outcomes[item.identity] = Outcome(False, None, failure.code, failure.message)
            continue
        rows = item.input_row_count if output.rows_per_sequence is None else next(counts, 0)
        if rows != item.input_row_count and not compact_output:
            outcomes[item.identity] = Outcome(False, None, "FAILED",
                                              "compact output needs the compact_output extension")
            continue
        if rows < 1 or cursor + rows > rows_available:
            outcomes[item.identity] = Outcome(False, None, "FAILED", "backend returned too few rows")
            continue
        outcomes[item.identity] = Outcome(True, output.tensor.rows(cursor, rows), kind=kind)
        cursor += rows
    return outcomes


def _assemble(admission: Admission, entries: list[Entry], clock: Callable[[], int],
              timings: Timings) -> Result:
    """Compact ok rows in request-identity order; replayed results are remapped to this batch."""
    started = clock()
    parts = [entry.rows for entry in entries if entry.rows is not None]
    tensor = None
    if parts:
        kind = next(entry.kind for entry in entries if entry.rows is not None)
        array = parts[0] if len(parts) == 1 else np.concatenate(parts)
        tensor = Tensor(TensorDescriptor(kind[0], kind[1], tuple(array.shape)), array)
    if timings.execute_ns:
        timings = Timings(timings.queue_ns, timings.execute_ns, clock() - started,
                          timings.unpack_ns)
    slices = {s.identity: s for s in admission.batch.batch.sequences}
    results: list[SequenceResult] = []
    cursor = 0
    for entry in entries:
        result = entry.result
        output_start = None
        if entry.rows is not None:
            output_start = cursor
            cursor += result.output_row_count
        results.append(result.remapped(slices[result.identity].input_row_start, output_start,
                                       timings))
    return Result(admission.batch.batch.batch_id, admission.batch.batch.batch_sequence_no,
                  admission.batch.manifest_hash, tuple(results), tensor)
