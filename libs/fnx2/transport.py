"""Zero-copy frame reading: an asyncio BufferedProtocol that receives straight into buffers.

The 40-byte prelude lands in a fixed buffer; once it is bound-checked, the body goes into
a preallocated buffer of at least the announced size, taken from a small pool of buffers
whose earlier frames are no longer referenced, and the kernel writes into it directly
(`recv_into`), with no intermediate stream buffer. The body's CRC32C is extended as the
data lands, while it is still in cache, so decoding does not read it again for the CRC.
Works for TCP and TLS alike.
"""

from __future__ import annotations

import asyncio
import collections
import sys

import numpy as np
from google_crc32c import _crc32c as _crc

from libs.fnx2.codec import PRELUDE_BYTES, CodecLimits, Prelude, parse_prelude
from libs.fnx2.errors import ChannelClosedError, Fnx2Error

_MAX_QUEUED_FRAMES = 4
_CRC_STEP = 512 * 1024


class BufferPool:
    """Reuses body buffers whose frames nobody references any more.

    A buffer stays busy while any view of it lives (a decoded tensor, a retained replay
    input), which shows as an extra reference to the pooled array. Reusing memory that
    is already mapped avoids a page fault per 4 KiB, which costs more than the copy.
    """

    def __init__(self, max_buffers: int = 16, max_bytes: int = 512 * 1024 * 1024) -> None:
        self._buffers: list[np.ndarray] = []
        self._max_buffers, self._max_bytes = max_buffers, max_bytes

    def take(self, nbytes: int) -> memoryview:
        for buffer in self._buffers:
            if buffer.nbytes >= nbytes and sys.getrefcount(buffer) == _IDLE_REFS:
                return memoryview(buffer)[:nbytes]
        buffer = np.empty(nbytes, np.uint8)
        if (len(self._buffers) < self._max_buffers
                and sum(b.nbytes for b in self._buffers) + nbytes <= self._max_bytes):
            self._buffers.append(buffer)
        return memoryview(buffer)


# The pool's list, the loop variable and getrefcount's own argument.
_IDLE_REFS = 3


class FrameProtocol(asyncio.BufferedProtocol):
    def __init__(self, limits: CodecLimits, on_connection=None,
                 pool: BufferPool | None = None) -> None:
        self._limits, self._on_connection = limits, on_connection
        self._pool = pool or BufferPool()
        self._head = bytearray(PRELUDE_BYTES)
        self._prelude: Prelude | None = None
        self._target = memoryview(self._head)
        self._filled = 0
        self._crc = self._crc_done = 0
        self._frames: collections.deque[tuple[Prelude, memoryview, int]] = collections.deque()
        self._failure: BaseException | None = None
        self._waiter: asyncio.Future | None = None
        self._transport: asyncio.Transport | None = None
        self._reading_paused = False
        self._writing_paused = False
        self._drain_waiters: list[asyncio.Future] = []
        self.closed = asyncio.get_event_loop().create_future()

    # -- asyncio callbacks --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        if self._on_connection is not None:
            self._on_connection(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._target[self._filled:]

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        if self._prelude is not None and self._filled - self._crc_done >= _CRC_STEP:
            self._extend_crc()  # on bytes the kernel has just written: still in cache
        if self._filled < len(self._target):
            return
        if self._prelude is None:
            try:
                self._prelude = parse_prelude(bytes(self._head), self._limits)
            except Fnx2Error as exc:  # terminal: stop reading, report to the consumer
                self._fail(exc)
                return
            self._crc, self._crc_done = 0, 0
            if self._prelude.body_bytes:
                self._target = self._pool.take(self._prelude.body_bytes)
                self._filled = 0
                return
            self._target = memoryview(b"")
        self._extend_crc()
        self._frames.append((self._prelude, self._target, self._crc))
        self._prelude, self._target, self._filled = None, memoryview(self._head), 0
        if len(self._frames) >= _MAX_QUEUED_FRAMES and not self._reading_paused:
            self._reading_paused = True
            self._transport.pause_reading()
        self._wake()

    def _extend_crc(self) -> None:
        if self._filled > self._crc_done:
            chunk = np.frombuffer(self._target[self._crc_done : self._filled], np.uint8)
            self._crc = _crc.extend(self._crc, chunk)
            self._crc_done = self._filled

    def eof_received(self) -> bool:
        self._fail(ChannelClosedError("peer closed the stream"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ChannelClosedError(f"connection lost: {exc}" if exc else "connection closed"))
        self._writing_paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()

    # -- consumer side ------------------------------------------------------------------
    async def read_frame(self) -> tuple[Prelude, memoryview, int | None]:
        """(prelude, body, CRC32C of the body computed while it arrived)."""
        while not self._frames:
            if self._failure is not None:
                raise self._failure
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        frame = self._frames.popleft()
        if self._reading_paused and len(self._frames) < _MAX_QUEUED_FRAMES // 2:
            self._reading_paused = False
            self._transport.resume_reading()
        return frame

    def write(self, data) -> None:
        if self._transport is None or self._transport.is_closing():
            raise ChannelClosedError("transport is closed")
        self._transport.write(data)

    async def drain(self) -> None:
        if self._failure is not None and isinstance(self._failure, ChannelClosedError):
            if self._transport is None or self._transport.is_closing():
                raise self._failure
        if self._writing_paused:
            waiter = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(waiter)
            await waiter

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    async def wait_closed(self) -> None:
        await self.closed

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
        if self._transport is not None and not self._reading_paused:
            try:
                self._transport.pause_reading()
                self._reading_paused = True
            except (RuntimeError, AttributeError):
                pass
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
