"""Frame mutations for `fornax fuzz fnx2`: a pure core, no sockets and no clocks.

Each mutation starts from a valid seed frame (kind, metadata object, payload) and yields
the bytes of one frame for a given sequence number. Most mutations act on the JSON
value (a field of another JSON type, a removed or added key, a nested or oversized
value, a non-canonical spelling) and re-frame it with a valid CRC32C, so the decoder's
field checks are reached rather than the checksum. A few act on the prelude with
self-consistent lengths, so the receiver answers at once instead of waiting for bytes
that never come.

Seeds in the negotiated compact binary form (`libs.fnx2.wire.compact`) get binary mutations
instead: bytes flipped in the header or the record table, enum and length fields set to
any value, edge integers in the table, truncation, extension, payload changes; the
sequence number is kept in step and the CRC32C kept valid, so the compact checks are
reached.
"""

from __future__ import annotations

import copy
import json
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

from libs.fnx2.wire import compact
from libs.fnx2.wire.codec import MAGIC, PRELUDE
from libs.fnx2.wire.fields import canonical_json
from libs.fnx2.wire.messages import Kind
from libs.fnx2.wire.tensor import crc32c


class Mutation(IntEnum):
    RETYPE = 0          # one value becomes another JSON type
    DROP_KEY = 1
    ADD_KEY = 2
    NESTED = 3          # one value becomes a deep or wide container
    NUMBERS = 4         # edge integers and floats where numbers or strings sit
    NON_CANONICAL = 5   # same value, other spelling (spaces, exponent form, escapes)
    PRELUDE = 6         # magic, version, kind, flags, reserved, sequence or CRC
    PAYLOAD = 7         # payload bytes or length changed, CRC kept valid
    NONE = 8            # the seed itself (keeps valid traffic flowing)
    COMPACT = 9         # compact seeds only: binary header/table mutations


# Relative weights: JSON-level type changes dominate, as they reach the field checks.
_WEIGHTS = np.array([30, 8, 8, 8, 12, 8, 4, 6, 4], dtype=np.float64)
_CUMULATIVE = np.cumsum(_WEIGHTS / _WEIGHTS.sum())

# Where the compact headers hold sequence_no, and how long they are.
_COMPACT_SEQUENCE_AT = {Kind.BATCH: 28, Kind.RESULT: 24, Kind.CREDIT: 8}
_COMPACT_HEADER_BYTES = {Kind.BATCH: compact.BATCH_HEADER.size, Kind.RESULT: compact.RESULT_HEADER.size,
                         Kind.CREDIT: compact.CREDIT_RECORD.size}

_REPLACEMENTS: tuple[Any, ...] = (
    None, True, False, 0, -1, 1, 2**32, 2**64, 2**64 + 1, -(2**63), 1.5, -0.0, 1e16, 1e-7,
    "", "x", "prefill", "decode", "bf16", "int32", "activation", "token_ids", "ok",
    "sha256:" + "0" * 64, "00000000-0000-4000-8000-000000000000", "\u00e9", "a\\b",
    [], [0], [[2, 0]], ["a", "b"], [2, 0], [1, 2, 3], {}, {"a": 1}, {"code": [], "message": {}},
)


@dataclass(frozen=True, slots=True)
class Seed:
    """A valid frame to mutate: its kind, metadata without sequence_no, and payload;
    `compact`, when set, is its compact binary metadata (encoded at sequence_no 0)."""

    kind: int
    meta: dict[str, Any]
    payload: bytes = b""
    compact: bytes | None = None

    @property
    def json(self) -> str:
        return json.dumps(self.meta)


def frame(kind: int, metadata: bytes, payload: bytes, sequence_no: int, *, major: int = 2,
          minor: int = 0, flags: int = 0, reserved: int = 0, magic: bytes = MAGIC,
          crc: int | None = None) -> bytes:
    body_crc = crc32c(metadata + payload) if crc is None else crc
    return PRELUDE.pack(magic, major, minor, kind, flags, len(metadata), len(payload),
                        sequence_no, body_crc, reserved) + metadata + payload


