"""The safetensors file layout, read and written without loading tensor data.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON (tensor name ->
dtype, shape, [begin, end) offsets relative to the data section), then the data section.
Readers here parse only the header; writers emit a deterministic header so that identical
inputs give byte-identical files.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO, Protocol

from libs.artifacts.errors import SafetensorsHeaderError, SafetensorsTruncatedError

DTYPE_SIZES_BYTES: dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}
HEADER_LENGTH_BYTES = 8
# A header beyond this is not a plausible checkpoint; refuse it before allocating.
MAX_HEADER_BYTES = 100 * 1024 * 1024
# Headers are padded with spaces to this alignment, as the reference writer does.
HEADER_ALIGNMENT_BYTES = 8
METADATA_KEY = "__metadata__"


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors file; offsets are relative to the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data_begin: int
    data_end: int

    @property
    def nbytes(self) -> int:
        return self.data_end - self.data_begin


@dataclass(frozen=True)
class SafetensorsHeader:
    """The parsed header of one file; `data_start` is the absolute offset of the data section."""

    data_start: int
    file_size_bytes: int
    tensors: tuple[TensorEntry, ...]
    metadata: tuple[tuple[str, str], ...]

    def by_name(self) -> dict[str, TensorEntry]:
        return {t.name: t for t in self.tensors}


def tensor_nbytes(dtype: str, shape: Iterable[int]) -> int:
    if dtype not in DTYPE_SIZES_BYTES:
        raise SafetensorsHeaderError(f"unknown dtype {dtype!r}")
    return DTYPE_SIZES_BYTES[dtype] * math.prod(shape)


def read_header(path: str | os.PathLike[str]) -> SafetensorsHeader:
    """Parse the header of `path` and check that its offsets tile the data section exactly."""
    file_size = os.path.getsize(path)
    with open(path, "rb") as fh:
        raw_len = fh.read(HEADER_LENGTH_BYTES)
        if len(raw_len) != HEADER_LENGTH_BYTES:
            raise SafetensorsTruncatedError(f"{path}: shorter than the 8-byte header length")
        (header_len,) = struct.unpack("<Q", raw_len)
        if header_len > MAX_HEADER_BYTES:
            raise SafetensorsHeaderError(f"{path}: header length {header_len} is implausible")
        raw_header = fh.read(header_len)
    if len(raw_header) != header_len:
        raise SafetensorsTruncatedError(f"{path}: header cut short ({len(raw_header)}/{header_len})")
    try:
        document = json.loads(raw_header.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SafetensorsHeaderError(f"{path}: header is not JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise SafetensorsHeaderError(f"{path}: header is not a JSON object")
    data_start = HEADER_LENGTH_BYTES + header_len
    tensors = _parse_entries(str(path), document)
    _check_tiling(str(path), tensors, file_size - data_start)
    metadata = document.get(METADATA_KEY) or {}
    if not isinstance(metadata, dict):
        raise SafetensorsHeaderError(f"{path}: {METADATA_KEY} is not an object")
    return SafetensorsHeader(
        data_start=data_start,
        file_size_bytes=file_size,
        tensors=tensors,
        metadata=tuple(sorted((str(k), str(v)) for k, v in metadata.items())),
    )


def _parse_entries(path: str, document: dict) -> tuple[TensorEntry, ...]:
    entries = []
    for name, info in document.items():
        if name == METADATA_KEY:
            continue
        try:
            dtype = str(info["dtype"])
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SafetensorsHeaderError(f"{path}: tensor {name!r} has a malformed entry") from exc
        if any(d < 0 for d in shape) or begin < 0 or end < begin:
            raise SafetensorsHeaderError(f"{path}: tensor {name!r} has negative extents")
        if end - begin != tensor_nbytes(dtype, shape):
            raise SafetensorsHeaderError(
                f"{path}: tensor {name!r} spans {end - begin} bytes, "
                f"{dtype}{list(shape)} needs {tensor_nbytes(dtype, shape)}"
            )
        entries.append(TensorEntry(name, dtype, shape, begin, end))
    return tuple(sorted(entries, key=lambda t: (t.data_begin, t.name)))


def _check_tiling(path: str, tensors: tuple[TensorEntry, ...], data_bytes: int) -> None:
    cursor = 0
    for entry in tensors:
        if entry.data_begin != cursor:
            raise SafetensorsHeaderError(
                f"{path}: tensor {entry.name!r} starts at {entry.data_begin}, expected {cursor}"
            )
        cursor = entry.data_end
    if data_bytes < cursor:
        raise SafetensorsTruncatedError(
            f"{path}: data section holds {max(data_bytes, 0)} bytes, header needs {cursor}"
        )
    if data_bytes > cursor:
        raise SafetensorsHeaderError(f"{path}: {data_bytes - cursor} trailing bytes after the data")


@dataclass(frozen=True)
class PlannedTensor:
    """A tensor to be written: its output name, dtype and shape, in file order."""

    name: str
    dtype: str
    shape: tuple[int, ...]


def layout_tensors(planned: Iterable[PlannedTensor]) -> tuple[TensorEntry, ...]:
    """Assign contiguous data offsets in the given order."""
    cursor = 0
    entries = []
    for tensor in planned:
        nbytes = tensor_nbytes(tensor.dtype, tensor.shape)
        entries.append(TensorEntry(tensor.name, tensor.dtype, tensor.shape, cursor, cursor + nbytes))
        cursor += nbytes
    return tuple(entries)


def encode_header(entries: Iterable[TensorEntry], metadata: dict[str, str]) -> bytes:
    """The length prefix plus the JSON header, sorted keys, compact, space-padded to 8 bytes."""
    document: dict[str, object] = {
        e.name: {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": [e.data_begin, e.data_end]}
        for e in entries
    }
    if metadata:
        document[METADATA_KEY] = dict(metadata)
    body = json.dumps(document, sort_keys=True, separators=(",", ":")).encode("utf-8")
    pad = (-len(body)) % HEADER_ALIGNMENT_BYTES
    body += b" " * pad
    return struct.pack("<Q", len(body)) + body


class ByteSink(Protocol):
    def write(self, chunk: bytes, /) -> object: ...


def copy_range(src: BinaryIO, dst: ByteSink, offset: int, nbytes: int, chunk_bytes: int, sink=None) -> None:
    """Copy `nbytes` from absolute `offset` of `src` to the current position of `dst`.

    Reads at most `chunk_bytes` at a time so memory stays bounded; `sink(chunk)` sees every
    chunk (used to hash while copying).
    """
    src.seek(offset)
    remaining = nbytes
    while remaining:
        chunk = src.read(min(chunk_bytes, remaining))
        if not chunk:
            raise SafetensorsTruncatedError(f"source ended {remaining} bytes early at offset {offset}")
        dst.write(chunk)
        if sink is not None:
            sink(chunk)
        remaining -= len(chunk)
