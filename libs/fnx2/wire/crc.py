"""CRC32C (Castagnoli) helpers: `crc32c_extend`, hardware-accelerated (the `crc32c` package:
SSE4.2/ARMv8 CRC instructions on three interleaved streams, several times faster on large
buffers than a single stream), and `crc32c_combine`, so a payload's CRC can be computed
before its frame's metadata exists."""

from __future__ import annotations

import functools

import crc32c as _crc32c_package

_crc32c_hw = _crc32c_package.crc32c
# The package's own flag: False means its portable software fallback, an order of magnitude
# slower; `fornax bench fnx2` labels its figures with it.
HARDWARE_CRC32C: bool = _crc32c_package.hardware_based


def crc32c_extend(crc: int, data) -> int:
    """CRC32C of (what `crc` covers) ‖ `data`; `data` is any C-contiguous buffer."""
    return _crc32c_hw(data, crc)

_POLY = 0x82F63B78  # CRC32C, reflected


def _multmodp(a: int, b: int) -> int:
    """a * b modulo the CRC polynomial (reflected bit order)."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _x2n_table() -> tuple[int, ...]:
    p, table = 1 << 30, []  # x^1
    for _ in range(32):
        table.append(p)
        p = _multmodp(p, p)
    return tuple(table)


_X2N = _x2n_table()


@functools.lru_cache(maxsize=64)
def _x8n(nbytes: int) -> int:
    """x^(8 * nbytes) modulo the polynomial."""
    p, k = 1 << 31, 3
    while nbytes:
        if nbytes & 1:
            p = _multmodp(_X2N[k & 31], p)
        nbytes >>= 1
        k += 1
    return p


def crc32c_combine(crc_a: int, crc_b: int, len_b: int) -> int:
    """CRC32C of A ‖ B from CRC32C(A), CRC32C(B) and len(B)."""
    return _multmodp(_x8n(len_b), crc_a) ^ crc_b
