"""float8 e4m3 (the "fn" variant: no infinities) in numpy, and the power-of-two block scales of
the fp8 KV format.

e4m3fn: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits. Normal values are
(1 + m/8) * 2^(e - 7) for e in 1..15, except S.1111.111, which is NaN; subnormals (e = 0) are
m * 2^-9. The largest finite value is 448 (S.1111.110), the smallest normal 2^-6, the smallest
subnormal 2^-9. There is no infinity.

Encoding rounds to nearest, ties to even, and saturates: a magnitude above 448 (infinity
included) encodes as +-448, never as NaN or infinity. NaN encodes as 0x7F (0xFF decodes as NaN
too). Pure functions, no state.
"""

from __future__ import annotations

import numpy as np

E4M3_MAX = 448.0
E4M3_MIN_NORMAL = 2.0**-6
E4M3_MIN_SUBNORMAL = 2.0**-9
E4M3_NAN = 0x7F
E4M3_MANTISSA_BITS = 3


def _decode_table() -> np.ndarray:
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exponent = (codes >> 3) & 0xF
    mantissa = codes & 0x7
    value = np.where(exponent == 0, mantissa * 2.0**-9, (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7.0))
    value = np.where((codes & 0x7F) == 0x7F, np.nan, value)
    return (sign * value).astype(np.float32)


DECODE_TABLE = _decode_table()
def decode_e4m3(codes: np.ndarray) -> np.ndarray:
    """uint8 codes -> float32 values (NaN for 0x7F and 0xFF)."""
    return DECODE_TABLE[np.asarray(codes, dtype=np.uint8)]


def encode_e4m3(values: np.ndarray) -> np.ndarray:
    """float32 values -> uint8 e4m3fn codes (round to nearest even, saturate, NaN -> 0x7F).

    Wider inputs are first rounded to float32. Works on the float32 bit pattern: the normal
    range rounds the 23-bit mantissa to 3 bits (ties to even) and rebiases the exponent
    (127 -> 7); below 2^-6 the code is the value in subnormal steps, |x| * 2^9, rounded half
    to even (np.rint)."""
    x = np.asarray(values, dtype=np.float32)
    bits = x.view(np.uint32)
    magnitude_bits = bits & np.uint32(0x7FFFFFFF)
    magnitude = magnitude_bits.view(np.float32)
    halfway = np.uint32(0x7FFFF) + ((magnitude_bits >> np.uint32(20)) & np.uint32(1))
    rounded = (magnitude_bits + halfway) >> np.uint32(20)  # exponent and 3 mantissa bits
    normal = rounded.astype(np.int32) - ((127 - 7) << 3)
    small = np.fmin(magnitude, np.float32(E4M3_MIN_NORMAL))  # fmin: NaN and inf leave this branch
    subnormal = np.rint(small * np.float32(512.0)).astype(np.int32)
    codes = np.where(magnitude < np.float32(E4M3_MIN_NORMAL), subnormal, normal)
    codes = np.minimum(codes, 0x7E)  # saturate at 448 (infinity included)
    nan = magnitude_bits > np.uint32(0x7F800000)
    codes = np.where(nan, E4M3_NAN, codes)
    sign = np.where((bits >> np.uint32(31)).astype(bool) & ~nan, 0x80, 0)
    return (codes | sign).astype(np.uint8)


def round_e4m3(values: np.ndarray) -> np.ndarray:
    """The e4m3 value nearest each input (ties to even, saturating at +-448), as float32."""
    return decode_e4m3(encode_e4m3(values))


def power_of_two_scale(amax: np.ndarray) -> np.ndarray:
    """The smallest power of two s with amax / s <= 448 (1.0 where amax is 0 or not finite).

    A power of two keeps a block's requantization exact for every value still in the normal
    range (`requantize`)."""
    a = np.asarray(amax, dtype=np.float64)
    usable = np.isfinite(a) & (a > 0)
    ratio = np.where(usable, a, E4M3_MAX) / E4M3_MAX
    mantissa, exponent = np.frexp(ratio)  # ratio = f * 2^e, f in [0.5, 1): 2^e >= ratio
    exponent = np.where(mantissa == 0.5, exponent - 1, exponent)  # ratio is itself a power of two
    return np.where(usable, np.ldexp(1.0, exponent), 1.0).astype(np.float32)


def finite_amax(values: np.ndarray, axis) -> np.ndarray:
    """Largest finite magnitude along `axis` (0 where none is finite)."""
    magnitude = np.abs(np.asarray(values, dtype=np.float32))
    return np.where(np.isfinite(magnitude), magnitude, 0.0).max(axis=axis, initial=0.0)


def requantize(codes: np.ndarray, old_scale: np.ndarray, new_scale: np.ndarray) -> np.ndarray:
    """Codes stored at `old_scale` re-encoded at `new_scale` (>= old, both powers of two,
    broadcast against `codes`). Exact for values that stay normal; a value that falls into the
    subnormals is rounded once more, by at most half a subnormal step of the new scale."""
    ratio = np.asarray(old_scale, dtype=np.float32) / np.asarray(new_scale, dtype=np.float32)
    return encode_e4m3(decode_e4m3(codes) * ratio)
