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
DEFAULT_BLOCK_ACTIVATIONS = BLOCK_ACTIVATIONS[0]


def block_activations_refusal(value: str, backend: str | None = None) -> tuple[str, str] | None:
    """Why `value` cannot be a stage's block-format activations: (stable reason code, message), or
    None when it can ("" = not set: nothing to refuse). A mode MAX does not run is
    MAX_ACTIVATIONS_UNSUPPORTED; a mode on a stage of another backend than max (when `backend`
    is known) is MAX_ACTIVATIONS_BACKEND: a numpy stage has no block-format products, so the
    value is refused, never ignored. Each caller raises it as its own error type and field."""
    if not value:
        return None
    if value not in BLOCK_ACTIVATIONS:
        return ("MAX_ACTIVATIONS_UNSUPPORTED",
                f"max activations {value!r} are not one of {', '.join(BLOCK_ACTIVATIONS)}")
    if backend is not None and backend != Backend.MAX:
        return ("MAX_ACTIVATIONS_BACKEND",
                f"max activations {value!r} apply only to a max stage; this one runs {backend}")
    return None
