"""Tensors in the formats a weight policy chooses, written one at a time.

A tensor whose chosen format is its stored source dtype is copied byte for byte; any other is
read in bounded row chunks, decoded to float32 and encoded (`libs.weights.codecs`), so builder
memory stays a few chunks whatever the tensor's size. Rows are independent in every format,
so chunking by rows gives the same bytes as encoding the whole tensor.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from libs.artifacts.manifest import TensorFormat
from libs.artifacts.safetensors_format import PlannedTensor, copy_range
from libs.model.safetensors_io import bf16_bits_to_float32
from libs.weights.codecs import encode, quantizer_name, stored_shape
from libs.weights.formats import WeightFormat
from libs.weights.policy import TensorChoice, choose
from services.artifact_builder.staging import OwnedTensor

# safetensors dtype of each format's stored array; block formats are raw bytes.
_STORED_DTYPE = {"fp32": "F32", "bf16": "BF16", "f16": "F16"}
_SOURCE_FORMAT = {"F32": "fp32", "BF16": "bf16", "F16": "f16"}
_SOURCE_NUMPY = {"F32": np.float32, "BF16": np.uint16, "F16": np.float16}
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
        return _SOURCE_FORMAT.get(self.owned.source.dtype) == self.fmt.name

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
    """Each tensor's format under `policy`, held as the stage's `backend` runs it."""
    return tuple(EncodedTensor(t, choose(policy, t.name, t.source.shape, layers, backend)) for t in tensors)


def write_tensor(src: BinaryIO, tensor: EncodedTensor, write: Callable[[bytes], object], chunk_bytes: int) -> None:
    source = tensor.owned.source
    if tensor.copied:
        copy_range(src, _Sink(write), source.offset, source.nbytes, chunk_bytes)
        return
    row_length = source.shape[-1]
    rows = math.prod(source.shape[:-1]) if len(source.shape) > 1 else 1
    item = np.dtype(_SOURCE_NUMPY[source.dtype]).itemsize
    step = max(1, CHUNK_ELEMENTS // max(row_length, 1))
    for first in range(0, rows, step):
        count = min(step, rows - first)
        src.seek(source.offset + first * row_length * item)
        raw = np.frombuffer(src.read(count * row_length * item), dtype=_SOURCE_NUMPY[source.dtype])
        values = bf16_bits_to_float32(raw) if source.dtype == "BF16" else raw.astype(np.float32)
        write(np.ascontiguousarray(encode(values.reshape(count, row_length), tensor.fmt)).tobytes())


class _Sink:
    def __init__(self, write: Callable[[bytes], object]) -> None:
        self.write = write
