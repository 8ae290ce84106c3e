"""Safetensors reading and writing in numpy, including bf16 (which numpy lacks).

Format: 8-byte little-endian header length, a JSON header mapping each tensor name to
{dtype, shape, data_offsets} relative to the data section, then the data section.
Writing streams tensor by tensor, so a shard never has to be held in memory whole.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from libs.model.errors import CheckpointError

_NUMPY_DTYPES = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64, "U8": np.uint8}
_CHUNK_ELEMENTS = 1 << 22
_ITEM_BYTES = {"BF16": 2, "F32": 4, "F16": 2, "I32": 4, "I64": 8, "U8": 1}


@dataclass(frozen=True)
class HeaderEntry:
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def float32_to_bf16_bits(array: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bf16 bit patterns (uint16)."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    return ((bits + rounding) >> 16).astype(np.uint16)


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def read_header(path: Path) -> tuple[dict[str, HeaderEntry], int]:
    """Header entries and the absolute byte offset of the data section."""
    entries, start, _ = read_header_and_metadata(path)
    return entries, start


def read_header_and_metadata(path: Path) -> tuple[dict[str, HeaderEntry], int, dict[str, str]]:
    """Header entries, the absolute offset of the data section, and the `__metadata__` strings."""
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise CheckpointError(f"cannot open checkpoint shard {path}: {exc}") from exc
    with handle:
        raw_len = handle.read(8)
        if len(raw_len) != 8:
            raise CheckpointError(f"{path} is not a safetensors file (too short)")
        (length,) = struct.unpack("<Q", raw_len)
        try:
            header = json.loads(handle.read(length))
            entries = {
                name: HeaderEntry(meta["dtype"], tuple(meta["shape"]), *meta["data_offsets"])
                for name, meta in header.items()
                if name != "__metadata__"
            }
            metadata = {str(k): str(v) for k, v in (header.get("__metadata__") or {}).items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{path} has a corrupt safetensors header: {exc}") from exc
    return entries, 8 + length, metadata


def map_tensor(path: Path, name: str, entries: dict[str, HeaderEntry], data_start: int) -> np.ndarray:
    """A private (copy-on-write) map of one tensor's stored array: no copy, the page cache is shared.

    The file is never written through it. It is mapped copy-on-write rather than read-only
    because a runtime that must not see its weights change under it copies a read-only array
    whole (MAX's `Buffer.from_numpy` does: a read-only map cost a stage its weights again in
    anonymous memory), while a writable one it aliases. Nothing writes weights, so the pages stay
    the page cache's: file-backed, shared and reclaimable."""
    entry = entries.get(name)
    if entry is None:
        raise CheckpointError(f"{path.name} lacks tensor {name}")
    if entry.dtype not in _ITEM_BYTES:
        raise CheckpointError(f"tensor {name}: dtype {entry.dtype} is not supported")
    dtype = np.uint16 if entry.dtype == "BF16" else _NUMPY_DTYPES[entry.dtype]
    count = int(np.prod(entry.shape, dtype=np.int64))
    if entry.end - entry.begin != count * _ITEM_BYTES[entry.dtype]:
        raise CheckpointError(f"tensor {name}: dtype {entry.dtype} / byte size {entry.end - entry.begin} inconsistent")
    return np.memmap(path, dtype=dtype, mode="c", offset=data_start + entry.begin, shape=entry.shape)


def file_offset(mapped: np.memmap) -> int:
    """Where the first byte of a map (or of a slice of one) lies in its file."""
    granularity_start = mapped.offset - mapped.offset % mmap.ALLOCATIONGRANULARITY
    mapping_base = np.frombuffer(mapped._mmap, dtype=np.uint8).ctypes.data  # type: ignore[attr-defined]
    return granularity_start + mapped.ctypes.data - mapping_base


def joined_rows(first: np.ndarray, second: np.ndarray) -> np.ndarray | None:
    """`first`'s rows then `second`'s as one copy-on-write map, without copying, when both are
    maps of one file that lie back to back in it (a stage artifact stores an expert's gate rows
    right before its up rows); None otherwise."""
    if not (isinstance(first, np.memmap) and isinstance(second, np.memmap)):
        return None
    if getattr(first, "_mmap", None) is None or getattr(second, "_mmap", None) is None:
        return None
    if first.filename is None or first.filename != second.filename or first.dtype != second.dtype:
        return None
    if first.ndim != 2 or first.shape[1:] != second.shape[1:]:
        return None
    if not (first.flags.c_contiguous and second.flags.c_contiguous):
        return None
    start = file_offset(first)
    if start + first.nbytes != file_offset(second):
        return None
    return np.memmap(first.filename, dtype=first.dtype, mode="c", offset=start,
                     shape=(first.shape[0] + second.shape[0], *first.shape[1:]))


def read_tensors_float32(path: Path, names: Iterable[str]) -> dict[str, np.ndarray]:
    entries, data_start = read_header(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    out: dict[str, np.ndarray] = {}
    for name in names:
        entry = entries.get(name)
        if entry is None:
            raise CheckpointError(f"{path.name} lacks tensor {name}")
        blob = mapped[data_start + entry.begin : data_start + entry.end]
        out[name] = _decode(entry, blob, name)
    return out


def _decode(entry: HeaderEntry, blob: np.ndarray, name: str) -> np.ndarray:
    count = int(np.prod(entry.shape, dtype=np.int64))
    if entry.dtype not in _ITEM_BYTES or blob.size != count * _ITEM_BYTES[entry.dtype]:
        raise CheckpointError(f"tensor {name}: dtype {entry.dtype} / byte size {blob.size} inconsistent")
    if entry.dtype == "BF16":
        values = bf16_bits_to_float32(blob.view(np.uint16))
    else:
        values = blob.view(_NUMPY_DTYPES[entry.dtype]).astype(np.float32)
    return np.ascontiguousarray(values.reshape(entry.shape))


class SafetensorsWriter:
    """Writes one safetensors file whose tensor list (names, dtypes, shapes) is known upfront."""

    def __init__(self, path: Path, specs: list[tuple[str, str, tuple[int, ...]]], metadata: dict[str, str]):
        header: dict[str, object] = {"__metadata__": metadata}
        offset = 0
        for name, dtype, shape in specs:
            size = int(np.prod(shape, dtype=np.int64)) * _ITEM_BYTES[dtype]
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
            offset += size
        encoded = json.dumps(header, separators=(",", ":")).encode()
        encoded += b" " * (-len(encoded) % 8)  # keep the data section 8-byte aligned
        self._expected = [(name, dtype, tuple(shape)) for name, dtype, shape in specs]
        self._position = 0
        self._handle = open(path, "wb")
        self._handle.write(struct.pack("<Q", len(encoded)) + encoded)

    def write(self, name: str, array: np.ndarray) -> None:
        exp_name, dtype, shape = self._expected[self._position]
        if name != exp_name or tuple(array.shape) != shape:
            raise ValueError(f"writer expected {exp_name}{shape}, got {name}{tuple(array.shape)}")
        flat = np.ascontiguousarray(array).reshape(-1)
        for start in range(0, max(flat.size, 1), _CHUNK_ELEMENTS):  # bounded conversion temporaries
            part = flat[start : start + _CHUNK_ELEMENTS]
            data = float32_to_bf16_bits(part) if dtype == "BF16" else part.astype(_NUMPY_DTYPES[dtype])
            self._handle.write(data.tobytes())
        self._position += 1

    def close(self) -> None:
        if self._position != len(self._expected):
            self._handle.close()
            raise ValueError(f"writer closed after {self._position} of {len(self._expected)} tensors")
        self._handle.close()
