"""Zero-copy frame reading: an asyncio BufferedProtocol that receives straight into buffers.

Preludes and small frames land in a per-connection scratch buffer, and every whole frame a
read brought is parsed in that one callback (a RESULT and its CREDIT: one read, one loop
iteration). Once a prelude is bound-checked, a body that does not fit there goes into a
preallocated buffer of at least the announced size, taken from a small pool of buffers
whose earlier frames are no longer referenced, and the kernel writes into it directly
(`recv_into`), with no intermediate stream buffer. The body's CRC32C is extended as the
data lands, while it is still in cache, so decoding does not read it again for the CRC.
Works for TCP and TLS alike.
"""

from __future__ import annotations

import asyncio
import collections
import json
import sys
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from libs.fnx2.wire import compact
from libs.fnx2.wire.codec import PRELUDE_BYTES, CodecLimits, Prelude, parse_prelude
from libs.fnx2.wire.crc import crc32c_combine, crc32c_extend
from libs.fnx2.wire.errors import ChannelClosedError, ErrorCode, Fnx2Error
from libs.fnx2.wire.messages import Kind
from libs.fnx2.wire.tensor import STORAGE, DType, _finite_bytes, crc_and_finite

_MAX_QUEUED_FRAMES = 4
_DATA_KINDS = (Kind.BATCH, Kind.RESULT)
# Arriving payload is checked in pieces of this size: small enough to stay in the L2 cache
# between the CRC and the finiteness check, large enough that per-piece calls cost little.
_CRC_STEP = 256 * 1024
_ON_ARRIVAL_MIN_BYTES = 1024 * 1024


class ReceivedBody(NamedTuple):
    """A frame body as it arrived, with what was computed while its bytes were in cache:
    the body's CRC32C and, for large payloads, finiteness and each sequence's input CRC32C
    as (start, end, crc)."""

    prelude: Prelude
    body: memoryview | bytes  # bytes: a small frame, copied out of the scratch buffer
    body_crc: int | None = None
    slice_crcs: tuple[tuple[int, int, int], ...] | None = None
    finite: tuple[DType, bool] | None = None  # (dtype assumed, all values finite)


@dataclass(frozen=True, slots=True)
class _PayloadPlan:
    """What the (not yet validated) metadata says about the payload: its float dtype, for
    a finiteness check on arrival, and each sequence's byte range, for input CRCs.
    Only an optimisation: the decoder validates the metadata, and uses the ranges' CRCs
    only if they equal those of the validated batch."""

    dtype: DType | None
    ranges: list[tuple[int, int]]
    tiles: bool = False  # the ranges cover the payload exactly, in order


_NO_PLAN = _PayloadPlan(None, [])


def _tiles(ranges: list[tuple[int, int]], start: int, end: int) -> bool:
    """True when the ranges cover [start, end) exactly, in order: then the body's CRC is
    the metadata's CRC combined with the ranges' CRCs, and the payload is read once."""
    for a, b in ranges:
        if a != start:
            return False
        start = b
    return bool(ranges) and start == end


def _payload_plan(prelude: Prelude, body: memoryview) -> _PayloadPlan:
    if prelude.payload_bytes < _ON_ARRIVAL_MIN_BYTES:
        return _NO_PLAN
    metadata = bytes(body[: prelude.metadata_bytes])
    offset = prelude.metadata_bytes
    if compact.is_compact(metadata):
        peeked = compact.peek(metadata, prelude.kind)
        if peeked is None:
            return _NO_PLAN
        dtype, relative = peeked
        ranges = [(offset + a, offset + b) for a, b in relative]
    else:
        try:
            meta = json.loads(metadata)
            shape, dtype = meta["tensor"]["shape"], DType(meta["tensor"]["dtype"])
            row_bytes = (shape[1] if len(shape) == 2 else 1) * STORAGE[dtype].itemsize
            ranges = [] if prelude.kind != Kind.BATCH else [
                (offset + s["input_row_start"] * row_bytes,
                 offset + (s["input_row_start"] + s["input_row_count"]) * row_bytes)
                for s in meta["batch"]["sequences"]]
        except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError):
            return _NO_PLAN
    if len(ranges) > 4096 or any(type(a) is not int or type(b) is not int
                                 or not offset <= a < b <= prelude.body_bytes for a, b in ranges):
        ranges = []
    return _PayloadPlan(None if dtype is DType.INT32 else dtype, ranges,
                        _tiles(ranges, prelude.metadata_bytes, prelude.body_bytes))


