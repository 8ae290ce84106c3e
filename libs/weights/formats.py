"""The weight formats a stage can hold, in GGUF's block layouts byte for byte.

A block format stores each row of an [out, in] weight as `in / block_size` blocks of
`type_size` bytes; a row whose length is not a multiple of the block cannot use the format.
Float formats have a block of one element. Names are the ones users know from llama.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from libs.weights.errors import UnknownWeightFormatError


@dataclass(frozen=True)
class WeightFormat:
    name: str           # "fp32", "bf16", "q4_k", ...
    gguf_type: str      # the GGMLQuantizationType name: "F32", "BF16", "Q4_K", ...
    block_size: int     # elements per block (1 for float formats)
    type_size: int      # bytes per block
    scale_dtype: str    # dtype of the block scales ("none" for float formats)
    bits_per_weight: float

    @property
    def is_block(self) -> bool:
        return self.block_size > 1

    def fits(self, row_length: int) -> bool:
        return row_length % self.block_size == 0

    def row_bytes(self, row_length: int) -> int:
        return row_length // self.block_size * self.type_size

    def nbytes(self, shape: tuple[int, ...]) -> int:
        rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
        return rows * self.row_bytes(shape[-1])


def _fmt(name: str, gguf_type: str, block: int, size: int, scale: str) -> WeightFormat:
    return WeightFormat(name, gguf_type, block, size, scale, round(8 * size / block, 4))


FORMATS: dict[str, WeightFormat] = {f.name: f for f in (
    _fmt("fp32", "F32", 1, 4, "none"),
    _fmt("bf16", "BF16", 1, 2, "none"),
    _fmt("f16", "F16", 1, 2, "none"),
    _fmt("q8_0", "Q8_0", 32, 34, "f16"),
    _fmt("q5_0", "Q5_0", 32, 22, "f16"),
    _fmt("q5_1", "Q5_1", 32, 24, "f16"),
    _fmt("q4_0", "Q4_0", 32, 18, "f16"),
    _fmt("q4_k", "Q4_K", 256, 144, "f16 super-block, 6-bit sub-block"),
    _fmt("q6_k", "Q6_K", 256, 210, "f16 super-block, int8 sub-block"),
)}
BY_GGUF_TYPE: dict[str, WeightFormat] = {f.gguf_type: f for f in FORMATS.values()}


def weight_format(name: str) -> WeightFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise UnknownWeightFormatError(f"unknown weight format {name!r}; known: {', '.join(FORMATS)}") from None
