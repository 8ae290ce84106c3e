"""Weight policies: which format each tensor of a checkpoint is stored in.

Named as users know them from llama.cpp: `fp32`, `bf16`, `q8_0` and `q4_k_m`. Every policy keeps
norms and the MoE router at full precision (float32: small, and routing is sensitive). `q4_k_m`
follows llama.cpp's Q4_K_M: 4-bit K-quants for the projections, 6-bit for the sensitive ones
(`kv_b_proj`, which llama.cpp calls attn_v / attn_kv_b, and the down projections of the layers
llama.cpp's `use_more_bits` picks), and 8-bit embeddings and head.

A row whose length is not a multiple of the wanted format's block falls back as llama.cpp's
quantizer does: Q4_K -> Q5_0, Q6_K -> Q8_0, and any block format -> F16 when no 32-block fits.
The choice says so, and the manifest records it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from libs.weights.errors import UnknownWeightPolicyError
from libs.weights.formats import WeightFormat, weight_format

POLICIES = ("fp32", "bf16", "q8_0", "q4_k_m")
DEFAULT_POLICY = "fp32"
_FALLBACK = {"q4_k": "q5_0", "q6_k": "q8_0", "q4_0": "f16", "q5_0": "f16", "q5_1": "f16", "q8_0": "f16"}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


@dataclass(frozen=True)
class TensorChoice:
    fmt: WeightFormat
    wanted: str        # the format the policy asked for
    fallback: str      # why `fmt` differs from `wanted` ("" when it does not)


def require_policy(name: str) -> str:
    if name not in POLICIES:
        raise UnknownWeightPolicyError(f"unknown weight policy {name!r}; known: {', '.join(POLICIES)}")
    return name


def use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's rule for the layers whose down projection gets more bits in Q4_K_M."""
    eighth = layers // 8
    return layer < eighth or layer >= 7 * layers // 8 or (layer - eighth) % 3 == 2


def wanted_format(policy: str, name: str, shape: tuple[int, ...], layers: int) -> str:
    """The policy's format for one tensor, before any block fallback."""
    if len(shape) < 2 or name.endswith(".mlp.gate.weight") or policy == "fp32":
        return "fp32"
    if policy in ("bf16", "q8_0"):
        return policy
    require_policy(policy)
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return "q8_0"
    match = _LAYER.match(name)
    layer = int(match.group(1)) if match else 0
    if name.endswith("kv_b_proj.weight"):
        return "q6_k"
    if name.endswith("down_proj.weight") and use_more_bits(layer, layers):
        return "q6_k"
    return "q4_k"


def choose(policy: str, name: str, shape: tuple[int, ...], layers: int) -> TensorChoice:
    wanted = wanted_format(require_policy(policy), name, shape, layers)
    fmt = weight_format(wanted)
    reasons = []
    while not fmt.fits(shape[-1]):
        nxt = weight_format(_FALLBACK[fmt.name])
        reasons.append(f"a row of {shape[-1]} is not a multiple of {fmt.name}'s {fmt.block_size}: {nxt.name}")
        fmt = nxt
    return TensorChoice(fmt, wanted, "; ".join(reasons))
