"""Typed tensors for FNX2 payloads: numpy views, little-endian, row-major.

bf16 has no numpy dtype here, so it is stored as uint16 bit patterns and converted
with vectorised bit arithmetic. Finiteness checks look at exponent bits through an
integer view, fused with the CRC32C pass over the same cache-sized chunks, so the
payload is read from memory once per direction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from libs.common.kinds import FLOAT_DTYPES as _FLOAT_DTYPES
from libs.common.kinds import DType
from libs.fnx2.wire.crc import crc32c_extend
from libs.fnx2.wire.errors import ErrorCode, Fnx2Error
from libs.fnx2.wire.fields import member

LAYOUT = "contiguous_row_major"
UINT32_MAX = (1 << 32) - 1
_CHUNK_BYTES = 1024 * 1024  # large enough that per-chunk Python overhead stays small


class TensorKind(StrEnum):
    TOKEN_IDS = "token_ids"
    ACTIVATION = "activation"
    LOGITS = "logits"


STORAGE: dict[DType, np.dtype] = {
    DType.INT32: np.dtype("<i4"),
    DType.BF16: np.dtype("<u2"),
    DType.FP16: np.dtype("<f2"),
    DType.FP32: np.dtype("<f4"),
}
# A float is non-finite iff its exponent bits are all ones. Seen as a signed integer,
# positive non-finite values are >= POS; seen as unsigned, negative ones are >= NEG.
# Two max-reductions, no temporaries, decide finiteness for a whole chunk.
_FINITE_LIMITS: dict[DType, tuple[np.dtype, int, np.dtype, int]] = {
    DType.BF16: (np.dtype("<i2"), 0x7F80, np.dtype("<u2"), 0xFF80),
    DType.FP16: (np.dtype("<i2"), 0x7C00, np.dtype("<u2"), 0xFC00),
    DType.FP32: (np.dtype("<i4"), 0x7F800000, np.dtype("<u4"), 0xFF800000),
}
FLOAT_DTYPES = frozenset(_FLOAT_DTYPES)


def _tensor_error(message: str) -> Fnx2Error:
    return Fnx2Error(ErrorCode.TENSOR_CONTRACT, message)


@dataclass(frozen=True, slots=True)
class TensorDescriptor:
    kind: TensorKind
    dtype: DType
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.kind is TensorKind.TOKEN_IDS:
            if self.dtype is not DType.INT32 or len(self.shape) != 1:
                raise _tensor_error("token_ids must be int32 with rank 1")
        elif self.dtype not in FLOAT_DTYPES or len(self.shape) != 2:
            raise _tensor_error(f"{self.kind.value} must be bf16/fp16/fp32 with rank 2")
        for dim in self.shape:
            if type(dim) is not int or dim <= 0 or dim > UINT32_MAX:
                raise _tensor_error("tensor dimensions must be positive uint32")

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def width(self) -> int:
        return 1 if len(self.shape) == 1 else self.shape[1]

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def payload_bytes(self) -> int:
        return self.elements * STORAGE[self.dtype].itemsize

    @property
    def row_bytes(self) -> int:
        return self.width * STORAGE[self.dtype].itemsize

    def with_rows(self, rows: int) -> TensorDescriptor:
        shape = (rows,) if len(self.shape) == 1 else (rows, self.shape[1])
        return TensorDescriptor(self.kind, self.dtype, shape)

    def to_meta(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "dtype": self.dtype.value,
            "shape": list(self.shape),
            "layout": LAYOUT,
            "logical_elements": self.elements,
            "payload_bytes": self.payload_bytes,
        }

    @classmethod
    def from_meta(cls, meta: Any) -> TensorDescriptor:
        fields = ("kind", "dtype", "shape", "layout", "logical_elements", "payload_bytes")
        if type(meta) is not dict or set(meta) != set(fields):
            raise _tensor_error("tensor descriptor must have exactly " + ",".join(fields))
        kind, dtype = member(TensorKind, meta["kind"]), member(DType, meta["dtype"])
        if kind is None or dtype is None:
            raise _tensor_error("unknown tensor kind or dtype")
        shape = meta["shape"]
        if type(shape) is not list or len(shape) > 2:
            raise _tensor_error("tensor shape must be an array of rank 1 or 2")
        if meta["layout"] != LAYOUT:
            raise _tensor_error("only contiguous_row_major layout is supported")
        descriptor = cls(kind, dtype, tuple(shape))
        if meta["logical_elements"] != descriptor.elements or type(meta["logical_elements"]) is not int:
            raise _tensor_error("logical_elements does not match shape")
        if meta["payload_bytes"] != descriptor.payload_bytes or type(meta["payload_bytes"]) is not int:
            raise _tensor_error("payload_bytes does not match shape and dtype")
        return descriptor


@dataclass(frozen=True, slots=True)
class Tensor:
    """A validated tensor: descriptor plus a read-only numpy array in storage dtype."""

    descriptor: TensorDescriptor
    array: np.ndarray

    @classmethod
    def from_array(cls, kind: TensorKind | str, dtype: DType | str, array: np.ndarray) -> Tensor:
        """Wrap (without copying when already in storage layout) and check finiteness.

        For bf16, float32 input is rounded to nearest-even; uint16 input is taken as bits.
        """
        kind, dtype = TensorKind(kind), DType(dtype)
        if dtype is DType.BF16 and array.dtype != np.uint16:
            array = float32_to_bf16(np.asarray(array, dtype=np.float32))
        storage = np.ascontiguousarray(array, dtype=STORAGE[dtype])
        descriptor = TensorDescriptor(kind, dtype, tuple(int(d) for d in storage.shape))
        if not is_finite(storage, dtype):
            raise _tensor_error("tensor values must be finite")
        view = storage.view()
        view.flags.writeable = False
        return cls(descriptor, view)

    def payload(self) -> memoryview:
        return self.array.reshape(-1).view(np.uint8).data

    def rows(self, start: int, count: int) -> np.ndarray:
        return self.array[start : start + count]

    def to_float32(self) -> np.ndarray:
        if self.descriptor.dtype is DType.BF16:
            return bf16_to_float32(self.array)
        return self.array.astype(np.float32)


def float32_to_bf16(values: np.ndarray) -> np.ndarray:
    """Round float32 to bf16 bit patterns, nearest-even, vectorised."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def boundary_payload(hidden: np.ndarray, dtype: DType) -> np.ndarray:
    """A stage's float32 hidden rows in a hop's storage dtype, as the stage worker packs them
    (bf16: bit patterns, rounded to nearest-even; fp16: numpy's rounding; fp32: unchanged)."""
    if dtype is DType.BF16:
        return float32_to_bf16(hidden)
    return np.ascontiguousarray(hidden, dtype=np.float16 if dtype is DType.FP16 else np.float32)