def whole_body(prelude: Prelude, body: bytes) -> ReceivedBody:
    """A body already whole in memory (a small frame here, any frame a StreamReader read):
    its CRC32C and, for a compact BATCH or RESULT with a float payload, its finiteness, in
    one call over the payload."""
    if not body:
        return ReceivedBody(prelude, body, 0)
    dtype = None
    meta_end = prelude.metadata_bytes
    if prelude.payload_bytes and prelude.kind in _DATA_KINDS and body[:4] == compact.MAGIC:
        dtype = compact.payload_dtype(body, prelude.kind)
    if dtype is None or dtype is DType.INT32 or prelude.payload_bytes % STORAGE[dtype].itemsize:
        return ReceivedBody(prelude, body, crc32c_extend(0, body))
    view = memoryview(body)
    crc, finite = crc_and_finite(crc32c_extend(0, view[:meta_end]), view[meta_end:], dtype)
    return ReceivedBody(prelude, body, crc, None, (dtype, finite))


class BufferPool:
    """Reuses body buffers whose frames nobody references any more.

    A buffer stays busy while any view of it lives (a decoded tensor, a retained replay
    input), which shows as an extra reference to the pooled array. Reusing memory that
    is already mapped avoids a page fault per 4 KiB, which costs more than the copy.
    """

    def __init__(self, max_buffers: int = 16, max_bytes: int = 512 * 1024 * 1024) -> None:
        self._buffers: list[np.ndarray] = []
        self._max_buffers, self._max_bytes = max_buffers, max_bytes
        self.largest_take_bytes = 0

    def note(self, nbytes: int) -> None:
        """A body of `nbytes` held outside the pool (a small frame copied out of scratch)."""
        self.largest_take_bytes = max(self.largest_take_bytes, nbytes)

    def take(self, nbytes: int) -> memoryview:
        self.largest_take_bytes = max(self.largest_take_bytes, nbytes)
        idle_too_small = []
        for buffer in self._buffers:
            if sys.getrefcount(buffer) == _IDLE_REFS:
                if buffer.nbytes >= nbytes:
                    return buffer.data[:nbytes]
                idle_too_small.append(buffer)
        buffer = np.empty(nbytes, np.uint8)
        for old in idle_too_small:  # make room by forgetting idle buffers that are too small
            if self._fits(nbytes):
                break
            # By identity: `list.remove` would compare arrays element-wise.
            self._buffers = [b for b in self._buffers if b is not old]
        if self._fits(nbytes):
            self._buffers.append(buffer)
        return buffer.data

    def trim(self) -> int:
        """Forget every idle buffer (its memory goes back to the allocator); returns the
        bytes released. Called when a listener has no channel left."""
        before = self.pooled_bytes
        self._buffers = [b for b in self._buffers if sys.getrefcount(b) > _IDLE_REFS]
        return before - self.pooled_bytes

    def _fits(self, nbytes: int) -> bool:
        return (len(self._buffers) < self._max_buffers
                and sum(b.nbytes for b in self._buffers) + nbytes <= self._max_bytes)

    @property
    def pooled_bytes(self) -> int:
        return sum(b.nbytes for b in self._buffers)


_EMPTY = memoryview(b"")
# Frames whose whole body fits here are parsed from it, many per read; their bodies are
# copied out (at most this much), larger ones are received straight into their own buffer.
# A connection starts with a small one (idle connections stay cheap) and grows it, in
# powers of two up to the largest size, to fit the frames that arrive.
_SCRATCH_BYTES = 128 * 1024
_FIRST_SCRATCH_BYTES = 4 * 1024
_DISCARD = bytearray(64 * 1024)  # written, never read: shared by every protocol
_MAX_DISCARD_BYTES = 1024 * 1024
_LINGER_S = 1.0

# The pool's list, the loop variable and getrefcount's own argument.
_IDLE_REFS = 3


def check_admitted(prelude: Prelude, max_body_bytes: int | None) -> None:
    if max_body_bytes is not None and prelude.body_bytes > max_body_bytes:
        raise Fnx2Error(ErrorCode.FRAME_SIZE, f"frame body of {prelude.body_bytes} bytes exceeds "
                        f"the {max_body_bytes} this channel admits now")


