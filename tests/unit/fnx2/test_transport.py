"""The receive path without sockets: bytes fed to FrameProtocol in arbitrary pieces."""

import asyncio

import numpy as np
import pytest

from libs.fnx2.channel.transport import FrameProtocol
from libs.fnx2.wire.codec import DEFAULT_LIMITS, PRELUDE_BYTES, decode_body, encode_frame
from libs.fnx2.wire.messages import Phase
from libs.fnx2.wire.tensor import crc32c
from tests.unit.fnx2.factories import REQ_A, REQ_B, batch


class _Transport:
    def pause_reading(self):
        pass

    def resume_reading(self):
        pass


def feed(frames: list[bytes], piece_sizes: list[int]):
    loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        protocol = FrameProtocol(DEFAULT_LIMITS)
        protocol.connection_made(_Transport())
        data, pos, i = b"".join(frames), 0, 0
        while pos < len(data):
            target = protocol.get_buffer(-1)
            n = min(len(target), piece_sizes[i % len(piece_sizes)], len(data) - pos)
            target[:n] = data[pos : pos + n]
            protocol.buffer_updated(n)
            pos, i = pos + n, i + 1
        return list(protocol._frames)
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def test_body_and_per_sequence_crcs_are_computed_on_arrival():
    big = batch(Phase.PREFILL, rows=(300, 212), requests=(REQ_A, REQ_B), width=1024, dtype="fp32")
    small = batch(rows=(2, 3))
    frames = [encode_frame(big, 0).to_bytes(), encode_frame(small, 1).to_bytes()]
    received = feed(frames, [7, 100_003, 40, 1 << 20, 3])
    assert len(received) == 2
    first = received[0]
    assert first.body_crc == crc32c(frames[0][PRELUDE_BYTES:])
    payload = np.frombuffer(first.body, np.uint8)[first.prelude.metadata_bytes:]
    row_bytes = 1024 * 4
    assert [(s, e) for s, e, _ in first.slice_crcs] == [(0, 300 * row_bytes),
                                                       (300 * row_bytes, 512 * row_bytes)]
    assert [c for _, _, c in first.slice_crcs] == [crc32c(payload[s:e]) for s, e, _ in first.slice_crcs]
    decoded = decode_body(first.prelude, first.body, body_crc=first.body_crc,
                          slice_crcs=first.slice_crcs).message
    assert decoded.input_crcs == tuple(c for _, _, c in first.slice_crcs)
    assert received[1].slice_crcs is None  # small frames: not worth it


def test_slice_crcs_for_other_ranges_are_ignored():
    big = batch(Phase.PREFILL, rows=(300, 212), requests=(REQ_A, REQ_B), width=1024, dtype="fp32")
    frame = encode_frame(big, 0).to_bytes()
    got = feed([frame], [1 << 16])[0]
    shifted = tuple((s + 4, e + 4, c) for s, e, c in got.slice_crcs)
    decoded = decode_body(got.prelude, got.body, body_crc=got.body_crc, slice_crcs=shifted).message
    assert decoded.input_crcs is None


def test_finiteness_is_checked_on_arrival_across_odd_piece_boundaries():
    import pytest

    from libs.fnx2.wire.errors import ErrorCode, Fnx2Error
    from libs.fnx2.wire.tensor import DType
    from tests.unit.fnx2.factories import reframe, split

    big = batch(Phase.PREFILL, rows=(300, 212), requests=(REQ_A, REQ_B), width=1024, dtype="bf16")
    good = encode_frame(big, 0).to_bytes()
    ok = feed([good], [4097, 333, 65536 + 1])[0]
    assert ok.finite == (DType.BF16, True)
    _, _, payload = split(good)
    words = np.frombuffer(payload, "<u2").copy()
    words[300 * 1024 + 17] = 0xFF80  # -inf in the second sequence
    bad_frame = reframe(good, payload=words.tobytes())
    bad = feed([bad_frame], [4097, 333, 65536 + 1])[0]
    assert bad.finite == (DType.BF16, False)
    with pytest.raises(Fnx2Error) as info:
        decode_body(bad.prelude, bad.body, body_crc=bad.body_crc, finite=bad.finite)
    assert info.value.code is ErrorCode.TENSOR_CONTRACT
    with pytest.raises(Fnx2Error):  # the decoder alone reaches the same verdict
        decode_body(bad.prelude, bad.body)