class Mutator:
    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def choose(self) -> Mutation:
        return Mutation(min(int(np.searchsorted(_CUMULATIVE, self.rng.random(), side="right")),
                            len(_WEIGHTS) - 1))

    def mutate(self, seed: Seed, sequence_no: int, mutation: Mutation | None = None) -> bytes:
        if seed.compact is not None:
            return self._compact(seed, sequence_no, mutation)
        mutation = self.choose() if mutation is None else mutation
        if mutation is Mutation.PRELUDE:
            return self._prelude(seed, sequence_no)
        if mutation is Mutation.PAYLOAD:
            return self._payload(seed, sequence_no)
        if mutation is Mutation.NON_CANONICAL:
            return frame(seed.kind, self._respell(seed, sequence_no), seed.payload, sequence_no)
        meta = json.loads(seed.json)  # a deep copy, faster than copy.deepcopy
        meta["sequence_no"] = sequence_no
        if mutation is not Mutation.NONE:
            self._mutate_json(meta, mutation)
        try:
            metadata = canonical_json(meta)
        except (TypeError, ValueError, RecursionError):
            metadata = b"{}"
        return frame(seed.kind, metadata, seed.payload, sequence_no)

    # -- JSON-level ----------------------------------------------------------------------
    def _mutate_json(self, meta: dict[str, Any], mutation: Mutation) -> None:
        parent, key = self._pick(meta)
        if mutation is Mutation.DROP_KEY and isinstance(parent, dict):
            parent.pop(key, None)
        elif mutation is Mutation.ADD_KEY:
            target = parent[key] if isinstance(parent[key], dict) else meta
            target[self._choice(("x", "extra", "traceparent", "batches_received", "tensor"))] = (
                self._value())
        elif mutation is Mutation.NESTED:
            depth = int(self.rng.integers(1, 64))
            value: Any = self._value()
            for _ in range(depth):
                value = [value] if self.rng.integers(2) else {"k": value}
            parent[key] = value
        elif mutation is Mutation.NUMBERS:
            parent[key] = self._choice((0, -1, 2**31, 2**32 - 1, 2**32, 2**63, 2**64 - 1, 2**64,
                                        10**30, -(10**30), 0.0, 1e16, 1e300, 3.0))
        else:
            parent[key] = self._value()

    def _pick(self, meta: dict[str, Any]) -> tuple[Any, Any]:
        """A random (container, key) in the metadata tree, deeper ones as likely as shallow."""
        parent: Any = meta
        key: Any = self._choice(sorted(meta))
        while True:
            child = parent[key]
            if not isinstance(child, (dict, list)) or not child or self.rng.integers(3) == 0:
                return parent, key
            parent = child
            key = self._choice(sorted(child)) if isinstance(child, dict) else int(
                self.rng.integers(len(child)))

    def _value(self) -> Any:
        return copy.deepcopy(self._choice(_REPLACEMENTS))

    def _choice(self, options):
        return options[int(self.rng.integers(len(options)))]

    def _respell(self, seed: Seed, sequence_no: int) -> bytes:
        meta = dict(seed.meta, sequence_no=sequence_no)
        canonical = canonical_json(meta)
        choice = int(self.rng.integers(5))
        if choice == 0:  # standard library spacing
            return canonical.replace(b":", b": ", 1)
        if choice == 1:  # an exponent written without its sign: 1e16 instead of 1e+16
            return canonical.replace(b'"sequence_no":', b'"pad":1e16,"sequence_no":', 1)
        if choice == 2:  # a float that is canonical, where no float belongs
            return canonical.replace(b'"sequence_no":', b'"pad":1e+16,"sequence_no":', 1)
        if choice == 3:  # a needless escape
            return canonical.replace(b'"', b'"\\u0061', 1) if canonical.startswith(b'{"') else canonical
        return canonical.replace(b"}", b',"sequence_no":0}', 1)  # a duplicate key

    # -- compact binary metadata ---------------------------------------------------------
    def _compact(self, seed: Seed, sequence_no: int, mutation: Mutation | None) -> bytes:
        """One in eight frames unchanged, the rest mutated in the binary form."""
        assert seed.compact is not None  # only called for compact seeds
        meta = bytearray(seed.compact)
        at = _COMPACT_SEQUENCE_AT[seed.kind]
        meta[at:at + 8] = struct.pack("<Q", sequence_no)
        payload = bytearray(seed.payload)
        if mutation is None:
            mutation = Mutation.NONE if self.rng.integers(8) == 0 else Mutation.COMPACT
        if mutation is Mutation.COMPACT:
            meta, payload = self._compact_bytes(seed.kind, meta, payload)
        return frame(seed.kind, bytes(meta), bytes(payload), sequence_no)

    def _compact_bytes(self, kind: int, meta: bytearray,
                       payload: bytearray) -> tuple[bytearray, bytearray]:
        header = _COMPACT_HEADER_BYTES[kind]
        choice = int(self.rng.integers(7))
        if choice == 0:  # flip bytes anywhere in the metadata
            for pos in self.rng.integers(0, len(meta), int(self.rng.integers(1, 4))):
                meta[pos] ^= int(self.rng.integers(1, 256))
        elif choice == 1:  # an enum, flag, count or length byte of the header set to anything
            pos = int(self.rng.integers(4, min(header, 28)))
            meta[pos] = int(self.rng.choice([0, 1, 2, 3, 4, 5, 127, 128, 255]))
        elif choice == 2:  # truncated
            meta = meta[: int(self.rng.integers(0, len(meta)))]
        elif choice == 3:  # extended
            meta += bytes(self.rng.integers(0, 256, int(self.rng.integers(1, 80)), dtype=np.uint8))
        elif choice == 4 and len(meta) > header + 8:  # edge integers in the record table
            pos = int(self.rng.integers(header, len(meta) - 8))
            width = self._choice((1, 2, 4, 8))
            value = self._choice((0, 1, 2**(8 * width) - 1, 2**(8 * width - 1)))
            meta[pos:pos + width] = value.to_bytes(width, "little")
        elif choice == 5 and payload:  # NaN / Inf patterns in the payload
            for pos in self.rng.integers(0, len(payload), int(self.rng.integers(1, 8))):
                payload[pos] = int(self.rng.choice([0x7F, 0xFF, 0x80, 0xC0]))
        else:  # the payload shorter or longer than the header says
            cut = int(self.rng.integers(0, len(payload) + 16))
            payload = payload[:cut] + bytearray(max(0, cut - len(payload)))
        return meta, payload

    # -- frame-level ---------------------------------------------------------------------
    def _prelude(self, seed: Seed, sequence_no: int) -> bytes:
        metadata = canonical_json(dict(seed.meta, sequence_no=sequence_no))
        choice = int(self.rng.integers(7))
        if choice == 0:
            return frame(seed.kind, metadata, seed.payload, sequence_no, magic=b"FNX1")
        if choice == 1:
            return frame(seed.kind, metadata, seed.payload, sequence_no,
                         major=int(self.rng.integers(0, 4)), minor=int(self.rng.integers(1, 3)))
        if choice == 2:
            return frame(int(self.rng.choice([0, 9, 255])), metadata, seed.payload, sequence_no)
        if choice == 3:
            return frame(seed.kind, metadata, seed.payload, sequence_no, flags=1)
        if choice == 4:
            return frame(seed.kind, metadata, seed.payload, sequence_no, reserved=7)
        if choice == 5:
            return frame(seed.kind, metadata, seed.payload, sequence_no, crc=0xDEADBEEF)
        # a header announcing far more body than any credit admits; nothing follows
        head = frame(seed.kind, metadata, seed.payload, sequence_no)
        return head[:16] + struct.pack("!Q", 255 * 1024 * 1024) + head[24:40]

    def _payload(self, seed: Seed, sequence_no: int) -> bytes:
        metadata = canonical_json(dict(seed.meta, sequence_no=sequence_no))
        payload = bytearray(seed.payload)
        choice = int(self.rng.integers(3))
        if choice == 0 and payload:  # NaN / Inf patterns and random bytes
            for pos in self.rng.integers(0, len(payload), int(self.rng.integers(1, 8))):
                payload[pos] = int(self.rng.choice([0x7F, 0xFF, 0x80, 0xC0, int(self.rng.integers(256))]))
        elif choice == 1:  # shorter or longer than the descriptor says
            cut = int(self.rng.integers(0, len(payload) + 16))
            payload = payload[:cut] + bytes(max(0, cut - len(payload)))
        else:  # a payload on a kind that never carries one
            payload = bytearray(b"\0" * int(self.rng.integers(1, 64)))
        return frame(seed.kind, metadata, bytes(payload), sequence_no)