class FrameProtocol(asyncio.BufferedProtocol):
    """`max_body_bytes`, when set, bounds a frame body before any buffer is taken for it:
    a receiver keeps it at a small preamble until the peer is bound, then raises it to
    what its credits admit. A larger announced body ends the channel (FRAME_SIZE)."""

    def __init__(self, limits: CodecLimits, on_connection=None,
                 pool: BufferPool | None = None, max_body_bytes: int | None = None) -> None:
        self._limits, self._on_connection = limits, on_connection
        self.max_body_bytes = max_body_bytes
        self._pool = pool or BufferPool()
        # Preludes and small frames land in one scratch buffer ([_scan, _end) not parsed yet);
        # a body that does not fit goes to its own pooled buffer (`_target`).
        self._scratch = bytearray(_FIRST_SCRATCH_BYTES)
        self._scan = self._end = 0
        self._prelude: Prelude | None = None  # set while a large body is arriving
        self._target = _EMPTY
        self._filled = 0
        self._crc = self._crc_done = 0
        self._plan: _PayloadPlan | None = None
        self._range_crcs: list[int] = []  # per sequence input, when the ranges tile the payload
        self._range_index = 0  # the first range not complete yet
        self._finite, self._finite_done = True, 0
        self._frames: collections.deque[ReceivedBody] = collections.deque()
        self._failure: BaseException | None = None
        self._discarded: int | None = None  # bytes read and dropped after a terminal error
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
        if self._discarded is not None:
            return memoryview(_DISCARD)
        if self._prelude is not None:  # a large body: straight into its own buffer
            return self._target[self._filled:]
        if self._scan == self._end:
            self._scan = self._end = 0
        elif len(self._scratch) - self._scan < PRELUDE_BYTES:  # a prelude cut at the end
            self._move_tail(self._scratch)
        return memoryview(self._scratch)[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._discarded is not None:
            self._discarded += nbytes
            if self._discarded > _MAX_DISCARD_BYTES:
                self._fail(self._failure)  # enough: stop reading until the channel closes
            return
        if self._prelude is None:
            self._end += nbytes
            self._parse_scratch()
            return
        self._filled += nbytes
        if self._filled < len(self._target):
            self._extend_crc()  # on bytes the kernel has just written: still in cache
            return
        self._extend_crc(final=True)
        if self._range_crcs:
            for (start, end), crc in zip(self._plan.ranges, self._range_crcs, strict=True):
                self._crc = crc32c_combine(self._crc, crc, end - start)
        self._frames.append(ReceivedBody(self._prelude, self._target, self._crc,
                                         self._finished_ranges(), self._finished_finite()))
        self._prelude, self._target, self._filled, self._plan = None, _EMPTY, 0, None
        self._queued()

    def _parse_scratch(self) -> None:
        """Every whole frame that the last reads left in the scratch buffer, in one go: small
        frames (decode steps, CREDIT, ACK) cost one read and one callback for all of them.
        A frame whose body is still arriving gets its own buffer, which the partial body
        moves to and the kernel fills from then on. Parsing stops while the consumer has
        `_MAX_QUEUED_FRAMES` frames to take; `read_frame` resumes it."""
        scratch = memoryview(self._scratch)
        delivered = False
        while self._end - self._scan >= PRELUDE_BYTES and len(self._frames) < _MAX_QUEUED_FRAMES:
            start = self._scan + PRELUDE_BYTES
            try:
                prelude = parse_prelude(scratch[self._scan:start], self._limits)
                check_admitted(prelude, self.max_body_bytes)
            except Fnx2Error as exc:  # terminal: report to the consumer, discard the rest
                self._discard_after(exc)
                return
            end = start + prelude.body_bytes
            if end > self._end:  # still arriving: room for it here, or a buffer of its own
                frame_bytes = PRELUDE_BYTES + prelude.body_bytes
                if frame_bytes <= len(self._scratch):
                    if end > len(self._scratch):
                        self._move_tail(self._scratch)
                elif frame_bytes <= _SCRATCH_BYTES:  # frames of this size: whole from now on
                    self._move_tail(bytearray(min(_SCRATCH_BYTES, 1 << frame_bytes.bit_length())))
                else:
                    self._start_body(prelude, scratch[start:self._end])
                break
            body = scratch[start:end].tobytes() if prelude.body_bytes else b""
            self._pool.note(prelude.body_bytes)
            self._frames.append(whole_body(prelude, body))
            self._scan, delivered = end, True
        if delivered:
            self._queued()

    def _move_tail(self, scratch: bytearray) -> None:
        """The unparsed bytes to the start of `scratch` (this one, or a larger new one)."""
        tail = self._scratch[self._scan:self._end]
        scratch[:len(tail)] = tail
        self._scratch, self._scan, self._end = scratch, 0, len(tail)

    def _start_body(self, prelude: Prelude, arrived: memoryview) -> None:
        self._prelude = prelude
        self._crc, self._crc_done, self._plan, self._range_crcs = 0, 0, None, []
        self._range_index = 0
        self._finite, self._finite_done = True, 0
        self._target = self._pool.take(prelude.body_bytes)
        self._target[:len(arrived)] = arrived
        self._filled = len(arrived)
        self._scan = self._end = 0

    def _queued(self) -> None:
        if len(self._frames) >= _MAX_QUEUED_FRAMES and not self._reading_paused:
            self._reading_paused = True
            self._transport.pause_reading()
        self._wake()

    def _extend_crc(self, final: bool = False) -> None:
        """Extend the CRC32C (and each sequence's input CRC32C) and the finiteness check
        over the bytes that arrived since the last call, piece by piece: each piece is
        checked for finiteness right after its CRC, while it is still in cache, so the
        payload is read from memory once, as it lands, and nothing is left for the decoder."""
        high = self._filled
        if self._plan is None:
            meta_end = self._prelude.metadata_bytes
            if high < meta_end:
                return
            self._plan = _payload_plan(self._prelude, self._target)
            self._range_crcs = [0] * len(self._plan.ranges) if self._plan.tiles else []
            self._range_index = 0
            self._finite_done = meta_end
            if self._crc_done < meta_end:  # the metadata: the body CRC's first part
                self._crc = crc32c_extend(self._crc, self._target[self._crc_done:meta_end])
                self._crc_done = meta_end
        if high - self._crc_done < _CRC_STEP and not final:
            return
        while self._crc_done < high:
            low = self._crc_done
            end = min(high, low + _CRC_STEP)
            if self._range_crcs:
                self._extend_ranges(low, end)
            else:
                self._crc = crc32c_extend(self._crc, self._target[low:end])
            if self._plan.dtype is not None and self._finite:
                self._check_finite(end)
            self._crc_done = end

    def _extend_ranges(self, low: int, high: int) -> None:
        """The ranges tile the payload in order: extend those that [low, high) touches."""
        ranges, crcs, index = self._plan.ranges, self._range_crcs, self._range_index
        while index < len(ranges):
            start, end = ranges[index]
            a, b = max(start, low), min(end, high)
            if a < b:  # the same bytes, still in cache: each sequence's input identity
                crcs[index] = crc32c_extend(crcs[index], self._target[a:b])
            if end > high:
                break
            index += 1
        self._range_index = index

    def _check_finite(self, high: int) -> None:
        itemsize = STORAGE[self._plan.dtype].itemsize
        end = self._finite_done + (high - self._finite_done) // itemsize * itemsize
        if end > self._finite_done:
            raw = np.frombuffer(self._target[self._finite_done:end], np.uint8)
            self._finite = _finite_bytes(raw, self._plan.dtype)
            self._finite_done = end

    def _finished_ranges(self) -> tuple[tuple[int, int, int], ...] | None:
        if not self._range_crcs:  # no ranges, or ranges that do not tile: the decoder's part
            return None
        offset = self._prelude.metadata_bytes
        return tuple((start - offset, end - offset, crc)
                     for (start, end), crc in zip(self._plan.ranges, self._range_crcs, strict=True))

    def _finished_finite(self) -> tuple[DType, bool] | None:
        """(dtype the check assumed, result), when the whole payload was checked."""
        if self._plan is None or self._plan.dtype is None:
            return None
        if self._finite and self._finite_done != self._prelude.body_bytes:
            return None  # a trailing partial element: leave it to the decoder
        return self._plan.dtype, self._finite

    def eof_received(self) -> bool:
        self._fail(ChannelClosedError("peer closed the stream"))
        return False

    @property
    def transport(self) -> asyncio.Transport | None:
        return self._transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ChannelClosedError(f"connection lost: {exc}" if exc else "connection closed"))
        # A partly received body goes back to the pool (or the allocator) now.
        self._prelude, self._target, self._filled, self._plan = None, _EMPTY, 0, None
        self._scan = self._end = 0
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
    async def read_frame(self) -> ReceivedBody:
        while not self._frames:
            if self._failure is not None:
                raise self._failure
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        frame = self._frames.popleft()
        if self._reading_paused and len(self._frames) < _MAX_QUEUED_FRAMES // 2:
            if self._prelude is None and self._discarded is None:
                self._parse_scratch()  # frames already read, left while the queue was full
            if len(self._frames) < _MAX_QUEUED_FRAMES:
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
        """After a terminal frame error, half-close and linger briefly (still dropping what
        arrives), so the peer reads the ERROR before the connection goes."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if self._discarded is not None and self._failure is not None and transport.can_write_eof():
            transport.write_eof()
            asyncio.get_running_loop().call_later(_LINGER_S, transport.close)
            return
        transport.close()

    async def wait_closed(self) -> None:
        await self.closed

    def _discard_after(self, exc: Fnx2Error) -> None:
        """A terminal frame error: the consumer answers with one ERROR and closes. Until
        then, what the peer already sent is read and dropped, so closing does not reset
        the connection (losing that ERROR) over unread bytes."""
        if self._failure is None:
            self._failure = exc
        self._discarded = 0
        self._prelude, self._target, self._filled = None, _EMPTY, 0
        self._scan = self._end = 0
        self._wake()

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