def test_body_crc_when_metadata_ranges_do_not_tile_the_payload():
    from tests.unit.fnx2.factories import reframe, split

    big = batch(Phase.PREFILL, rows=(300, 212), requests=(REQ_A, REQ_B), width=1024, dtype="fp32")
    good = encode_frame(big, 0).to_bytes()
    _, meta, _ = split(good)
    meta["batch"]["sequences"][1]["input_row_start"] = 301  # a gap: no longer a tiling
    lying = reframe(good, meta=meta)
    got = feed([lying], [65536 + 3])[0]
    assert got.body_crc == crc32c(lying[PRELUDE_BYTES:])
    tiled = feed([good], [65536 + 3])[0]
    assert tiled.body_crc == crc32c(good[PRELUDE_BYTES:])


def test_buffer_pool_reuses_only_unreferenced_buffers_and_stays_bounded():
    from libs.fnx2.channel.transport import BufferPool

    pool = BufferPool(max_buffers=2, max_bytes=10_000)
    first = pool.take(1000)
    held = np.frombuffer(first[:100], np.uint8)  # a decoded tensor still uses the buffer
    first_id = id(first.obj)
    del first
    second = pool.take(1000)
    second_id = id(second.obj)
    assert second_id != first_id
    del second
    third = pool.take(800)  # the second buffer is idle again: reused
    assert id(third.obj) == second_id and pool.pooled_bytes == 2000
    del third, held
    again = pool.take(1000)
    assert id(again.obj) == first_id  # nothing holds the first any more
    del again
    big = pool.take(5000)  # idle but too small: one is forgotten to make room
    assert pool.pooled_bytes == 6000 and big.obj.nbytes == 5000
    assert len(pool.take(20_000)) == 20_000 and pool.pooled_bytes <= 10_000


def test_buffer_pool_forgets_an_idle_buffer_behind_a_busy_one_of_another_size():
    """Making room compares buffers by identity: an element-wise `list.remove` on numpy
    arrays raised "operands could not be broadcast" once the pool was full."""
    from libs.fnx2.channel.transport import BufferPool

    pool = BufferPool(max_buffers=3, max_bytes=7000)
    busy = pool.take(1000)  # held by a decoded tensor: stays in the pool, first in line
    idle_small = pool.take(2000)
    idle_small_id = id(idle_small.obj)
    del idle_small
    big = pool.take(4500)  # full: the idle 2000-byte buffer behind the busy one must go
    assert big.obj.nbytes == 4500 and pool.pooled_bytes == 5500
    del big
    again = pool.take(4000)  # the 4500-byte buffer is idle again and reused
    assert again.obj.nbytes == 4500 and id(again.obj) != idle_small_id
    del again
    assert pool.trim() == 4500 and pool.pooled_bytes == 1000  # the busy one stays
    assert busy.obj.nbytes == 1000 and pool.largest_take_bytes == 4500


class _PausingTransport(_Transport):
    def __init__(self) -> None:
        self.paused = 0
        self.resumed = 0

    def pause_reading(self):
        self.paused += 1
        assert self.paused == self.resumed + 1

    def resume_reading(self):
        self.resumed += 1


def test_every_whole_frame_of_one_read_is_parsed_in_that_callback_and_the_queue_stays_bounded():
    frames = [encode_frame(batch(rows=(2, 3), seed=i), i).to_bytes() for i in range(10)]
    data = b"".join(frames)
    assert 4096 < len(data) < 64 * 1024

    async def run():
        protocol = FrameProtocol(DEFAULT_LIMITS)
        transport = _PausingTransport()
        protocol.connection_made(transport)
        pos = reads = 0
        while pos < len(data) and not transport.paused:  # as the kernel would, until paused
            target = protocol.get_buffer(-1)
            n = min(len(target), len(data) - pos)
            target[:n] = data[pos:pos + n]
            protocol.buffer_updated(n)
            pos, reads = pos + n, reads + 1
        # several frames per read; whole frames beyond the queue bound wait, already read,
        # until the consumer takes some
        assert len(protocol._frames) == 4 and transport.paused == 1 and reads < 4
        received = []
        while len(received) < len(frames):
            received.append(await protocol.read_frame())
            while pos < len(data) and transport.resumed == transport.paused:
                target = protocol.get_buffer(-1)
                n = min(len(target), len(data) - pos)
                target[:n] = data[pos:pos + n]
                protocol.buffer_updated(n)
                pos += n
        assert transport.resumed >= 1
        return received

    received = asyncio.run(run())
    assert [r.prelude.sequence_no for r in received] == list(range(10))
    for frame, got in zip(frames, received, strict=True):
        assert bytes(got.body) == frame[PRELUDE_BYTES:]
        assert got.body_crc == crc32c(frame[PRELUDE_BYTES:])
        decoded = decode_body(got.prelude, got.body, body_crc=got.body_crc).message
        assert decoded.batch.input_row_count == 5


