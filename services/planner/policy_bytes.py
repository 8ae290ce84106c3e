"""Resident weight bytes per layer under a weight policy: every tensor of the layer in the
format the policy gives it (`libs.weights.policy`), as the artifact builder will store it."""

from __future__ import annotations

from dataclasses import dataclass

from libs.model.config import DeepseekV2Config
from libs.model.layout import expected_tensors, layer_tensors, tensors_for_layers
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


def stage_bytes_by_format(cfg: DeepseekV2Config, policy: str, layer_start: int, layer_end: int,
                          backend: str) -> dict[str, int]:
    """Stored bytes of a stage's tensors per format, as the builder writes them for `backend`
    (the first stage holds the embeddings, the last the final norm and head)."""
    shapes = {name: spec.shape for name, spec in expected_tensors(cfg).items()}
    names = tensors_for_layers(cfg, layer_start, layer_end, layer_start == 0, layer_end == cfg.num_hidden_layers)
    out: dict[str, int] = {}
    for name in names:
        fmt = choose(policy, name, shapes[name], cfg.num_hidden_layers, backend).fmt
        out[fmt.name] = out.get(fmt.name, 0) + fmt.nbytes(shapes[name])
    return dict(sorted(out.items(), key=lambda item: -item[1]))


def format_lines(cfg: DeepseekV2Config, policy: str, stages: list[tuple[int, str, int, int, str]]) -> list[str]:
    """(stage index, node, start, end, backend) per stage -> one line of bytes by format each."""
    lines = [f"weights by format (policy {policy}, as the builder stores them for each stage's backend; contract "
             "figures from the checkpoint's shapes):"]
    for index, node, start, end, backend in stages:
        parts = ", ".join(f"{name} {size / 2**30:.3f} GiB"
                          for name, size in stage_bytes_by_format(cfg, policy, start, end, backend).items())
        lines.append(f"  stage {index} on {node} ({backend}) [{start}, {end}): {parts}")
    return lines
