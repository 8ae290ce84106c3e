"""The sending end of an FNX2 channel (`Fnx2Client`), used by the orchestrator and stages.

The client answers the receiver's hello, offers the extensions it knows (a plain 2.0
receiver answers with a recoverable ERROR and the channel stays plain), then sends
BATCH frames within the last advertised credit, keeping each source batch until its
RESULT arrives or its request is released.
"""

from __future__ import annotations

import asyncio
import collections
import ssl as ssl_module
import time
import uuid
from dataclasses import dataclass, replace
from typing import TypeVar

from prometheus_client import Counter

from libs.fnx2.channel.stream import FrameStream
from libs.fnx2.channel.transport import FrameProtocol
from libs.fnx2.wire.admission import EXT_INBAND_ADMISSION, AckAdmit, Admission
from libs.fnx2.wire.codec import DEFAULT_LIMITS, CodecLimits
from libs.fnx2.wire.control import (
    EXT_COMPACT_OUTPUT,
    EXT_LEASE_SEQUENCE,
    EXT_MULTI_INFLIGHT,
    EXT_TRACEPARENT,
    KNOWN_EXTENSIONS,
    Ack,
    AckCancel,
    AckHello,
    AckRelease,
    AckStage,
    Cancel,
    ChannelBinding,
    Control,
    Credit,
    ErrorMessage,
    Release,
)
from libs.fnx2.wire.errors import ChannelClosedError, ErrorCode, Fnx2Error, RemoteError
from libs.fnx2.wire.messages import Batch, Result

# A sender that had to wait for the receiver's credit before it could send a batch.
CREDIT_EXHAUSTED = Counter(
    "fornax_fnx2_credit_exhausted_total", "Batches that waited for receiver credit", ["stage"]
)

@dataclass(frozen=True)
class SenderConfig:
    binding: ChannelBinding
    codec: CodecLimits = DEFAULT_LIMITS
    offer_extensions: frozenset[str] = KNOWN_EXTENSIONS
    # A credit_refresh after this long without sending, so a receiver's idle timeout
    # (ListenerLimits.idle_timeout_s, 900 s by default) never closes a live channel.
    keepalive_s: float | None = 60.0


@dataclass
class _Pending:
    batch: Batch
    future: asyncio.Future
    need: tuple[int, int, int, int]


