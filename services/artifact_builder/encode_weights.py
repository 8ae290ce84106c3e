"""Tensors in the formats a weight policy chooses, written one at a time.

A tensor whose chosen format is its stored source format (a safetensors dtype, or a GGUF type) is
copied byte for byte; any other is read in bounded row chunks, decoded to float32 and encoded
(`libs.weights.codecs`), so builder memory stays a few chunks whatever the tensor's size. Rows are
independent in every format, so chunking by rows gives the same bytes as encoding the whole
tensor. A GGUF's kv_b_proj, composed of two stored tensors, is decoded and assembled whole.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from libs.artifacts.manifest import TensorFormat
from libs.artifacts.safetensors_format import PlannedTensor, copy_range
from libs.model.gguf_source import KV_B_COMPOSED, compose_kv_b
from libs.weights.codecs import decode, encode, quantizer_name, stored_dtype, stored_shape
from libs.weights.formats import BY_GGUF_TYPE, WeightFormat
from libs.weights.policy import SOURCE_POLICY, TensorChoice, choose, keep_stored
from services.artifact_builder.snapshot import SourceTensor
from services.artifact_builder.staging import OwnedTensor

# safetensors dtype of each format's stored array; block formats are raw bytes.
_STORED_DTYPE = {"fp32": "F32", "bf16": "BF16", "f16": "F16"}
CHUNK_ELEMENTS = 1 << 20  # float32 elements decoded at once: 4 MiB (a few such temporaries live at once)


@dataclass(frozen=True)
class EncodedTensor:
    owned: OwnedTensor
    choice: TensorChoice

    @property
    def fmt(self) -> WeightFormat:
        return self.choice.fmt

    @property
    def copied(self) -> bool:
        """The stored bytes are the source bytes (no conversion)."""
        source = self.owned.source
        return not source.parts and BY_GGUF_TYPE.get(source.dtype) == self.fmt

    def planned(self) -> PlannedTensor:
        shape = self.owned.source.shape
        return PlannedTensor(self.owned.name, _STORED_DTYPE.get(self.fmt.name, "U8"), stored_shape(self.fmt, shape))

    def nbytes(self) -> int:
        return self.fmt.nbytes(self.owned.source.shape) if self.fmt.is_block else (
            math.prod(self.owned.source.shape) * self.fmt.type_size)

    def record(self) -> TensorFormat:
        f = self.fmt
        return TensorFormat(
            format=f.name, logical_shape=self.owned.source.shape, block_size=f.block_size,
            scale_dtype=f.scale_dtype, source_dtype=self.owned.source.dtype,
            quantizer="source bytes" if self.copied else quantizer_name(f),
            wanted=self.choice.wanted, fallback=self.choice.fallback, conversion=self.choice.conversion,
        )


def choose_formats(tensors: tuple[OwnedTensor, ...], policy: str, layers: int,
                   backend: str = "numpy") -> tuple[EncodedTensor, ...]:
    """Each tensor's format under `policy` (SOURCE_POLICY: as stored), held as the stage's
    `backend` runs it."""
    if policy == SOURCE_POLICY:
        return tuple(EncodedTensor(t, _kept(t, backend)) for t in tensors)
    return tuple(EncodedTensor(t, choose(policy, t.name, t.source.shape, layers, backend)) for t in tensors)


def _kept(tensor: OwnedTensor, backend: str) -> TensorChoice:
    source = tensor.source
    stored = BY_GGUF_TYPE[source.dtype]
    why = ""
    if source.parts:
        k_b, v_b = source.parts
        why = (f"{KV_B_COMPOSED}: {k_b.name} ({k_b.dtype}) and {v_b.name} ({v_b.dtype}) decoded and "
               f"reassembled exactly, held as {stored.name}")
    return keep_stored(stored, tensor.name, source.shape, backend, why)


def write_tensor(src: BinaryIO, tensor: EncodedTensor, write: Callable[[bytes], object], chunk_bytes: int) -> None:
    source = tensor.owned.source
    if tensor.copied:
        copy_range(src, _Sink(write), source.offset, source.nbytes, chunk_bytes)
        return
    if source.parts:  # small (one layer's kv_b_proj): composed whole
        k_b, v_b = (read_rows(src, part, 0, math.prod(part.shape[:-1])).reshape(part.shape) for part in source.parts)
        write(np.ascontiguousarray(encode(compose_kv_b(k_b, v_b), tensor.fmt)).tobytes())
        return
    row_length = source.shape[-1]
    rows = math.prod(source.shape[:-1]) if len(source.shape) > 1 else 1
    step = max(1, CHUNK_ELEMENTS // max(row_length, 1))
    for first in range(0, rows, step):
        count = min(step, rows - first)
        write(np.ascontiguousarray(encode(read_rows(src, source, first, count), tensor.fmt)).tobytes())


def read_rows(src: BinaryIO, source: SourceTensor, first: int, count: int) -> np.ndarray:
    """float32 [count, row length] of rows first.. of a stored tensor (any format), decoded."""
    fmt, row_length = BY_GGUF_TYPE[source.dtype], source.shape[-1]
    row_bytes = fmt.row_bytes(row_length) if fmt.is_block else row_length * fmt.type_size
    src.seek(source.offset + first * row_bytes)
    raw = np.frombuffer(src.read(count * row_bytes), dtype=stored_dtype(fmt))
    stored = raw.reshape(count, -1)
    return np.asarray(decode(stored, fmt), dtype=np.float32).reshape(count, row_length)


class _Sink:
    def __init__(self, write: Callable[[bytes], object]) -> None:
        self.write = write