def test_the_scratch_buffer_grows_to_frames_that_arrive_and_then_takes_them_whole():
    # 32 KiB bodies: larger than a fresh connection's scratch, far below the largest one
    frames = [encode_frame(batch(rows=(4, 4), width=1024, dtype="fp32", seed=i), i).to_bytes()
              for i in range(3)]
    reads = []

    loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        protocol = FrameProtocol(DEFAULT_LIMITS)
        protocol.connection_made(_Transport())
        data, pos = b"".join(frames), 0
        while pos < len(data):
            target = protocol.get_buffer(-1)
            n = min(len(target), len(data) - pos)
            reads.append(n)
            target[:n] = data[pos:pos + n]
            protocol.buffer_updated(n)
            pos += n
        received = list(protocol._frames)
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    assert [bytes(r.body) for r in received] == [f[PRELUDE_BYTES:] for f in frames]
    assert [r.body_crc for r in received] == [crc32c(f[PRELUDE_BYTES:]) for f in frames]
    # the first read fills the small scratch; once grown, a read holds a whole frame and more
    assert reads[0] < len(frames[0]) < reads[1] and len(reads) <= len(frames) + 1


def test_small_compact_frames_get_crc_and_finiteness_in_one_pass_on_arrival():
    from libs.fnx2.wire.codec import PRELUDE, crc_of
    from libs.fnx2.wire.errors import ErrorCode, Fnx2Error
    from libs.fnx2.wire.tensor import DType

    good = encode_frame(batch(rows=(2, 3), dtype="bf16"), 0, compact_meta=True).to_bytes()
    fields = PRELUDE.unpack(good[:PRELUDE_BYTES])
    body = bytearray(good[PRELUDE_BYTES:])
    body[fields[5] + 2:fields[5] + 4] = (0x7F80).to_bytes(2, "little")  # +inf in row 0
    bad = PRELUDE.pack(*fields[:8], crc_of(bytes(body)), fields[9]) + bytes(body)
    plain = encode_frame(batch(rows=(2, 3), dtype="bf16"), 1).to_bytes()  # JSON metadata
    received = feed([good, bad, plain], [1 << 20])
    assert [r.finite for r in received] == [(DType.BF16, True), (DType.BF16, False), None]
    assert [r.body_crc for r in received] == [crc32c(f[PRELUDE_BYTES:]) for f in (good, bad, plain)]
    with pytest.raises(Fnx2Error) as info:
        decode_body(received[1].prelude, received[1].body, body_crc=received[1].body_crc,
                    finite=received[1].finite)
    assert info.value.code is ErrorCode.TENSOR_CONTRACT


@pytest.mark.parametrize("pieces", [[1 << 30], [65536 + 1], [7, 300_001, 1 << 20], [262_144]])
def test_checks_on_arrival_do_not_depend_on_how_the_bytes_arrive(pieces):
    from libs.fnx2.wire.tensor import DType

    third = "33333333-3333-4333-8333-333333333333"
    big = batch(Phase.PREFILL, rows=(300, 212, 100), requests=(REQ_A, REQ_B, third), width=1024,
                dtype="bf16")
    frame = encode_frame(big, 0, compact_meta=True).to_bytes()
    got = feed([frame], pieces)[0]
    assert got.body_crc == crc32c(frame[PRELUDE_BYTES:])
    assert got.finite == (DType.BF16, True)
    payload = frame[PRELUDE_BYTES + got.prelude.metadata_bytes:]
    assert [c for _, _, c in got.slice_crcs] == [crc32c(payload[s:e]) for s, e, _ in got.slice_crcs]


