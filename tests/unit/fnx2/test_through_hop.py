"""What a hop delivers: the stage worker packs a boundary with `boundary_payload` and the next
stage unpacks it with `Tensor.to_float32`; `through_hop` is that round trip in one call, which
the in-process parity run applies between its stages."""

from __future__ import annotations

import numpy as np
import pytest

from libs.common.kinds import DType
from libs.fnx2 import Tensor, TensorKind, bf16_to_float32, boundary_payload, float32_to_bf16, through_hop

HIDDEN = np.random.default_rng(3).normal(size=(5, 16)).astype(np.float32) * 7


def test_an_fp32_hop_delivers_the_same_values():
    assert np.array_equal(through_hop(HIDDEN, DType.FP32), HIDDEN)


def test_a_bf16_hop_delivers_the_nearest_even_bf16_values():
    delivered = through_hop(HIDDEN, DType.BF16)
    assert delivered.dtype == np.float32
    assert np.array_equal(delivered, bf16_to_float32(float32_to_bf16(HIDDEN)))
    assert not np.array_equal(delivered, HIDDEN)  # it does round
    assert np.max(np.abs(delivered - HIDDEN) / np.abs(HIDDEN)) <= 2.0**-8  # half a bf16 ulp (8 significant bits)
    # Nearest-even on a tie: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 and rounds to 1.
    assert through_hop(np.array([[1 + 2.0**-8, 1 + 3 * 2.0**-8]], np.float32), DType.BF16).tolist() == \
        [[1.0, 1 + 2 * 2.0**-7]]


def test_an_fp16_hop_delivers_numpys_float16_values():
    assert np.array_equal(through_hop(HIDDEN, DType.FP16), HIDDEN.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("dtype", [DType.FP32, DType.BF16, DType.FP16])
def test_through_hop_is_the_stage_workers_pack_then_the_receivers_unpack(dtype):
    wire = Tensor.from_array(TensorKind.ACTIVATION, dtype, boundary_payload(HIDDEN, dtype))
    assert wire.descriptor.dtype is dtype
    assert np.array_equal(through_hop(HIDDEN, dtype), wire.to_float32())
