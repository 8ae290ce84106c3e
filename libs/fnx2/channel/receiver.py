"""The receiving end of FNX2 channels: one `Fnx2Receiver` per stage, many channels.

`Fnx2Receiver.serve(reader, writer)` runs one channel: hello, ACK check, credits, then
BATCH -> handler -> RESULT + CREDIT, with cancel, release, credit_refresh and shutdown.
Every rule check is the stage's `SessionRules` (`libs.fnx2.channel.session`), handed in by
the stage; this module moves frames, measures time, applies the listener limits
(`libs.fnx2.channel.listener`) and expires leases at their deadline.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import structlog

from libs.fnx2.channel.eager import start_eagerly
from libs.fnx2.channel.listener import ListenerLimits, PeerPolicy, server_options
from libs.fnx2.channel.session import BatchAdmission, Outcome, SessionRules
from libs.fnx2.channel.stage_io import (
    LeaseHandler,
    SequenceFailure,
    StageHandler,
    StageOutput,
    StageWork,
    assemble,
    outcomes,
)
from libs.fnx2.channel.stream import FrameStream, Received
from libs.fnx2.channel.transport import BufferPool, FrameProtocol
from libs.fnx2.wire.admission import EXT_INBAND_ADMISSION, AckAdmit
from libs.fnx2.wire.codec import DEFAULT_LIMITS, CodecLimits, ExpectedBinding
from libs.fnx2.wire.control import (
    ABI_VERSION,
    EXT_COMPACT_OUTPUT,
    EXT_LEASE_SEQUENCE,
    EXT_MULTI_INFLIGHT,
    EXT_TIMINGS,
    KNOWN_EXTENSIONS,
    Ack,
    AckHello,
    AckStage,
    Cancel,
    ChannelBinding,
    Control,
    Credit,
    ErrorMessage,
    Release,
)
from libs.fnx2.wire.errors import ChannelClosedError, ErrorCode, Fnx2Error
from libs.fnx2.wire.messages import Batch, Timings
from libs.fnx2.wire.tensor import DType, TensorKind

__all__ = ["Fnx2Receiver", "ReceiverConfig", "SequenceFailure", "StageHandler", "StageOutput",
           "StageWork", "serve_channel", "start_server"]

log = structlog.get_logger()


@dataclass(frozen=True)
class ReceiverConfig:
    binding: ChannelBinding
    codec: CodecLimits = DEFAULT_LIMITS
    source_stage: str | None = None
    input_kind: TensorKind | None = None
    input_dtype: DType | None = None
    input_width: int | None = None
    extensions: frozenset[str] = KNOWN_EXTENSIONS
    plain_frames: int = 1
    listener: ListenerLimits = field(default_factory=ListenerLimits)
    peer_policy: PeerPolicy | None = None

    def expected(self) -> ExpectedBinding:
        return ExpectedBinding(self.binding, self.source_stage, self.input_kind,
                               self.input_dtype, self.input_width)


class Fnx2Receiver:
    """`state`: the stage's session rules, shared by all channels of the stage (the stage
    worker's `ReceiverState`)."""

    def __init__(self, config: ReceiverConfig, handler: StageHandler, state: SessionRules,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.config, self.handler, self.clock = config, handler, clock
        self.state = state
        self.connections = 0  # admitted channels on the fast path, for the per-listener cap
        self.unexpected_errors = 0  # receiver defects; each also ends its channel (INTERNAL)
        self._channels: set[asyncio.Task] = set()
        self._serving = 0  # channels running, on either path
        self._sweeper: asyncio.Task | None = None
        self._pool = BufferPool()  # shared by all channels: memory stays mapped and warm

    @property
    def largest_body_bytes(self) -> int:
        """The largest receive buffer taken for one frame body so far."""
        return self._pool.largest_take_bytes

    async def serve(self, reader, writer) -> None:
        """Run one channel over (StreamReader, StreamWriter) or (FrameProtocol, FrameProtocol)."""
        stream = FrameStream(reader, writer, self.config.codec,
                             allow_extensions=bool(self.config.extensions))
        stream.admit_body_bytes(self.config.listener.unbound_body_bytes)
        channel = _Channel(self, stream)
        try:  # admission comes first: nothing, not even the hello, before it
            self._admit(writer.transport)
        except Fnx2Error as exc:
            await channel.try_send(ErrorMessage(exc.code.value, exc.message, None))
            await channel.stop()
            return
        self._serving += 1
        self._ensure_sweeper()
        try:
            await channel.run()
        except ChannelClosedError:
            pass
        except Fnx2Error as exc:
            await channel.try_send(ErrorMessage(exc.code.value, exc.message, None))
        except Exception as exc:  # a defect: one ERROR and a log line, never a lost task
            self.unexpected_errors += 1
            log.exception("fnx2_receiver_defect", stage=self.config.binding.stage_id)
            await channel.try_send(ErrorMessage(ErrorCode.INTERNAL.value,
                                                f"receiver defect: {type(exc).__name__}", None))
        finally:
            self._serving -= 1
            await channel.stop()

    def protocol(self) -> FrameProtocol:
        """Protocol factory for `loop.create_server(receiver.protocol, host, port, ssl=...)`:
        the fast path (pooled receive buffers, CRC32C computed as data arrives)."""
        return FrameProtocol(self.config.codec, self.accept, self._pool,
                             max_body_bytes=self.config.listener.unbound_body_bytes)

    def _admit(self, transport) -> None:
        """The connection cap, then the peer policy; raises the refusal."""
        if self._serving >= self.config.listener.max_connections:
            raise Fnx2Error(ErrorCode.CONNECTION_LIMIT, "the listener holds its maximum of channels")
        if self.config.peer_policy is not None:
            self.config.peer_policy.admit(transport)

    def accept(self, protocol: FrameProtocol) -> None:
        """A connection on the fast path (after its TLS handshake, if any); `serve` admits
        it before anything is sent."""
        self.connections += 1
        protocol.closed.add_done_callback(self._closed)
        task = asyncio.get_running_loop().create_task(self.serve(protocol, protocol))
        self._channels.add(task)
        task.add_done_callback(self._channels.discard)

    def _closed(self, _future: asyncio.Future) -> None:
        self.connections -= 1
        if self.connections == 0:
            self._pool.trim()  # no channel left: return idle receive buffers

    def forget(self, freed: list[tuple[str, str]]) -> None:
        for request_id, lease_id in freed:
            self.handler.forget(request_id, lease_id)

    def sweep(self) -> None:
        """Expire leases past their deadline and drop the KV they hold."""
        self.forget(self.state.sweep(self.clock()))

    def _ensure_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_loop())

    async def _sweep_loop(self) -> None:
        """Runs while a channel is open or a lease lives, so a lease whose sender vanished
        still expires at its deadline."""
        while self._serving or self.state.live_requests:
            await asyncio.sleep(self.config.listener.sweep_interval_s)
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - a backend's forget failing must not stop expiry
                log.exception("fnx2_sweep_failed", stage=self.config.binding.stage_id)

    async def close(self) -> None:
        """End every channel and the sweeper (the listener itself is the caller's)."""
        tasks = list(self._channels) + ([self._sweeper] if self._sweeper else [])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def serve_channel(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        receiver: Fnx2Receiver) -> None:
    await receiver.serve(reader, writer)


