"""Resident weight bytes per layer under a weight policy: every tensor of the layer in the
format the policy gives it (`libs.weights.policy`), as the artifact builder will store it."""

from __future__ import annotations

from dataclasses import dataclass

from libs.model.config import DeepseekV2Config
from libs.model.layout import layer_tensors
from libs.weights.policy import choose


@dataclass(frozen=True)
class LayerBytes:
    total: int          # every tensor of the layer
    routed: int         # the routed experts alone
    per_expert: int     # one routed expert, on average over the layer's experts


def tensor_bytes(policy: str, name: str, shape: tuple[int, ...], layers: int) -> int:
    return choose(policy, name, shape, layers).fmt.nbytes(shape)


def layer_bytes(cfg: DeepseekV2Config, index: int, policy: str) -> LayerBytes:
    total = routed = 0
    for name, shape in layer_tensors(cfg, index).items():
        size = tensor_bytes(policy, name, shape, cfg.num_hidden_layers)
        total += size
        if ".mlp.experts." in name:
            routed += size
    experts = cfg.n_routed_experts if cfg.is_moe_layer(index) else 0
    return LayerBytes(total, routed, routed // experts if experts else 0)


def matrix_bytes(policy: str, name: str, rows: int, cols: int, layers: int) -> int:
    return tensor_bytes(policy, name, (rows, cols), layers)
