"""Small builders for FNX2 unit tests: valid frames and re-framed mutations of them."""

from __future__ import annotations

import json
import struct
import uuid

import numpy as np

from libs.fnx2.wire.codec import PRELUDE, decode_frame, encode_frame
from libs.fnx2.wire.control import ChannelBinding
from libs.fnx2.wire.fields import canonical_json
from libs.fnx2.wire.leases import derive_execution_lease_id
from libs.fnx2.wire.messages import Batch, BatchDescriptor, Phase, SequenceSlice
from libs.fnx2.wire.tensor import Tensor, crc32c

PLAN_ID = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"
PLAN_HASH = "sha256:" + "b" * 64
MANIFEST_HASH = "sha256:" + "c" * 64
GENERATION = "99999999-9999-4999-8999-999999999999"
BINDING = ChannelBinding(PLAN_ID, PLAN_HASH, MANIFEST_HASH, "stage-1", GENERATION)
REQ_A = "11111111-1111-4111-8111-111111111111"
REQ_B = "22222222-2222-4222-8222-222222222222"
MINUTE_NS = 60 * 10**9


def lease(request_id: str, generation: str = GENERATION) -> str:
    return derive_execution_lease_id(generation, PLAN_ID, PLAN_HASH, request_id)


def batch(phase: Phase = Phase.PREFILL, rows: tuple[int, ...] = (2, 3), *,
          requests: tuple[str, ...] = (REQ_A, REQ_B), sequence_no: int = 0, position: int = 0,
          epoch: int = 0, budget_ns: int = MINUTE_NS, width: int = 4, seed: int = 0,
          dtype: str = "bf16", leases: tuple[str, ...] | None = None) -> Batch:
    slices, cursor = [], 0
    for i, (request_id, count) in enumerate(zip(requests, rows, strict=True)):
        lease_id = leases[i] if leases else lease(request_id)
        slices.append(SequenceSlice(request_id, sequence_no, cursor, count, position, epoch,
                                    budget_ns, lease_id, f"trace-{i}", f"span-{i}"))
        cursor += count
    values = np.random.default_rng(seed).standard_normal((cursor, width)).astype(np.float32)
    descriptor = BatchDescriptor(str(uuid.UUID(int=seed + 1, version=4)), 0, phase, cursor,
                                 tuple(slices))
    return Batch(PLAN_ID, PLAN_HASH, MANIFEST_HASH, "stage-0", "stage-1", descriptor,
                 Tensor.from_array("activation", dtype, values))


def frame_bytes(message, sequence_no: int = 0) -> bytes:
    return encode_frame(message, sequence_no).to_bytes()


def split(frame: bytes) -> tuple[tuple, dict, bytes]:
    fields = PRELUDE.unpack(frame[:40])
    meta_len = fields[5]
    return fields, json.loads(frame[40 : 40 + meta_len]), frame[40 + meta_len :]


def reframe(frame: bytes, meta: dict | bytes | None = None, payload: bytes | None = None,
            **prelude: int) -> bytes:
    """Rebuild a frame with replaced metadata/payload/prelude fields and a correct CRC."""
    fields, old_meta, old_payload = split(frame)
    meta_bytes = meta if isinstance(meta, bytes) else canonical_json(meta if meta is not None else old_meta)
    body_payload = old_payload if payload is None else payload
    names = ["magic", "major", "minor", "kind", "flags", "meta_len", "payload_len", "seq", "crc",
             "reserved"]
    values = dict(zip(names, fields, strict=True))
    values.update(meta_len=len(meta_bytes), payload_len=len(body_payload),
                  crc=crc32c(meta_bytes + body_payload) if meta_bytes + body_payload else 0)
    values.update(prelude)
    return struct.pack("!4sHHHHIQQII", *(values[n] for n in names)) + meta_bytes + body_payload


def roundtrip(message, sequence_no: int = 0):
    return decode_frame(frame_bytes(message, sequence_no)).message
