"""The backend interface every kernel implementation provides, and the backend registry.

All arrays crossing this interface are C-contiguous numpy arrays. The stage executor owns
batching, positions, RoPE tables, masks and the KV store; kernels only compute.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from libs.model.errors import BackendUnavailableError

if TYPE_CHECKING:
    from libs.model.config import DeepseekV2Config
    from libs.model.weights import StageWeights

MASK_NEG = np.float32(-1e30)  # additive mask value for a blocked key


@dataclass(frozen=True)
class LayerInputs:
    hidden: np.ndarray        # float32 [R, hidden]; R = rows of this ragged batch
    rope_cos: np.ndarray      # float32 [R, qk_rope_head_dim // 2], host-computed incl. yarn
    rope_sin: np.ndarray      # float32 [R, qk_rope_head_dim // 2]
    past_latent: np.ndarray   # float32 [P, kv_lora_rank], past KV of all sequences, slice order
    past_k_rope: np.ndarray   # float32 [P, qk_rope_head_dim]
    mask: np.ndarray          # float32 [R, P + R] additive (0 or MASK_NEG); keys = [past ; new]


@dataclass(frozen=True)
class LayerOutputs:
    hidden: np.ndarray        # float32 [R, hidden]
    new_latent: np.ndarray    # float32 [R, kv_lora_rank] = kv_a_layernorm(compressed_kv)
    new_k_rope: np.ndarray    # float32 [R, qk_rope_head_dim], post-RoPE
    routed_expert_ids: np.ndarray | None  # int32 [R, num_experts_per_tok] on MoE layers


class StageKernels(Protocol):
    name: str   # "numpy" | "max"
    build: str  # e.g. "numpy 2.4.0", "max 26.7.0"

    def embed(self, token_ids: np.ndarray) -> np.ndarray:
        """int32 [R] -> float32 [R, hidden] (first stage only)."""
        ...

    def decoder_layer(self, layer_index: int, inputs: LayerInputs) -> LayerOutputs: ...

    def final(self, hidden: np.ndarray) -> np.ndarray:
        """float32 [R, hidden] -> float32 logits [R, vocab] (final RMSNorm + lm_head)."""
        ...


# (cfg, weights, device[, backend options]) -> kernels
KernelFactory = Callable[..., StageKernels]

# Backend name -> "module:factory". Modules are imported only when the backend is asked for,
# so an absent runtime never breaks the other backend.
BACKENDS: dict[str, str] = {
    "numpy": "libs.model.numpy_kernels:make_numpy_kernels",
    "max": "libs.model.max_kernels:make_max_kernels",
}


def make_kernels(
    name: str, cfg: DeepseekV2Config, weights: StageWeights, device: str = "cpu", options: object | None = None
) -> StageKernels:
    """Build the named backend; an unknown or unavailable backend is an error, never a fallback.

    `options` is the backend's own options object (e.g. `MaxOptions`), passed through as is.
    """
    target = BACKENDS.get(name)
    if target is None:
        raise BackendUnavailableError(f"unknown backend {name!r}; known: {sorted(BACKENDS)}")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
        factory: KernelFactory = getattr(module, attr)
    except (ImportError, AttributeError) as exc:
        raise BackendUnavailableError(f"backend {name!r} is unavailable: {exc}") from exc
    return factory(cfg, weights, device) if options is None else factory(cfg, weights, device, options)
