"""float8 e4m3fn codec: known values, round to nearest even, saturation, NaN, subnormals,
power-of-two scales and exact requantization."""

from __future__ import annotations

import numpy as np
import pytest

from libs.model.fp8 import (
    DECODE_TABLE,
    E4M3_MAX,
    decode_e4m3,
    encode_e4m3,
    power_of_two_scale,
    requantize,
    round_e4m3,
)


@pytest.mark.parametrize(("code", "value"), [
    (0x00, 0.0), (0x01, 2.0**-9), (0x07, 7 * 2.0**-9), (0x08, 2.0**-6), (0x38, 1.0), (0x39, 1.125),
    (0x3F, 1.875), (0x40, 2.0), (0x7E, 448.0), (0x80, -0.0), (0xB8, -1.0), (0xFE, -448.0),
])
def test_known_codes_decode_and_encode_both_ways(code, value):
    assert decode_e4m3(np.array([code], np.uint8))[0] == value
    assert encode_e4m3(np.array([value]))[0] == code


def test_nan_codes_and_nan_inputs():
    assert np.isnan(DECODE_TABLE[0x7F]) and np.isnan(DECODE_TABLE[0xFF])
    assert np.isnan(DECODE_TABLE).sum() == 2
    assert encode_e4m3(np.array([np.nan, -np.nan]))[0] == 0x7F
    assert np.isnan(decode_e4m3(encode_e4m3(np.array([np.nan, -np.nan])))).all()


def test_saturates_never_inf_nor_nan():
    big = np.array([448.0, 449.0, 463.9, 464.0, 500.0, 1e30, np.inf, -np.inf, -1e9])
    got = decode_e4m3(encode_e4m3(big))
    np.testing.assert_array_equal(got, [448, 448, 448, 448, 448, 448, 448, -448, -448])
    assert np.isfinite(decode_e4m3(encode_e4m3(np.random.default_rng(0).standard_normal(1000) * 1e6))).all()


def test_round_to_nearest_even_on_ties():
    # normal: 1 + 1/16 lies halfway between 1 (mantissa 0, even) and 1.125 (odd): down
    # 1.125 + 1/16 lies halfway between 1.125 (odd) and 1.25 (even): up
    # subnormal: 2^-10 halfway between 0 and 2^-9: to 0; 3 * 2^-10 between 2^-9 and 2^-8: up
    ties = np.array([1.0625, 1.1875, 2.0**-10, 3 * 2.0**-10, -1.0625, 240.0 + 8.0])
    np.testing.assert_array_equal(round_e4m3(ties), [1.0, 1.25, 0.0, 2.0**-8, -1.0, 256.0])
    # just off a tie goes to the nearer value
    np.testing.assert_array_equal(round_e4m3(np.array([1.0626, 2.0**-10 * 1.01])), [1.125, 2.0**-9])


def test_every_finite_code_round_trips_and_order_is_monotonic():
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint8)
    np.testing.assert_array_equal(encode_e4m3(decode_e4m3(codes)), codes)
    positive = DECODE_TABLE[:0x7F]
    assert np.all(np.diff(positive) > 0)


def test_random_values_err_within_half_a_step():
    x = np.random.default_rng(1).uniform(-448, 448, 20000).astype(np.float32).astype(np.float64)
    err = np.abs(decode_e4m3(encode_e4m3(x)).astype(np.float64) - x)
    # half a step: 2^-4 of the value in the normal range, 2^-10 in the subnormals
    assert np.all(err <= np.maximum(np.abs(x) * 2.0**-4, 2.0**-10) + 1e-12)
    assert err.max() > 0


def test_power_of_two_scale_fits_the_block_max():
    amax = np.array([448.0, 449.0, 1.0, 896.0, 0.0, np.inf, 1e-3])
    scale = power_of_two_scale(amax)
    np.testing.assert_array_equal(scale, [1.0, 2.0, 2.0**-8, 2.0, 1.0, 1.0, 2.0**-18])
    finite = amax[:4]
    assert np.all(finite / scale[:4] <= E4M3_MAX) and np.all(finite / scale[:4] > E4M3_MAX / 2)


def test_requantize_to_a_larger_power_of_two_is_exact_in_the_normal_range():
    codes = encode_e4m3(np.array([448.0, -3.5, 0.25, 2.0**-6, 2.0**-9]))
    got = decode_e4m3(requantize(codes, np.float32(1.0), np.float32(4.0))) * 4.0
    np.testing.assert_array_equal(got[:3], [448.0, -3.5, 0.25])
    # 2^-6 / 4 = 2^-8 is a subnormal step multiple: exact; 2^-9 / 4 rounds to 0 (half step 2^-10 * 4)
    assert got[3] == 2.0**-6 and got[4] == 0.0