@pytest.mark.parametrize("compact_meta", [False, True])
def test_a_corrupted_piece_in_the_middle_of_a_large_payload_is_a_checksum_error(compact_meta):
    from libs.fnx2.wire.errors import ErrorCode, Fnx2Error

    big = batch(Phase.PREFILL, rows=(300, 212), requests=(REQ_A, REQ_B), width=1024, dtype="bf16")
    good = bytearray(encode_frame(big, 0, compact_meta=compact_meta).to_bytes())
    middle = len(good) // 2 + 3  # well inside the payload, after several whole pieces
    good[middle] ^= 0x10  # still a finite bf16: only the CRC can tell
    got = feed([bytes(good)], [65536 + 1, 1 << 20])[0]
    assert got.body_crc == crc32c(bytes(good[PRELUDE_BYTES:])) != got.prelude.crc32c
    with pytest.raises(Fnx2Error) as info:
        decode_body(got.prelude, got.body, body_crc=got.body_crc, finite=got.finite,
                    slice_crcs=got.slice_crcs)
    assert info.value.code is ErrorCode.CHECKSUM and info.value.terminal


@pytest.mark.parametrize("compact_meta", [False, True])
def test_a_non_finite_value_in_a_middle_piece_fails_even_when_later_pieces_are_finite(compact_meta):
    from libs.fnx2.wire.codec import PRELUDE, crc_of
    from libs.fnx2.wire.errors import ErrorCode, Fnx2Error
    from libs.fnx2.wire.tensor import DType

    big = batch(Phase.PREFILL, rows=(300, 212), requests=(REQ_A, REQ_B), width=1024, dtype="bf16")
    frame = bytearray(encode_frame(big, 0, compact_meta=compact_meta).to_bytes())
    fields = PRELUDE.unpack(bytes(frame[:PRELUDE_BYTES]))
    payload_start = PRELUDE_BYTES + fields[5]
    nan_at = payload_start + 2 * (400 * 1024 + 5)  # a NaN in the fourth 256 KiB piece of 1 MiB
    frame[nan_at:nan_at + 2] = (0x7FC1).to_bytes(2, "little")
    body = bytes(frame[PRELUDE_BYTES:])
    bad = PRELUDE.pack(*fields[:8], crc_of(body), fields[9]) + body
    got = feed([bad], [3, 1 << 20, 65536 + 1])[0]
    assert got.finite == (DType.BF16, False)
    assert got.body_crc == got.prelude.crc32c  # the CRC holds: the values are the problem
    with pytest.raises(Fnx2Error) as info:
        decode_body(got.prelude, got.body, body_crc=got.body_crc, finite=got.finite,
                    negotiated=None)
    assert info.value.code is ErrorCode.TENSOR_CONTRACT and not info.value.terminal


def test_a_stream_reader_body_is_checked_on_arrival_like_a_protocol_frame():
    """One read path: a frame read from a StreamReader reaches the decoder as the zero-copy
    protocol's small frames do, its CRC32C and (compact) finiteness already computed."""
    from libs.fnx2.channel.stream import StreamSource
    from libs.fnx2.wire.codec import PRELUDE, crc_of
    from libs.fnx2.wire.tensor import DType

    good = encode_frame(batch(rows=(2, 3), dtype="bf16"), 0, compact_meta=True).to_bytes()
    fields = PRELUDE.unpack(good[:PRELUDE_BYTES])
    body = bytearray(good[PRELUDE_BYTES:])
    body[fields[5]:fields[5] + 2] = (0x7FC0).to_bytes(2, "little")  # a NaN in row 0
    bad = PRELUDE.pack(*fields[:8], crc_of(bytes(body)), fields[9]) + bytes(body)
    plain = encode_frame(batch(rows=(2, 3), dtype="bf16"), 2).to_bytes()
    frames = [good, bad, plain]

    async def read_all():
        reader = asyncio.StreamReader()
        reader.feed_data(b"".join(frames))
        source = StreamSource(reader, DEFAULT_LIMITS)
        return [await source.read_frame() for _ in frames]

    from_stream = asyncio.run(read_all())
    from_protocol = feed(frames, [1 << 20])
    assert [(r.body_crc, r.finite) for r in from_stream] == [(r.body_crc, r.finite) for r in from_protocol]
    assert [r.finite for r in from_stream] == [(DType.BF16, True), (DType.BF16, False), None]
    assert [r.body_crc for r in from_stream] == [crc32c(f[PRELUDE_BYTES:]) for f in frames]
