"""The one protobuf mapping of backends and element types."""

from __future__ import annotations

import pytest

from fornax.common.v1 import common_pb2
from libs.common.kinds import FLOAT_DTYPES, Backend, DType
from libs.common.proto import BACKEND_TO_PB, DTYPE_TO_PB, backend_from_pb, dtype_from_pb, dtype_pb_name
from libs.service.errors import InvalidArgument


def test_every_member_round_trips_and_every_wire_value_but_unspecified_is_mapped():
    assert {backend_from_pb(BACKEND_TO_PB[b], "backend") for b in Backend} == set(Backend)
    assert {dtype_from_pb(DTYPE_TO_PB[d], "dtype", allowed=tuple(DType)) for d in DType} == set(DType)
    assert set(BACKEND_TO_PB.values()) == set(common_pb2.Backend.values()) - {common_pb2.BACKEND_UNSPECIFIED}
    assert set(DTYPE_TO_PB.values()) == set(common_pb2.ElementType.values()) - {common_pb2.ELEMENT_TYPE_UNSPECIFIED}


def test_members_are_named_like_their_wire_values():
    assert [b.name for b in Backend] == [common_pb2.Backend.Name(BACKEND_TO_PB[b]).removeprefix("BACKEND_")
                                         for b in Backend]
    assert dtype_pb_name(DType.BF16) == "ELEMENT_TYPE_BF16"
    assert DType("fp16") is DType.FP16 and Backend.MAX == "max"


@pytest.mark.parametrize("value", [common_pb2.BACKEND_UNSPECIFIED, 99])
def test_unspecified_or_unknown_backend_is_invalid_naming_the_field(value):
    with pytest.raises(InvalidArgument) as caught:
        backend_from_pb(value, "spec.backend")
    assert (caught.value.field, caught.value.reason) == ("spec.backend", "INVALID_BACKEND")


def test_boundary_dtypes_are_the_float_types_unless_told_otherwise():
    assert dtype_from_pb(common_pb2.ELEMENT_TYPE_FP32, "d") is DType.FP32
    for value in (common_pb2.ELEMENT_TYPE_UNSPECIFIED, common_pb2.ELEMENT_TYPE_INT32, 42):
        with pytest.raises(InvalidArgument) as caught:
            dtype_from_pb(value, "boundary_dtype", reason="INVALID_BOUNDARY_DTYPE")
        assert (caught.value.field, caught.value.reason) == ("boundary_dtype", "INVALID_BOUNDARY_DTYPE")
        assert all(dtype_pb_name(d) in caught.value.message for d in FLOAT_DTYPES)