async def start_server(receiver: Fnx2Receiver, host: str = "127.0.0.1", port: int = 0,
                       ssl=None) -> asyncio.Server:
    """Listen for FNX2 channels; frames are received straight into per-frame buffers.
    TLS comes from `ssl` or the receiver's peer policy, with the handshake timeout."""
    loop = asyncio.get_running_loop()
    options = server_options(receiver.config.listener, receiver.config.peer_policy, ssl)
    return await loop.create_server(receiver.protocol, host, port, **options)


class _Channel:
    def __init__(self, receiver: Fnx2Receiver, stream: FrameStream) -> None:
        self.r, self.stream = receiver, stream
        self.expected = receiver.config.expected()  # what each BATCH is checked against
        self.extensions: frozenset[str] = frozenset()
        self.tasks: set[asyncio.Task] = set()
        self.busy = 0
        self.batches_received = 0
        self.granted_payload_bytes = 0
        self.bound = False  # the first credit lifts the unbound preamble's body limit

    @property
    def frame_cap(self) -> int:
        if EXT_MULTI_INFLIGHT in self.extensions:
            return self.r.state.frame_limit
        return self.r.config.plain_frames

    def credit(self) -> Credit:
        received = self.batches_received if EXT_MULTI_INFLIGHT in self.extensions else None
        credit = self.r.state.credit(self.frame_cap - self.busy, received)
        # Bodies up to what any credit on this channel admitted: a sender may still act
        # on an earlier, larger credit.
        if credit.payload_bytes > self.granted_payload_bytes or not self.bound:
            self.bound = True
            self.granted_payload_bytes = max(self.granted_payload_bytes, credit.payload_bytes)
            self.stream.admit_body_bytes(self.r.config.codec.max_metadata_bytes
                                         + self.granted_payload_bytes)
        return credit

    async def run(self) -> None:
        binding = self.r.config.binding
        hello_id = str(uuid.uuid4())
        await self.stream.send(Control("hello", hello_id, binding, (ABI_VERSION,)))
        got = await self._read(self.r.config.listener.handshake_timeout_s,
                               ErrorCode.HANDSHAKE_TIMEOUT)
        if got is None:
            return
        ack = got.frame.message if got.frame else None
        if not (isinstance(ack, Ack) and ack.operation == "hello" and ack.control_id == hello_id
                and isinstance(ack.fields, AckHello) and ack.fields.binding == binding):
            code = got.error.code if got.error else ErrorCode.STALE_PLAN
            await self.try_send(ErrorMessage(code.value, "expected the hello ACK echoing the "
                                             "binding", hello_id))
            return
        await self.stream.send(self.credit())
        while True:
            got = await self._read(self.r.config.listener.idle_timeout_s, ErrorCode.IDLE_TIMEOUT)
            if got is None:
                return
            if not await self._dispatch(got):
                return

    async def _read(self, timeout_s: float | None, code: ErrorCode) -> Received | None:
        """The next frame; None once the channel should close (after one ERROR if terminal
        or timed out). A channel with batches executing is not idle."""
        while True:
            try:
                async with asyncio.timeout(timeout_s):
                    return await self.stream.read(self.expected)
            except TimeoutError:
                if self.busy:
                    continue
                await self.try_send(ErrorMessage(code.value, "no frame within the timeout", None))
                return None
            except ChannelClosedError:
                return None
            except Fnx2Error as exc:  # terminal: one ERROR, then close
                await self.try_send(ErrorMessage(exc.code.value, exc.message, None))
                return None

    async def _dispatch(self, got: Received) -> bool:
        if got.error is not None:
            await self.stream.send(ErrorMessage(got.error.code.value, got.error.message, None))
            return True
        assert got.frame is not None  # a read holds a frame or an error
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
            # Executed inline up to the handler's first wait: no event-loop hop between
            # receive, admission and hand-off; a handler that waits continues as a task.
            task = start_eagerly(self._execute_guarded(admission, got))
            if task is not None:
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
        else:
            await self._execute(admission, got)

    async def _reject_batch(self, batch: Batch, exc: Fnx2Error) -> None:
        await self.stream.send(ErrorMessage(exc.code.value, exc.message, batch.batch.batch_id),
                               self.credit())

    async def _execute_guarded(self, admission: BatchAdmission, got: Received) -> None:
        """A batch run as its own task: a defect ends the channel, never the task silently."""
        try:
            await self._execute(admission, got)
        except Exception as exc:
            self.r.unexpected_errors += 1
            log.exception("fnx2_receiver_defect", stage=self.r.config.binding.stage_id)
            await self.try_send(ErrorMessage(ErrorCode.INTERNAL.value,
                                             f"receiver defect: {type(exc).__name__}",
                                             admission.batch.batch.batch_id))
            await self.stream.close()

    async def _execute(self, admission: BatchAdmission, got: Received) -> None:
        started = time.monotonic_ns()  # durations only; deadlines use the injected clock
        try:
            results = await self._run_handler(admission)
        except BaseException:
            # The channel ended (its sender vanished) or the handler failed past its own
            # guard: the batch is abandoned, not executing. Its sequences fail (no KV epoch
            # advances) and give their credit back, so the sweeper expires their leases at
            # the deadline like any other; otherwise they would stay "executing" forever.
            self.r.state.complete(admission, {}, Timings())
            self.busy -= 1
            raise
        executed = time.monotonic_ns()
        real = EXT_TIMINGS in self.extensions
        timings = Timings(max(0, started - got.received_ns), max(1, executed - started), 0,
                          got.unpack_ns) if real else Timings()
        entries = self.r.state.complete(admission, results, timings)
        result = assemble(admission, entries, time.monotonic_ns, timings)
        self.busy -= 1
        await self.try_send(result, self.credit())

    async def _run_handler(self, admission: BatchAdmission) -> dict[tuple[str, str], Outcome]:
        if not admission.execute:
            return {}
        work = StageWork(admission.batch, admission.execute, admission.batch.traceparent,
                         self.extensions)
        try:
            output = await self.r.handler.execute(work)
        except Exception as exc:  # a backend failure fails its sequences, not the channel
            message = f"{type(exc).__name__}: {exc}"
            return {s.identity: Outcome(False, None, ErrorCode.FAILED, message) for s in work.sequences}
        return outcomes(work, output, EXT_COMPACT_OUTPUT in self.extensions)

    async def _admit_guarded(self, message: Control) -> None:
        """Runs the stage's in-band admission; a failure to apply or forward it answers the
        control with one ERROR (the channel stays up)."""
        assert message.admission is not None and isinstance(self.r.handler, LeaseHandler)
        try:
            ack: AckAdmit = await self.r.handler.admit(message.admission)
        except Fnx2Error as exc:
            await self.try_send(ErrorMessage(exc.code.value, exc.message, message.control_id))
            return
        except Exception as exc:  # noqa: BLE001 - the next hop lost, a defect: the admit fails
            await self.try_send(ErrorMessage(ErrorCode.FAILED.value,
                                             f"admission failed: {type(exc).__name__}",
                                             message.control_id))
            return
        await self.try_send(Ack("admit", message.control_id, ack))

    def _lease_handler(self) -> LeaseHandler | None:
        handler = self.r.handler
        if EXT_INBAND_ADMISSION in self.extensions and isinstance(handler, LeaseHandler):
            return handler
        return None

    async def _on_lease_control(self, message: Cancel | Release) -> None:
        if message.binding != self.r.config.binding:
            await self.stream.send(ErrorMessage(ErrorCode.STALE_PLAN.value,
                                                "control binding differs", message.control_id))
            return
        lease_handler = self._lease_handler()
        request_id, lease_id = message.request_id, message.execution_lease_id
        if isinstance(message, Cancel):
            cancelled = self.r.state.cancel(request_id, lease_id)
            if lease_handler is not None:
                try:
                    epochs = await lease_handler.cancel(request_id, lease_id)
                except Exception as exc:  # noqa: BLE001 - a stage down the chain was not told
                    await self.stream.send(ErrorMessage(ErrorCode.FAILED.value,
                                                        f"cancel failed: {type(exc).__name__}",
                                                        message.control_id))
                    return
                cancelled = replace(cancelled, stage_kv_epochs=epochs)
            await self.stream.send(Ack("cancel", message.control_id, cancelled))
            return
        try:
            fields = self.r.state.release(request_id, lease_id, message.expected_final_epoch,
                                          self.r.clock())
            if lease_handler is not None:  # the stage frees its KV and tells the next hop
                epochs = await lease_handler.release(request_id, lease_id, message.publish_token_ids)
                fields = replace(fields, stage_kv_epochs=epochs)
            elif fields.released:
                self.r.forget([(request_id, lease_id)])
        except Fnx2Error as exc:
            await self.stream.send(ErrorMessage(exc.code.value, exc.message, message.control_id))
            return
        except Exception as exc:  # noqa: BLE001 - a stage down the chain was not told
            await self.stream.send(ErrorMessage(ErrorCode.FAILED.value,
                                                f"release failed: {type(exc).__name__}",
                                                message.control_id))
            return
        await self.stream.send(Ack("release", message.control_id, fields), self.credit())

    async def _on_control(self, message: Control) -> bool:
        stage = self.r.config.binding.stage_id
        if message.binding != self.r.config.binding:
            await self.stream.send(ErrorMessage(ErrorCode.STALE_PLAN.value,
                                                "control binding differs", message.control_id))
            return True
        if message.control == "extensions":
            offered = frozenset(message.extensions) & self.r.config.extensions
            if not isinstance(self.r.handler, LeaseHandler):  # nothing to open leases on
                offered -= {EXT_INBAND_ADMISSION}
            self.extensions = offered
            self.stream.negotiated = self.extensions
            accepted = tuple(sorted(self.extensions))
            next_number = (self.r.state.lease_sequence_next
                           if EXT_LEASE_SEQUENCE in self.extensions else None)
            await self.stream.send(Ack("extensions", message.control_id,
                                       AckStage(stage, accepted, next_number)), self.credit())
        elif message.control == "admit" and EXT_INBAND_ADMISSION in self.extensions:
            # Its own task: the forward down the chain must not hold up this channel's frames.
            task = asyncio.get_running_loop().create_task(self._admit_guarded(message))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        elif message.control == "credit_refresh":
            self.r.sweep()
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

    async def try_send(self, *messages) -> None:
        try:
            await self.stream.send(*messages)
        except (ChannelClosedError, ConnectionError, OSError):
            pass

    async def stop(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await self._drain_tasks()
        await self.stream.close()
