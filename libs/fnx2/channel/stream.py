"""Frame transport over asyncio streams: per-direction sequence numbers, scatter writes.

One read path: `FrameStream.read` takes a `ReceivedBody` (the prelude bound-checked, then
exactly the announced body, its CRC32C and finiteness checked on arrival), decodes it and
checks its place in the sequence. The body comes from a `FrameProtocol` (kernel
`recv_into` a buffer allocated for that body) or, through `StreamSource`, from a
StreamReader (`readexactly`), checked on arrival by the same `transport.whole_body` as a
small frame of the protocol; the tensor is a zero-copy view of that body. Large
payloads are written as header and payload memoryview separately (on Python 3.11
`writelines` would join them into a copy); small frames go out as one write.
"""

from __future__ import annotations

import asyncio
import time
from typing import NamedTuple

from libs.fnx2.channel.transport import ReceivedBody, check_admitted, whole_body
from libs.fnx2.wire.codec import (
    DEFAULT_LIMITS,
    PRELUDE_BYTES,
    CodecLimits,
    ExpectedBinding,
    Frame,
    Message,
    Prelude,
    decode_body,
    encode_frame,
    parse_prelude,
    payload_crc,
)
from libs.fnx2.wire.control import EXT_COMPACT_META
from libs.fnx2.wire.errors import ChannelClosedError, ErrorCode, Fnx2Error

_SMALL_FRAME = 64 * 1024
_WRITE_CHUNK = 1024 * 1024


class Received(NamedTuple):
    """One decoded frame, or the recoverable error it raised, plus its decode time."""

    frame: Frame | None
    error: Fnx2Error | None
    unpack_ns: int
    received_ns: int


def _payload_len(message: Message) -> int:
    tensor = getattr(message, "tensor", None)
    return 0 if tensor is None else tensor.descriptor.payload_bytes


def _keeps_unsent_views(sink) -> bool:
    """Whether the sink's transport keeps what a write could not send yet as a view of the
    caller's buffer (uvloop: libuv writes straight from it), rather than copying it into
    its own buffer (the standard library's transport on Python 3.11, which then also
    memmoves that buffer as it drains: a whole 16 MiB payload would cost two copies)."""
    transport = getattr(sink, "transport", None)
    return type(transport).__module__.startswith("uvloop")


class StreamSource:
    """Frames from an asyncio StreamReader (`readexactly`; the body is copied once)."""

    def __init__(self, reader: asyncio.StreamReader, limits: CodecLimits) -> None:
        self._reader, self._limits = reader, limits
        self.max_body_bytes: int | None = None
        self._prelude: Prelude | None = None  # kept if a read is cancelled between the parts

    async def read_frame(self) -> ReceivedBody:
        try:
            if self._prelude is None:
                head = await self._reader.readexactly(PRELUDE_BYTES)
                self._prelude = parse_prelude(head, self._limits)
                check_admitted(self._prelude, self.max_body_bytes)
            prelude = self._prelude
            body = await self._reader.readexactly(prelude.body_bytes) if prelude.body_bytes else b""
            self._prelude = None
        except asyncio.IncompleteReadError as exc:
            raise ChannelClosedError("peer closed the stream") from exc
        except (ConnectionError, OSError) as exc:
            raise ChannelClosedError(f"stream failed: {exc}") from exc
        return whole_body(prelude, body)


