"""Frame transport over asyncio streams: per-direction sequence numbers, scatter writes.

Reads take the 40-byte prelude with `readexactly`, bound-check it, then take exactly the
announced body; the tensor is a zero-copy view of that body. Writes send the header and
the payload memoryview separately (on Python 3.11 `writelines` would join them into a
copy), so a payload is never concatenated with its header.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from libs.fnx2.codec import (
    DEFAULT_LIMITS, PRELUDE_BYTES, CodecLimits, ExpectedBinding, Frame, Message, decode_body,
    encode_frame, parse_prelude,
)
from libs.fnx2.errors import ChannelClosedError, ErrorCode, Fnx2Error

_SMALL_FRAME = 64 * 1024


@dataclass(frozen=True, slots=True)
class Received:
    """One decoded frame, or the recoverable error it raised, plus its decode time."""

    frame: Frame | None
    error: Fnx2Error | None
    unpack_ns: int
    received_ns: int


class FrameStream:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 limits: CodecLimits = DEFAULT_LIMITS, *, allow_extensions: bool = True) -> None:
        self._reader, self._writer, self._limits = reader, writer, limits
        self.allow_extensions = allow_extensions
        self._next_out = 0
        self._next_in = 0
        self.closed = False

    async def read(self, expected: ExpectedBinding | None = None) -> Received:
        """Raises terminal errors (and EOF as ChannelClosedError); returns recoverable ones."""
        try:
            head = await self._reader.readexactly(PRELUDE_BYTES)
            prelude = parse_prelude(head, self._limits)
            body = await self._reader.readexactly(prelude.body_bytes) if prelude.body_bytes else b""
        except asyncio.IncompleteReadError as exc:
            raise ChannelClosedError("peer closed the stream") from exc
        except (ConnectionError, OSError) as exc:
            raise ChannelClosedError(f"stream failed: {exc}") from exc
        started = time.monotonic_ns()
        in_order = prelude.sequence_no == self._next_in
        self._next_in = prelude.sequence_no + 1
        try:
            frame = decode_body(prelude, memoryview(body), expected=expected,
                                allow_extensions=self.allow_extensions)
        except Fnx2Error as exc:
            if exc.terminal:
                raise
            return Received(None, exc, time.monotonic_ns() - started, started)
        if not in_order:
            error = Fnx2Error(ErrorCode.SEQUENCE, "frame sequence_no is out of order")
            return Received(None, error, time.monotonic_ns() - started, started)
        return Received(frame, None, time.monotonic_ns() - started, started)

    def write(self, message: Message) -> int:
        """Encode and hand to the transport synchronously, so frames never interleave."""
        if self.closed:
            raise ChannelClosedError("channel is closed")
        encoded = encode_frame(message, self._next_out, self._limits)
        self._next_out += 1
        if len(encoded.payload) <= _SMALL_FRAME:
            self._writer.writelines([encoded.header, encoded.payload])
        else:
            self._writer.write(encoded.header)
            self._writer.write(encoded.payload)
        return len(encoded)

    async def send(self, *messages: Message) -> None:
        for message in messages:
            self.write(message)
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
