"""Host-side RoPE tables (default and yarn), matching Hugging Face's DeepSeek-V2.

DeepSeek-V2 rotates interleaved feature pairs (x[2i], x[2i+1]) by angle position * inv_freq[i];
yarn also scales cos and sin by an attention factor. The kernels apply:
    out[2i]   = x[2i] * cos - x[2i+1] * sin
    out[2i+1] = x[2i] * sin + x[2i+1] * cos
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from libs.model.config import DeepseekV2Config, RopeConfig, yarn_mscale


@dataclass(frozen=True)
class RopeTables:
    inv_freq: np.ndarray      # float32 [rope_dim // 2]
    attention_factor: float   # multiplies cos and sin

    def cos_sin(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """float32 [R, rope_dim // 2] cos and sin for integer positions [R]."""
        angles = positions.astype(np.float32)[:, None] * self.inv_freq[None, :]
        angles64 = angles.astype(np.float64)
        factor = np.float32(self.attention_factor)
        cos = (np.cos(angles64).astype(np.float32) * factor).astype(np.float32)
        sin = (np.sin(angles64).astype(np.float32) * factor).astype(np.float32)
        return np.ascontiguousarray(cos), np.ascontiguousarray(sin)


def rope_tables(cfg: DeepseekV2Config) -> RopeTables:
    dim = cfg.qk_rope_head_dim
    if cfg.rope.rope_type == "yarn":
        return _yarn(cfg.rope, dim)
    exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    inv_freq = (1.0 / (np.float32(cfg.rope.theta) ** exponents)).astype(np.float32)
    return RopeTables(inv_freq, 1.0)


def _yarn(rope: RopeConfig, dim: int) -> RopeTables:
    factor = rope.factor
    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = yarn_mscale(factor, rope.mscale) / yarn_mscale(factor, rope.mscale_all_dim)
        else:
            attention_factor = yarn_mscale(factor)
    base, original = rope.theta, rope.original_max_position_embeddings

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1).astype(np.float32)
    pos_freqs = np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    extrapolation = (1.0 / pos_freqs).astype(np.float32)
    interpolation = (1.0 / (np.float32(factor) * pos_freqs)).astype(np.float32)
    keep = (1 - ramp).astype(np.float32)
    inv_freq = (interpolation * (1 - keep) + extrapolation * keep).astype(np.float32)
    return RopeTables(inv_freq, float(attention_factor))


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate interleaved pairs of x [R, ..., rope_dim] by cos/sin [R, rope_dim // 2]."""
    shape = x.shape
    pairs = x.reshape(shape[0], -1, shape[-1] // 2, 2)
    c = cos.reshape(shape[0], 1, -1)
    s = sin.reshape(shape[0], 1, -1)
    even, odd = pairs[..., 0], pairs[..., 1]
    out = np.stack((even * c - odd * s, even * s + odd * c), axis=-1)
    return np.ascontiguousarray(out.reshape(shape), dtype=np.float32)