def through_hop(hidden: np.ndarray, dtype: DType) -> np.ndarray:
    """What the next stage receives of `hidden` over a hop of `dtype`, as float32: the sender's
    `boundary_payload`, then the receiver's `Tensor.to_float32` (fp32 returns the same values)."""
    return Tensor.from_array(TensorKind.ACTIVATION, dtype, boundary_payload(hidden, dtype)).to_float32()


def is_finite(array: np.ndarray, dtype: DType) -> bool:
    if dtype is DType.INT32 or array.size == 0:
        return True
    return _finite_bytes(np.ascontiguousarray(array).reshape(-1).view(np.uint8), dtype)


_max = np.maximum.reduce  # the ufunc itself: `ndarray.max` adds a Python-level wrapper


def _finite_bytes(raw: np.ndarray, dtype: DType) -> bool:
    signed, pos_limit, unsigned, neg_limit = _FINITE_LIMITS[dtype]
    if raw.size % signed.itemsize:
        return False
    return bool(_max(raw.view(signed)) < pos_limit and _max(raw.view(unsigned)) < neg_limit)


def payload_is_finite(payload: memoryview, dtype: DType) -> bool:
    """Finiteness of raw little-endian payload bytes (two max-reductions per chunk)."""
    raw = np.frombuffer(payload, dtype=np.uint8)
    if dtype is DType.INT32:
        return True
    if raw.size % _FINITE_LIMITS[dtype][0].itemsize:
        return False
    return all(_finite_bytes(raw[start : start + _CHUNK_BYTES], dtype)
               for start in range(0, raw.size, _CHUNK_BYTES))


def crc_and_finite(crc: int, payload: memoryview, dtype: DType | None) -> tuple[int, bool]:
    """Extend a CRC32C over payload and, for a float dtype, check finiteness on the same
    cache-sized chunks, so the payload streams from memory once."""
    if dtype is None or dtype is DType.INT32:
        return crc32c_extend(crc, payload), True
    raw = np.frombuffer(payload, dtype=np.uint8)
    finite = raw.size % _FINITE_LIMITS[dtype][0].itemsize == 0
    for start in range(0, raw.size, _CHUNK_BYTES):
        chunk = raw[start : start + _CHUNK_BYTES]
        crc = crc32c_extend(crc, chunk)
        finite = finite and _finite_bytes(chunk, dtype)
    return crc, finite


def crc32c(data: bytes | memoryview | np.ndarray) -> int:
    """CRC32C of a C-contiguous buffer."""
    return crc32c_extend(0, data)


def view_payload(descriptor: TensorDescriptor, payload: memoryview) -> np.ndarray:
    """A zero-copy read-only numpy view of a received payload."""
    array = np.frombuffer(payload, dtype=STORAGE[descriptor.dtype]).reshape(descriptor.shape)
    array.flags.writeable = False
    return array
