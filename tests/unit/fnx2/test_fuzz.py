"""Feed 100,000+ mutated frames to the decoder: only Fnx2Error, no hang, bounded memory."""

import resource

import numpy as np
import pytest

from libs.fnx2.wire.codec import CodecLimits, decode_frame
from libs.fnx2.wire.control import Control, Credit
from libs.fnx2.wire.errors import Fnx2Error
from libs.fnx2.wire.messages import Phase
from tests.unit.fnx2.factories import BINDING, batch, frame_bytes, reframe
from tests.unit.fnx2.test_codec_errors import _result

FRAMES = 100_000
LIMITS = CodecLimits(max_payload_bytes=1 << 20)


def seeds() -> list[bytes]:
    return [
        frame_bytes(batch(), 1),
        frame_bytes(batch(Phase.DECODE, rows=(1, 1), dtype="fp16"), 2),
        frame_bytes(_result(), 3),
        frame_bytes(Credit(1, 2, 3, 4, 5, 6, 7), 4),
        frame_bytes(Control("hello", "dddddddd-dddd-4ddd-8ddd-dddddddddddd", BINDING, ((2, 0),)), 5),
    ]


def mutate(rng: np.random.Generator, frame: bytes, choice: int) -> bytes:
    data = bytearray(frame)
    if choice == 0:  # flip bytes anywhere (usually caught by prelude checks or CRC)
        for pos in rng.integers(0, len(data), int(rng.integers(1, 4))):
            data[pos] ^= int(rng.integers(1, 256))
        return bytes(data)
    if choice == 1:  # truncate or extend
        cut = int(rng.integers(0, len(data) + 8))
        return bytes(data[:cut]) + bytes(max(0, cut - len(data)))
    if choice == 2:  # corrupt the metadata or payload length in the prelude
        start, end = (12, 16) if rng.integers(2) else (16, 24)
        data[start:end] = rng.integers(0, 256, end - start, dtype=np.uint8).tobytes()
        return bytes(data)
    # mutate metadata bytes and fix the CRC so the parser and the field checks are reached
    meta_len = int.from_bytes(frame[12:16], "big")
    meta = bytearray(frame[40 : 40 + meta_len])
    for pos in rng.integers(0, len(meta), int(rng.integers(1, 3))):
        meta[pos] = int(rng.choice(np.frombuffer(b'{}[]",:0123456789-aezfnulltrue\\ ', np.uint8)))
    return reframe(frame, meta=bytes(meta))


@pytest.mark.timeout(120)
def test_decoder_survives_100k_mutated_frames():
    rng = np.random.default_rng(20261130)
    base = seeds()
    start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    outcomes = {"ok": 0, "error": 0}
    codes: set[str] = set()
    for i in range(FRAMES):
        frame = mutate(rng, base[i % len(base)], int(rng.integers(0, 4)))
        try:
            decode_frame(frame, LIMITS)
            outcomes["ok"] += 1
        except Fnx2Error as exc:
            outcomes["error"] += 1
            codes.add(exc.code.value)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start_rss
    assert outcomes["ok"] + outcomes["error"] == FRAMES
    assert outcomes["error"] > FRAMES // 2
    assert {"ABI_VERSION", "FRAME_SIZE", "CHECKSUM", "METADATA", "BATCH_CONTRACT",
            "TENSOR_CONTRACT", "BATCH_RESULT", "SEQUENCE"} <= codes
    assert grown_kib < 200 * 1024
