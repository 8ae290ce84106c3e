"""Weight policies: which format each tensor of a checkpoint is stored in.

Named as users know them from llama.cpp: `fp32`, `bf16`, `q8_0` and `q4_k_m`. Every policy keeps
norms and the MoE router at full precision (float32: small, and routing is sensitive). `q4_k_m`
follows llama.cpp's Q4_K_M: 4-bit K-quants for the projections, 6-bit for the sensitive ones
(`kv_b_proj`, which llama.cpp calls attn_v / attn_kv_b, and the down projections of the layers
llama.cpp's `use_more_bits` picks), and 8-bit embeddings and head.

A row whose length is not a multiple of the wanted format's block falls back as llama.cpp's
quantizer does: Q4_K -> Q5_0, Q6_K -> Q8_0, and any block format -> F16 when no 32-block fits.
The choice says so, and the manifest records it.

A stage built for the MAX backend holds only formats MAX runs in-graph (`MAX_FORMATS`: float32
and bf16 graphs, `ops.qmatmul`'s Q4_0, Q4_K and Q6_K, and Q8_0, Q5_0 and Q5_1 through Fornax's
Mojo custom op), so every GGUF block format Fornax knows is held as stored. F16 becomes bf16; a
Q4_0/Q4_K/Q6_K tensor whose output dim qmatmul cannot repack (`MAX_QMATMUL_OUT_MULTIPLE`) becomes
bf16; the embeddings and `kv_b_proj`, which MAX uses in gathers and batched products rather than
a plain product, are held in bf16. A format MAX had no kernel for would be converted to the
runnable block format nearest in bits (`for_max`), or, for a GGUF's stored tensor, never to
fewer bits (`for_max_keeping_bits`). Each conversion is recorded beside the fallback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from libs.weights.errors import UnknownWeightPolicyError
from libs.weights.formats import FORMATS, WeightFormat, weight_format

POLICIES = ("fp32", "bf16", "q8_0", "q4_k_m")
DEFAULT_POLICY = "fp32"
# Not a policy a user picks: a GGUF source's tensors keep the formats the file stores them in.
SOURCE_POLICY = "gguf"
_FALLBACK = {"q4_k": "q5_0", "q6_k": "q8_0", "q4_0": "f16", "q5_0": "f16", "q5_1": "f16", "q8_0": "f16"}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


# Block formats MAX's ops.qmatmul runs (int8 activations); every block format MAX holds, these
# included, also runs through Fornax's float32-activation Mojo custom op
# (`libs.model.custom_kernels`), which is the only kernel for Q8_0, Q5_0 and Q5_1.
MAX_QMATMUL_FORMATS = frozenset({"q4_0", "q4_k", "q6_k"})
MAX_QUANT_FORMATS = MAX_QMATMUL_FORMATS | frozenset({"q8_0", "q5_0", "q5_1"})
MAX_FORMATS = frozenset({"fp32", "bf16"}) | MAX_QUANT_FORMATS
MAX_QMATMUL_OUT_MULTIPLE = 32  # MAX 26.7's qmatmul weight repack refuses other output dims
# Tensors MAX reads outside a plain product (a gather, batched per-head products): float only.
_MAX_FLOAT_ONLY = ("model.embed_tokens.weight", "kv_b_proj.weight")


# Bits per weight of each policy on DeepSeek-V2-Lite's shapes (contract figures: the README's 29.3,
# 15.6 and 9.8 GiB for 15.7B parameters), to plan a GGUF's bytes as the policy nearest to what the
# file stores.
POLICY_BITS = {"fp32": 32.0, "bf16": 16.0, "q8_0": 8.5, "q4_k_m": 5.4}


def nearest_policy(bits_per_weight: float) -> str:
    return min(POLICY_BITS, key=lambda p: abs(POLICY_BITS[p] - bits_per_weight))


@dataclass(frozen=True)
class TensorChoice:
    fmt: WeightFormat
    wanted: str        # the format the policy asked for
    fallback: str      # why `fmt` differs from `wanted` ("" when it does not)
    conversion: str = ""  # why the backend's format differs from the policy's ("" when it does not)


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


def choose(policy: str, name: str, shape: tuple[int, ...], layers: int, backend: str = "numpy") -> TensorChoice:
    """The tensor's format under `policy`, for a stage of `backend` ("numpy" runs every format)."""
    wanted = wanted_format(require_policy(policy), name, shape, layers)
    fmt = weight_format(wanted)
    reasons = []
    while not fmt.fits(shape[-1]):
        nxt = weight_format(_FALLBACK[fmt.name])
        reasons.append(f"a row of {shape[-1]} is not a multiple of {fmt.name}'s {fmt.block_size}: {nxt.name}")
        fmt = nxt
    choice = TensorChoice(fmt, wanted, "; ".join(reasons))
    return for_max(choice, name, shape) if backend == "max" else choice


