"""Encoders for GGUF's Q4_K and Q6_K super-blocks (the `gguf` package decodes them but has no
encoder). Layouts, per 256-element super-block, as llama.cpp's `block_q4_K` / `block_q6_K`:

- Q4_K (144 bytes): f16 d, f16 dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32,
  128 bytes of 4-bit quants. x = d * sc[j] * q - dmin * m[j], q in [0, 15].
- Q6_K (210 bytes): 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 int8 scales
  for sub-blocks of 16, f16 d. x = d * sc[j] * (q - 32), q in [0, 63].

Scales come from each sub-block's range (min-max for Q4_K, abs-max for Q6_K), quantized against
the super-block's largest; then every quant is re-rounded against its quantized scale. The
tests check these bytes against `gguf.quants.dequantize`.
"""

from __future__ import annotations

import numpy as np

QK_K = 256
QUANTIZER = "fornax-kquant-range 1"


def _f16(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16)


def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros(np.broadcast_shapes(a.shape, b.shape), np.float32), where=b != 0)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """float32 [..., n] (n a multiple of 256) -> uint8 [..., n / 256 * 144]."""
    lead = x.shape[:-1]
    blocks = np.asarray(x, np.float32).reshape(-1, 8, 32)            # [B, sub, 32]
    lo = np.minimum(blocks.min(axis=-1), 0.0)                          # [B, 8]
    hi = blocks.max(axis=-1)
    scale, minimum = (hi - lo) / 15.0, -lo
    d = _f16(scale.max(axis=-1) / 63.0)                                # [B]
    dmin = _f16(minimum.max(axis=-1) / 63.0)
    sc = np.clip(np.rint(_safe_div(scale, d.astype(np.float32)[:, None])), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(_safe_div(minimum, dmin.astype(np.float32)[:, None])), 0, 63).astype(np.uint8)
    eff_scale = (d.astype(np.float32)[:, None] * sc)[..., None]
    eff_min = (dmin.astype(np.float32)[:, None] * m)[..., None]
    q = np.clip(np.rint(_safe_div(blocks + eff_min, eff_scale)), 0, 15).astype(np.uint8)  # [B, 8, 32]
    packed = np.empty((blocks.shape[0], 12), np.uint8)
    packed[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    packed[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(-1, 128)      # chunk i: low = 2i, high = 2i+1
    out = np.concatenate([d[:, None].view(np.uint8), dmin[:, None].view(np.uint8), packed, qs], axis=1)
    return out.reshape(*lead, -1)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """float32 [..., n] (n a multiple of 256) -> uint8 [..., n / 256 * 210]."""
    lead = x.shape[:-1]
    blocks = np.asarray(x, np.float32).reshape(-1, 16, 16)           # [B, sub, 16]
    scale = np.abs(blocks).max(axis=-1) / 31.0                         # [B, 16]
    d = _f16(scale.max(axis=-1) / 127.0)
    sc = np.clip(np.rint(_safe_div(scale, d.astype(np.float32)[:, None])), -128, 127).astype(np.int8)
    eff = (d.astype(np.float32)[:, None] * sc)[..., None]
    q = (np.clip(np.rint(_safe_div(blocks, eff)), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)
    # per 128-element half n: q[:, n, k, l] is element 128n + 32k + l
    low = q & 0xF
    ql = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], axis=2)
    high = q >> 4
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)        # [B, 2, 32]
    out = np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8), d[:, None].view(np.uint8)],
                         axis=1)
    return out.reshape(*lead, -1)
