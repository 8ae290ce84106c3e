"""Every format's bytes are GGUF's: decoded by the `gguf` package, they give back the tensor
within the format's precision, and our K-quant encoders round-trip through its decoders."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from libs.weights.codecs import check_blocks, decode, encode, stored_shape
from libs.weights.errors import UnknownWeightFormatError, WeightBlockInvalidError
from libs.weights.formats import FORMATS, weight_format

RNG = np.random.default_rng(7)
X = (RNG.standard_normal((6, 512)) * 0.05).astype(np.float32)
# Relative RMS error bounds per format, measured on this data (fp32 exact, bf16 ~2e-3).
BOUNDS = {"fp32": 0.0, "bf16": 4e-3, "f16": 1e-3, "q8_0": 8e-3, "q6_k": 3e-2, "q5_0": 6e-2,
          "q5_1": 6e-2, "q4_0": 1.1e-1, "q4_k": 1e-1}


def rel_rms(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b ** 2)))


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_each_format_round_trips_within_its_precision(name):
    fmt = weight_format(name)
    stored = encode(X, fmt)
    assert stored.shape == stored_shape(fmt, X.shape)
    assert stored.nbytes == fmt.nbytes(X.shape)
    assert rel_rms(decode(stored, fmt).reshape(X.shape), X) <= BOUNDS[name]


@pytest.mark.parametrize("name", [n for n, f in FORMATS.items() if f.is_block])
def test_block_bytes_are_ggufs_layout(name):
    fmt = weight_format(name)
    qtype = GGMLQuantizationType[fmt.gguf_type]
    assert GGML_QUANT_SIZES[qtype] == (fmt.block_size, fmt.type_size)
    stored = encode(X, fmt)
    np.testing.assert_array_equal(quants.dequantize(stored, qtype), decode(stored, fmt))
    if name in ("q8_0", "q5_0", "q5_1", "q4_0"):  # the gguf package encodes these: same bytes
        np.testing.assert_array_equal(stored, quants.quantize(X, qtype))


def test_k_quant_encoders_use_every_level_and_scale():
    """A ramp spans each sub-block's range, so each decoded value lies within one step of its
    sub-block (the 6-bit scales quantized against the super-block's largest)."""
    ramp = np.linspace(-1, 1, 256, dtype=np.float32)[None, :]
    back = decode(encode(ramp, weight_format("q4_k")), weight_format("q4_k")).reshape(ramp.shape)
    # A sub-block's range includes 0 (Q4_K's min is never positive), so the last sub-block of
    # the ramp, [0.75, 1], spans [0, 1]: half its step is 1 / 15 / 2, plus scale rounding.
    assert np.abs(back - ramp).max() < 1 / 15 / 2 * 1.05
    back6 = decode(encode(ramp, weight_format("q6_k")), weight_format("q6_k")).reshape(ramp.shape)
    assert np.abs(back6 - ramp).max() < 1 / 31


def test_bf16_is_round_to_nearest_even_bits():
    values = np.array([1.0, 1.00390625, 1.01171875, -2.5], np.float32)  # ties at 1+2^-8, 1+3*2^-8
    bits = encode(values, weight_format("bf16"))
    assert bits.dtype == np.uint16
    np.testing.assert_array_equal(decode(bits, weight_format("bf16")), [1.0, 1.0, 1.015625, -2.5])


def test_a_row_that_does_not_fit_the_block_is_refused():
    with pytest.raises(ValueError, match="does not fit q4_k"):
        encode(np.zeros((2, 704), np.float32), weight_format("q4_k"))


def test_unknown_format_has_a_reason_code():
    with pytest.raises(UnknownWeightFormatError) as info:
        weight_format("q3_k")
    assert info.value.reason == "WEIGHT_FORMAT_UNKNOWN"


@pytest.mark.parametrize("name", ["q8_0", "q4_k", "q6_k", "q5_1"])
def test_a_block_with_a_non_finite_scale_is_refused(name):
    fmt = weight_format(name)
    stored = encode(X, fmt).copy()
    check_blocks(stored, fmt, "w")
    blocks = stored.reshape(-1, fmt.type_size)
    offset = {"q6_k": 208}.get(name, 0)
    blocks[3, offset:offset + 2] = np.array([np.inf], np.float16).view(np.uint8)
    with pytest.raises(WeightBlockInvalidError, match="block 3 has a non-finite scale"):
        check_blocks(stored, fmt, "w")
    with pytest.raises(WeightBlockInvalidError, match="not whole"):
        check_blocks(stored[:, :-1], fmt, "w")
