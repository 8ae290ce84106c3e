"""Encode float32 tensors into a weight format's stored bytes and decode them back.

Stored forms: fp32 -> float32, bf16 -> uint16 bit patterns, f16 -> float16, block formats ->
uint8 [..., row_bytes] in GGUF's layout. The `gguf` package's codecs are used wherever it has
one (every decoder, and the Q8_0 / Q5_0 / Q5_1 / Q4_0 encoders); `kquants` adds the Q4_K and
Q6_K encoders it lacks.
"""

from __future__ import annotations

from importlib.metadata import version

import numpy as np
from gguf import GGMLQuantizationType, quants

from libs.weights import kquants
from libs.weights.errors import WeightBlockInvalidError
from libs.weights.formats import WeightFormat

_GGUF_ENCODERS = frozenset({"Q8_0", "Q5_0", "Q5_1", "Q4_0"})
_K_ENCODERS = {"Q4_K": kquants.quantize_q4_k, "Q6_K": kquants.quantize_q6_k}
# Byte offsets of the f16 scales inside one block, for the finiteness check before load.
_SCALE_OFFSETS = {"Q8_0": (0,), "Q5_0": (0,), "Q5_1": (0, 2), "Q4_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}


def quantizer_name(fmt: WeightFormat) -> str:
    """Who wrote a format's bytes, with the version, for the manifest."""
    if fmt.gguf_type in _K_ENCODERS:
        return kquants.QUANTIZER
    if fmt.gguf_type in _GGUF_ENCODERS:
        return f"gguf {version('gguf')}"
    return "fornax cast 1 (round to nearest even)" if fmt.name != "fp32" else "fornax copy 1"


def stored_dtype(fmt: WeightFormat) -> np.dtype:
    return np.dtype({"fp32": np.float32, "bf16": np.uint16, "f16": np.float16}.get(fmt.name, np.uint8))


def stored_shape(fmt: WeightFormat, shape: tuple[int, ...]) -> tuple[int, ...]:
    return shape if not fmt.is_block else (*shape[:-1], fmt.row_bytes(shape[-1]))


def encode(array: np.ndarray, fmt: WeightFormat) -> np.ndarray:
    """float32 -> the format's stored array (see the module docstring)."""
    x = np.ascontiguousarray(array, dtype=np.float32)
    if fmt.name == "fp32":
        return x
    if fmt.name == "bf16":
        bits = x.view(np.uint32)
        return ((bits + ((bits >> 16) & 1) + np.uint32(0x7FFF)) >> 16).astype(np.uint16)
    if fmt.name == "f16":
        return x.astype(np.float16)
    if not fmt.fits(x.shape[-1]):
        raise ValueError(f"a row of {x.shape[-1]} does not fit {fmt.name}'s {fmt.block_size}-element blocks")
    if fmt.gguf_type in _K_ENCODERS:
        return _K_ENCODERS[fmt.gguf_type](x)
    return quants.quantize(x, GGMLQuantizationType[fmt.gguf_type])


def decode(stored: np.ndarray, fmt: WeightFormat) -> np.ndarray:
    """The format's stored array -> float32 of the logical shape."""
    if fmt.name == "fp32":
        return stored
    if fmt.name == "bf16":
        return (stored.astype(np.uint32) << 16).view(np.float32)
    if fmt.name == "f16":
        return stored.astype(np.float32)
    return quants.dequantize(stored, GGMLQuantizationType[fmt.gguf_type])


def check_blocks(stored: np.ndarray, fmt: WeightFormat, name: str) -> None:
    """Refuse bytes no quantizer writes: a size off the layout, or a non-finite block scale."""
    if not fmt.is_block:
        return
    if stored.dtype != np.uint8 or stored.shape[-1] % fmt.type_size:
        raise WeightBlockInvalidError(f"tensor {name}: {stored.shape} {stored.dtype} is not whole {fmt.name} blocks")
    blocks = stored.reshape(-1, fmt.type_size)
    for offset in _SCALE_OFFSETS[fmt.gguf_type]:
        scales = np.ascontiguousarray(blocks[:, offset:offset + 2]).view(np.float16)
        bad = np.flatnonzero(~np.isfinite(scales))
        if bad.size:
            raise WeightBlockInvalidError(
                f"tensor {name}: {fmt.name} block {int(bad[0])} has a non-finite scale ({bad.size} such blocks)")
