"""Backends and element types, named once for every layer.

Both are string enums: a member equals its lower-case name ("numpy", "bf16"), which is also
how flags, environment variables, JSON and checkpoint configs spell it.
"""

from __future__ import annotations

from enum import StrEnum


class Backend(StrEnum):
    NUMPY = "numpy"
    MAX = "max"


class DType(StrEnum):
    INT32 = "int32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"


# What weights and stage-boundary activations may be stored as.
FLOAT_DTYPES = (DType.BF16, DType.FP16, DType.FP32)

# The activations a MAX stage's block-format weight products run in: "int8" (MAX's packed product,
# activations quantized per 32-block) or "float32" (Fornax's Mojo op, exact); the first is the default.
BLOCK_ACTIVATIONS = ("int8", "float32")