def keep_source(fmt: WeightFormat, name: str, shape: tuple[int, ...], backend: str = "numpy",
                conversion: str = "") -> TensorChoice:
    """A stored tensor kept in its format `fmt`, converted once only where the stage's backend
    cannot run it (`for_max`); `conversion` says why the source itself was already converted."""
    choice = TensorChoice(fmt, fmt.name, "", conversion)
    if backend != "max":
        return choice
    converted = for_max_keeping_bits(choice, name, shape)
    if converted is choice:
        return choice
    return TensorChoice(converted.fmt, fmt.name, "", "; ".join(filter(None, (conversion, converted.conversion))))


ROUTER_SUFFIX = ".mlp.gate.weight"


def keep_stored(stored: WeightFormat, name: str, shape: tuple[int, ...], backend: str = "numpy",
                composed: str = "") -> TensorChoice:
    """A GGUF tensor's format on a stage of `backend`: norms and the MoE router are read as
    float32 (every policy keeps them so); any other tensor keeps its stored format wherever the
    backend runs it (`keep_source`). `composed` says how the tensor was assembled from the file."""
    if stored.name != "fp32" and (len(shape) == 1 or name.endswith(ROUTER_SUFFIX)):
        return TensorChoice(weight_format("fp32"), stored.name, "",
                            f"norms and the router are read as float32: {stored.name} decoded to fp32")
    return keep_source(stored, name, shape, backend, composed)


def for_max(choice: TensorChoice, name: str, shape: tuple[int, ...]) -> TensorChoice:
    """`choice` converted to a format the MAX backend runs for this tensor (see the docstring)."""
    fmt, row = choice.fmt, shape[-1]
    if fmt.name in MAX_QMATMUL_FORMATS and shape[0] % MAX_QMATMUL_OUT_MULTIPLE:
        target = weight_format("bf16")
        why = f"MAX's qmatmul needs output dims in multiples of {MAX_QMATMUL_OUT_MULTIPLE}: {shape[0]} held as bf16"
    elif fmt.is_block and name.endswith(_MAX_FLOAT_ONLY):
        target = weight_format("bf16")
        why = f"MAX reads {name.rsplit('.', 2)[-2]} outside a plain product: {fmt.name} held as bf16"
    elif fmt.name == "f16":
        target, why = weight_format("bf16"), "MAX has no f16 weights: bf16"
    elif fmt.name not in MAX_FORMATS:
        runnable = [weight_format(n) for n in sorted(MAX_QUANT_FORMATS) if weight_format(n).fits(row)]
        target = min(runnable, key=lambda f: (abs(f.bits_per_weight - fmt.bits_per_weight), f.bits_per_weight))
        why = f"MAX has no {fmt.name} kernel: nearest runnable {target.name} ({target.bits_per_weight} bits)"
    else:
        return choice
    return TensorChoice(target, choice.wanted, choice.fallback, why)


def for_max_keeping_bits(choice: TensorChoice, name: str, shape: tuple[int, ...]) -> TensorChoice:
    """`for_max`, except that a block format MAX has no kernel for is held in the runnable block
    format with the fewest bits per weight that still has at least its bits (Q5_0 and Q5_1 as
    Q6_K where the row fits a 256-block), else as bf16: a stored tensor is the model the file's
    author shipped, and re-quantizing it to fewer bits changes that model (`fornax parity` on
    tiny's llama.cpp Q4_K_M file: top-1 0.676 against its own weights with Q4_0 in their place)."""
    fmt, row = choice.fmt, shape[-1]
    if not fmt.is_block or fmt.name in MAX_QUANT_FORMATS or name.endswith(_MAX_FLOAT_ONLY):
        return for_max(choice, name, shape)
    wider = [f for f in map(weight_format, sorted(MAX_QUANT_FORMATS)) if f.fits(row)
             and f.bits_per_weight >= fmt.bits_per_weight]
    target = min(wider, key=lambda f: f.bits_per_weight) if wider else weight_format("bf16")
    why = (f"MAX has no {fmt.name} kernel: {target.name}, the nearest runnable format with at least its "
           f"{fmt.bits_per_weight} bits per weight")
    return TensorChoice(target, choice.wanted, choice.fallback, why)


def runnable_formats(backend: str) -> frozenset[str]:
    """The formats a backend's stage runs: numpy decodes every format, MAX runs `MAX_FORMATS`."""
    if backend == "max":
        return MAX_FORMATS
    if backend == "numpy":
        return frozenset(FORMATS)
    raise UnknownWeightPolicyError(f"unknown backend {backend!r}: no weight formats known for it")


def policy_formats(policy: str, tensors: dict[str, tuple[int, ...]], layers: int, backend: str) -> frozenset[str]:
    """Every format a stage of `backend` holds when `tensors` are built under `policy`."""
    return frozenset(choose(policy, name, shape, layers, backend).fmt.name for name, shape in tensors.items())