class Fnx2Client:
    def __init__(self, stream: FrameStream, config: SenderConfig) -> None:
        self._stream, self.config = stream, config
        self.extensions: frozenset[str] = frozenset()
        # With lease_sequence: the receiver's lowest lease number above all it has seen in
        # this generation (from its ACK); a gateway numbers new leases from here or above.
        self.lease_sequence_next: int | None = None
        self.credit: Credit | None = None
        self._pending: collections.OrderedDict[str, _Pending] = collections.OrderedDict()
        self._controls: dict[str, asyncio.Future] = {}
        self._credit_changed = asyncio.Condition()
        self._credit_waiters = 0  # submits waiting in `_credit_changed.wait_for`
        self._sent: tuple[int, ...] = (0, 0, 0, 0)
        self._in_transit: collections.deque[tuple[int, tuple[int, int, int, int]]] = collections.deque()
        self._batches_sent = 0
        self._pump: asyncio.Task | None = None
        self._keepalive: asyncio.Task | None = None
        self._last_sent = time.monotonic()
        self._failure: Fnx2Error | None = None
        self._unsettled: list[tuple[asyncio.Future, object]] = []

    # -- opening ------------------------------------------------------------------------
    @classmethod
    async def connect(cls, host: str, port: int, config: SenderConfig,
                      ssl: ssl_module.SSLContext | None = None,
                      server_hostname: str | None = None) -> Fnx2Client:
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_connection(
            lambda: FrameProtocol(config.codec), host, port, ssl=ssl,
            server_hostname=server_hostname)
        return await cls.open(protocol, protocol, config)

    @classmethod
    async def open(cls, reader, writer, config: SenderConfig) -> Fnx2Client:
        """Handshake over (StreamReader, StreamWriter) or (FrameProtocol, FrameProtocol)."""
        stream = FrameStream(reader, writer, config.codec,
                             allow_extensions=bool(config.offer_extensions))
        client = cls(stream, config)
        try:
            await client._handshake()
        except BaseException:
            await stream.close()
            raise
        return client

    async def _handshake(self) -> None:
        hello = await self._expect(Control)
        if hello.control != "hello" or (2, 0) not in hello.supported_versions:
            raise Fnx2Error(ErrorCode.ABI_VERSION, "receiver did not offer FNX2 2.0")
        if hello.binding != self.config.binding:
            raise Fnx2Error(ErrorCode.STALE_PLAN, "receiver is bound to another plan or stage")
        await self._stream.send(Ack("hello", hello.control_id, AckHello(hello.binding)))
        self.credit = await self._expect(Credit)
        if self.config.offer_extensions:
            offer_id = str(uuid.uuid4())
            await self._stream.send(Control("extensions", offer_id, self.config.binding,
                                            extensions=tuple(sorted(self.config.offer_extensions))))
            answer = await self._expect((Ack, ErrorMessage))
            if isinstance(answer, Ack) and answer.control_id == offer_id and isinstance(answer.fields, AckStage):
                self.extensions = frozenset(answer.fields.extensions or ()) & self.config.offer_extensions
                self._stream.negotiated = self.extensions
                if EXT_LEASE_SEQUENCE in self.extensions:
                    self.lease_sequence_next = answer.fields.lease_sequence_next
                self.credit = await self._expect(Credit)
        self._pump = asyncio.create_task(self._read_loop())
        if self.config.keepalive_s:
            self._keepalive = asyncio.create_task(self._keep_alive(self.config.keepalive_s))

    async def _keep_alive(self, interval_s: float) -> None:
        while self._failure is None and not self._stream.closed:
            await asyncio.sleep(max(0.0, self._last_sent + interval_s - time.monotonic()))
            if time.monotonic() - self._last_sent < interval_s:
                continue
            try:
                await self.credit_refresh()
            except Fnx2Error:
                return  # the channel failed; callers see it on their next call

    async def _expect(self, kinds):
        got = await self._stream.read()
        message = got.frame.message if got.frame else None
        if isinstance(message, ErrorMessage) and not (isinstance(kinds, tuple) and ErrorMessage in kinds):
            raise RemoteError(_code(message.code), message.message)
        if got.error is not None or not isinstance(message, kinds):
            raise Fnx2Error(ErrorCode.METADATA, "unexpected frame during the handshake")
        return message

    # -- data ---------------------------------------------------------------------------
    async def submit(self, batch: Batch) -> Result:
        """Send one BATCH and wait for its RESULT (validated against the batch)."""
        if EXT_TRACEPARENT not in self.extensions and batch.traceparent is not None:
            batch = replace(batch, traceparent=None)
        if EXT_LEASE_SEQUENCE not in self.extensions:
            batch = _without_lease_sequences(batch)
        need = (1, batch.tensor.descriptor.payload_bytes, batch.batch.input_row_count,
                len(batch.batch.sequences))
        future = asyncio.get_running_loop().create_future()
        if self._credit_changed.locked() or not self._fits(need):
            async with self._credit_changed:
                if not self._fits(need):
                    CREDIT_EXHAUSTED.labels(self.config.binding.stage_id).inc()
                    self._credit_waiters += 1
                    try:
                        await self._credit_changed.wait_for(lambda: self._fits(need))
                    finally:
                        self._credit_waiters -= 1
                self._hold(batch, future, need)
        else:  # it fits now, and nothing awaits between this check and the reservation
            self._hold(batch, future, need)
        self._last_sent = time.monotonic()
        try:
            await self._stream.send(batch)
        except Fnx2Error:
            self._pending.pop(batch.batch.batch_id, None)
            raise
        return await future

    def _hold(self, batch: Batch, future: asyncio.Future, need: tuple[int, int, int, int]) -> None:
        """Count the batch against the credit and keep it until it is answered."""
        self._raise_if_failed()
        if batch.batch.batch_id in self._pending:
            raise Fnx2Error(ErrorCode.BATCH_CONTRACT, "batch_id is already in flight")
        self._pending[batch.batch.batch_id] = _Pending(batch, future, need)
        sent = self._sent
        self._sent = (sent[0] + need[0], sent[1] + need[1], sent[2] + need[2], sent[3] + need[3])
        self._in_transit.append((self._batches_sent, need))
        self._batches_sent += 1

    def _fits(self, need: tuple[int, int, int, int]) -> bool:
        if self._failure is not None or self.credit is None:
            return True
        c = self.credit
        if EXT_MULTI_INFLIGHT not in self.extensions and self._pending:
            return False
        s = self._sent
        return (s[0] + need[0] <= c.frames and s[1] + need[1] <= c.payload_bytes
                and s[2] + need[2] <= c.rows and s[3] + need[3] <= c.sequences)

    def _uncounted(self, credit: Credit) -> tuple[int, int, int, int]:
        """Resources of sent batches that this credit vector does not yet account for:
        with multi_inflight, those the receiver had not read yet; otherwise (plain 2.0)
        every unanswered batch, conservatively."""
        if credit.batches_received is not None:
            while self._in_transit and self._in_transit[0][0] < credit.batches_received:
                self._in_transit.popleft()
            needs = [need for _, need in self._in_transit]
        else:
            self._in_transit.clear()
            needs = [p.need for p in self._pending.values()]
        return tuple(sum(col) for col in zip(*needs, strict=True)) if needs else (0, 0, 0, 0)

    def unacknowledged(self) -> tuple[Batch, ...]:
        """Source batches still held: sent, with no RESULT yet."""
        return tuple(p.batch for p in self._pending.values())

    # -- control ------------------------------------------------------------------------
    async def cancel(self, request_id: str, execution_lease_id: str) -> AckCancel:
        control_id = str(uuid.uuid4())
        ack = await self._control(control_id, Cancel(control_id, self.config.binding, request_id,
                                                     execution_lease_id))
        return _ack_fields(ack, AckCancel)

    async def release(self, request_id: str, execution_lease_id: str,
                      expected_final_epoch: int | None = None,
                      publish_token_ids: tuple[int, ...] = ()) -> AckRelease:
        if publish_token_ids and EXT_INBAND_ADMISSION not in self.extensions:
            raise Fnx2Error(ErrorCode.METADATA, f"publish_token_ids need the {EXT_INBAND_ADMISSION} extension")
        control_id = str(uuid.uuid4())
        ack = await self._control(control_id, Release(control_id, self.config.binding, request_id,
                                                      execution_lease_id, expected_final_epoch,
                                                      tuple(publish_token_ids)))
        return _ack_fields(ack, AckRelease)

    async def admit(self, admission: Admission) -> AckAdmit:
        """Open a lease on the receiving stage and every stage after it (inband_admission)."""
        if EXT_INBAND_ADMISSION not in self.extensions:
            raise Fnx2Error(ErrorCode.METADATA, f"the receiver did not accept {EXT_INBAND_ADMISSION}")
        control_id = str(uuid.uuid4())
        ack = await self._control(control_id, Control("admit", control_id, self.config.binding,
                                                      admission=admission))
        return _ack_fields(ack, AckAdmit)

    async def credit_refresh(self) -> None:
        control_id = str(uuid.uuid4())
        await self._control(control_id, Control("credit_refresh", control_id, self.config.binding))

    async def shutdown(self) -> None:
        control_id = str(uuid.uuid4())
        await self._control(control_id, Control("shutdown", control_id, self.config.binding))
        await self.close()

    async def _control(self, control_id: str, message) -> Ack:
        self._raise_if_failed()
        future = asyncio.get_running_loop().create_future()
        self._controls[control_id] = future
        self._last_sent = time.monotonic()
        await self._stream.send(message)
        return await future

    # -- inbound ------------------------------------------------------------------------
    async def _read_loop(self) -> None:
        try:
            while True:
                got = await self._stream.read()
                if got.error is not None:
                    await self._unreserve(self._fail_oldest(got.error))
                    continue
                assert got.frame is not None  # a read holds a frame or an error
                await self._on_message(got.frame.message)
        except Fnx2Error as exc:
            await self._fail_all(exc)
        except Exception as exc:  # never leave callers waiting on a dead channel
            await self._fail_all(ChannelClosedError(f"reader failed: {exc!r}"))

    async def _on_message(self, message) -> None:
        """Answers that the receiver follows with a CREDIT resolve once that CREDIT is in,
        so a caller sees the fresh credit as soon as its await returns."""
        if isinstance(message, Credit):
            if self._credit_waiters or self._credit_changed.locked():
                async with self._credit_changed:
                    self.credit = message
                    self._sent = self._uncounted(message)
                    self._credit_changed.notify_all()
            else:  # nobody waits for credit: no one to notify
                self.credit = message
                self._sent = self._uncounted(message)
            self._settle()
            return
        self._settle()
        if isinstance(message, Result):
            self._on_result(message)
        elif isinstance(message, Ack):
            future = self._controls.pop(message.control_id, None)
            if future is not None and not future.done():
                if message.operation in ("release", "credit_refresh", "extensions"):
                    self._unsettled.append((future, message))
                else:
                    future.set_result(message)
        elif isinstance(message, ErrorMessage):
            await self._unreserve(self._on_error(message))

    def _settle(self) -> None:
        for future, value in self._unsettled:
            if not future.done():
                future.set_result(value)
        self._unsettled.clear()

    def _on_result(self, result: Result) -> None:
        pending = self._pending.pop(result.batch_id, None)
        if pending is None or pending.future.done():
            return
        try:
            result.check_against(pending.batch, EXT_COMPACT_OUTPUT in self.extensions)
        except Fnx2Error as exc:
            pending.future.set_exception(exc)
            return
        self._unsettled.append((pending.future, result))

    def _on_error(self, message: ErrorMessage) -> _Pending | None:
        """Fail what the ERROR answers; returns the failed batch, if it was one."""
        error = RemoteError(_code(message.code), message.message)
        target = self._controls.pop(message.control_id, None) if message.control_id else None
        if target is not None:
            if not target.done():
                target.set_exception(error)
            return None
        if message.control_id is not None and message.control_id in self._pending:
            pending = self._pending.pop(message.control_id)
            if not pending.future.done():
                pending.future.set_exception(error)
            return pending
        return self._fail_oldest(error)

    def _fail_oldest(self, error: Fnx2Error) -> _Pending | None:
        if not self._pending:
            return None
        _, pending = self._pending.popitem(last=False)
        if not pending.future.done():
            pending.future.set_exception(error)
        return pending

    async def _unreserve(self, failed: _Pending | None) -> None:
        """A batch answered by an ERROR holds nothing at the receiver: stop counting it
        against the last credit, so a waiting `submit` never depends on a CREDIT that may
        not follow the ERROR."""
        if failed is None:
            return
        async with self._credit_changed:
            self._sent = tuple(max(0, s - n) for s, n in zip(self._sent, failed.need, strict=True))
            self._credit_changed.notify_all()

    async def _fail_all(self, error: Fnx2Error) -> None:
        self._settle()
        self._failure = error
        futures = [p.future for p in self._pending.values()] + list(self._controls.values())
        self._pending.clear()
        self._controls.clear()
        for future in futures:
            if not future.done():
                future.set_exception(error)
        async with self._credit_changed:
            self._credit_changed.notify_all()

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._stream.closed:
            raise ChannelClosedError("channel is closed")

    async def close(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
            await asyncio.gather(self._keepalive, return_exceptions=True)
        await self._stream.close()
        if self._pump is not None:
            self._pump.cancel()
            try:
                await self._pump
            except (asyncio.CancelledError, Exception):
                pass
        await self._fail_all(ChannelClosedError("channel closed"))


def _code(code: str) -> ErrorCode:
    return ErrorCode(code) if code in ErrorCode._value2member_map_ else ErrorCode.METADATA


_Fields = TypeVar("_Fields")


def _ack_fields(ack: Ack, kind: type[_Fields]) -> _Fields:
    """The ACK's fields as the operation's type; a peer that answers another shape fails."""
    if not isinstance(ack.fields, kind):
        raise Fnx2Error(ErrorCode.METADATA, f"ACK {ack.operation} carries {type(ack.fields).__name__}")
    return ack.fields


def _without_lease_sequences(batch: Batch) -> Batch:
    """A plain 2.0 peer (or one that declined the extension) gets the slices without it."""
    slices = batch.batch.sequences
    if all(s.lease_sequence is None for s in slices):
        return batch
    plain = tuple(s._replace(lease_sequence=None) for s in slices)
    return replace(batch, batch=replace(batch.batch, sequences=plain))
