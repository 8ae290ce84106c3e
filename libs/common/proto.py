"""The one protobuf mapping of `Backend` and `DType` (fornax.common.v1).

Decoding rejects UNSPECIFIED and unknown values with INVALID_ARGUMENT naming the field.
"""

from __future__ import annotations

from collections.abc import Collection

from fornax.common.v1 import common_pb2
from libs.common.kinds import FLOAT_DTYPES, Backend, DType
from libs.service.errors import InvalidArgument

BACKEND_TO_PB = {Backend.NUMPY: common_pb2.BACKEND_NUMPY, Backend.MAX: common_pb2.BACKEND_MAX}
DTYPE_TO_PB = {
    DType.INT32: common_pb2.ELEMENT_TYPE_INT32,
    DType.BF16: common_pb2.ELEMENT_TYPE_BF16,
    DType.FP16: common_pb2.ELEMENT_TYPE_FP16,
    DType.FP32: common_pb2.ELEMENT_TYPE_FP32,
}
BACKEND_FROM_PB: dict[int, Backend] = {value: backend for backend, value in BACKEND_TO_PB.items()}
DTYPE_FROM_PB: dict[int, DType] = {value: dtype for dtype, value in DTYPE_TO_PB.items()}


def backend_from_pb(value: int, field: str, reason: str = "INVALID_BACKEND") -> Backend:
    if value not in BACKEND_FROM_PB:
        names = " or ".join(common_pb2.Backend.Name(v) for v in BACKEND_TO_PB.values())
        raise InvalidArgument(f"{field} must be {names}, got {value}", reason=reason, field=field)
    return BACKEND_FROM_PB[value]


def dtype_from_pb(value: int, field: str, allowed: Collection[DType] = FLOAT_DTYPES,
                  reason: str = "INVALID_DTYPE", error: type[InvalidArgument] = InvalidArgument) -> DType:
    dtype = DTYPE_FROM_PB.get(value)
    if dtype is None or dtype not in allowed:
        names = ", ".join(dtype_pb_name(d) for d in allowed)
        raise error(f"{field} must be one of {names}, got {value}", reason=reason, field=field)
    return dtype


def dtype_pb_name(dtype: DType) -> str:
    """The wire enum's name ("ELEMENT_TYPE_BF16"), as stage manifests record it."""
    return common_pb2.ElementType.Name(DTYPE_TO_PB[dtype])
