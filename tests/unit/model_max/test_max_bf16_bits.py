"""float32 -> bfloat16 conversion used for bf16 weight storage (no graph compiles)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("max")

from libs.model.max_runtime import _to_bf16_bits  # noqa: E402


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def test_exact_values_survive_and_ties_round_to_even():
    exact = np.array([0.0, 1.0, -2.5, 3.140625], np.float32)
    np.testing.assert_array_equal(bf16_to_f32(_to_bf16_bits(exact)), exact)
    one_bits = np.array([0x3F80_8000, 0x3F81_8000, 0x3F80_8001], np.uint32).view(np.float32)
    assert _to_bf16_bits(one_bits).tolist() == [0x3F80, 0x3F82, 0x3F81]


def test_relative_error_is_within_half_a_bf16_ulp():
    x = np.random.default_rng(0).standard_normal(10_000).astype(np.float32)
    rel = np.abs(bf16_to_f32(_to_bf16_bits(x)) - x) / np.abs(x)
    assert rel.max() <= 2.0 ** -8 and rel.mean() > 0