class FrameStream:
    """One channel's framing. `source` is a StreamReader or a FrameProtocol; `sink` is a
    StreamWriter or the same FrameProtocol."""

    def __init__(self, source, sink, limits: CodecLimits = DEFAULT_LIMITS, *,
                 allow_extensions: bool = True) -> None:
        if isinstance(source, asyncio.StreamReader):
            source = StreamSource(source, limits)
        self._source, self._writer, self._limits = source, sink, limits
        self.allow_extensions = allow_extensions
        # Extensions whose fields this channel accepts: none until the offer is accepted.
        self.negotiated: frozenset[str] = frozenset()
        self._next_out = 0
        self._next_in = 0
        self._write_lock = asyncio.Lock()
        self.closed = False

    def admit_body_bytes(self, max_body_bytes: int | None) -> None:
        """Bound the next frame bodies this stream takes a buffer for (None: codec limits)."""
        self._source.max_body_bytes = max_body_bytes

    async def read(self, expected: ExpectedBinding | None = None) -> Received:
        """Raises terminal errors (and EOF as ChannelClosedError); returns recoverable ones."""
        received = await self._source.read_frame()
        prelude = received.prelude
        started = time.monotonic_ns()
        in_order = prelude.sequence_no == self._next_in
        self._next_in = prelude.sequence_no + 1
        try:
            frame = decode_body(prelude, received.body, expected=expected,
                                allow_extensions=self.allow_extensions,
                                negotiated=self.negotiated,
                                body_crc=received.body_crc, slice_crcs=received.slice_crcs,
                                finite=received.finite)
        except Fnx2Error as exc:
            if exc.terminal:
                raise
            return Received(None, exc, time.monotonic_ns() - started, started)
        if not in_order:
            error = Fnx2Error(ErrorCode.SEQUENCE, "frame sequence_no is out of order")
            return Received(None, error, time.monotonic_ns() - started, started)
        return Received(frame, None, time.monotonic_ns() - started, started)

    async def send(self, *messages: Message) -> None:
        """Encode and write whole frames under the stream's write lock, so frames never
        interleave. Large payloads go out in chunks straight from the tensor's memory,
        waiting for the transport to drain between chunks, so the transport never has to
        buffer (and later memmove) a whole payload."""
        # Payload CRCs need no sequence number: computed before taking the lock, while
        # the previous frame is still streaming out.
        crcs = [payload_crc(m) if _payload_len(m) > _SMALL_FRAME else None for m in messages]
        if not self._write_lock.locked() and all(crc is None for crc in crcs):
            # Small frames only, and no large frame streaming out: encoded and written
            # with no await in between, so nothing can interleave and no lock is needed.
            self._write_small(messages)
            await self.drain()
            return
        async with self._write_lock:
            small: list[bytes | memoryview] = []  # consecutive small frames: one write
            for message, known_crc in zip(messages, crcs, strict=True):
                if self.closed:
                    raise ChannelClosedError("channel is closed")
                encoded = encode_frame(message, self._next_out, self._limits,
                                       known_payload_crc=known_crc,
                                       compact_meta=EXT_COMPACT_META in self.negotiated)
                self._next_out += 1
                if len(encoded.payload) <= _SMALL_FRAME:
                    small.extend((encoded.header, encoded.payload))
                    continue
                if small:
                    self._writer.write(b"".join(small))
                    small.clear()
                await self._write_large(encoded)
            if small:
                self._writer.write(b"".join(small))
            await self.drain()

    def _write_small(self, messages: tuple[Message, ...]) -> None:
        parts: list[bytes | memoryview] = []
        compact_meta = EXT_COMPACT_META in self.negotiated
        for message in messages:
            if self.closed:
                raise ChannelClosedError("channel is closed")
            encoded = encode_frame(message, self._next_out, self._limits, compact_meta=compact_meta)
            self._next_out += 1
            parts += (encoded.header, encoded.payload)
        self._writer.write(b"".join(parts))

    async def _write_large(self, encoded) -> None:
        self._writer.write(encoded.header)
        payload = encoded.payload
        if _keeps_unsent_views(self._writer):  # one write; the loop sends it as it drains
            self._writer.write(payload)
            await self.drain()
            return
        for offset in range(0, len(payload), _WRITE_CHUNK):
            self._writer.write(payload[offset : offset + _WRITE_CHUNK])
            await self.drain()

    async def drain(self) -> None:
        try:
            await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            raise ChannelClosedError(f"stream failed: {exc}") from exc

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (ConnectionError, OSError):
            pass
