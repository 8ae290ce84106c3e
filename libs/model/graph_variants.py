"""Which MAX graphs a whole model needs under a weight policy, without loading weights or MAX.

A MAX stage's graphs depend on the formats of its linear weights (`max_graphs.GraphSpec.quant`):
a layer kind whose layers hold different formats (llama.cpp's Q4_K_M gives some layers' down
projections more bits) needs one graph per distinct set. The formats are the ones a build for the
max backend gives (`libs.weights.policy.choose(..., backend="max")`), so a background compile and
the stage that later loads the artifact agree on every graph.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from libs.model.compile_cache import GraphName
from libs.model.config import DeepseekV2Config
from libs.model.layout import EMBED, LM_HEAD, layer_prefix, layer_tensors
from libs.weights.policy import choose

Quant = tuple[tuple[str, str], ...]

# Graph weight name -> the Hugging Face tensor name within a layer (`max_runtime.layer_registry`).
_LAYER_LINEAR = {
    "q_proj": "self_attn.q_proj.weight", "q_a_proj": "self_attn.q_a_proj.weight",
    "q_b_proj": "self_attn.q_b_proj.weight", "kv_a_proj_with_mqa": "self_attn.kv_a_proj_with_mqa.weight",
    "o_proj": "self_attn.o_proj.weight", "gate_proj": "mlp.gate_proj.weight", "up_proj": "mlp.up_proj.weight",
    "down_proj": "mlp.down_proj.weight", "shared_gate_proj": "mlp.shared_experts.gate_proj.weight",
    "shared_up_proj": "mlp.shared_experts.up_proj.weight", "shared_down_proj": "mlp.shared_experts.down_proj.weight",
}
_EXPERT_LINEAR = {"experts_gate_up": "mlp.experts.0.gate_proj.weight", "experts_down": "mlp.experts.0.down_proj.weight"}


@dataclass(frozen=True)
class GraphVariants:
    weight_dtype: str                       # "float32" or "bfloat16": the graphs' float weights
    quant: dict[GraphName, tuple[Quant, ...]]  # every distinct block-format set per graph kind


def graph_variants(cfg: DeepseekV2Config, policy: str) -> GraphVariants:
    layers = cfg.num_hidden_layers
    found: dict[GraphName, set[Quant]] = defaultdict(set)
    floats: set[str] = set()

    def fmt(name: str, shape: tuple[int, ...]) -> str:
        chosen = choose(policy, name, shape, layers, "max").fmt
        if not chosen.is_block and len(shape) > 1 and not name.endswith(".mlp.gate.weight"):
            floats.add(chosen.name)
        return chosen.name if chosen.is_block else ""

    for i in range(layers):
        shapes = layer_tensors(cfg, i)
        prefix = layer_prefix(i)
        for hf in shapes:
            fmt(hf, shapes[hf])
        quant = _quant({g: fmt(prefix + t, shapes[prefix + t]) for g, t in _LAYER_LINEAR.items()
                        if prefix + t in shapes})
        found[GraphName.MOE_LAYER if cfg.is_moe_layer(i) else GraphName.DENSE_LAYER].add(quant)
        if cfg.is_moe_layer(i):
            found[GraphName.EXPERT].add(_quant({g: fmt(prefix + t, shapes[prefix + t])
                                                for g, t in _EXPERT_LINEAR.items()}))
    fmt(EMBED, (cfg.vocab_size, cfg.hidden_size))
    head = EMBED if cfg.tie_word_embeddings else LM_HEAD
    found[GraphName.FINAL].add(_quant({"lm_head": fmt(head if head == LM_HEAD else LM_HEAD,
                                                      (cfg.vocab_size, cfg.hidden_size))}))
    found[GraphName.EMBED].add(())
    return GraphVariants("bfloat16" if "bf16" in floats else "float32",
                         {name: tuple(sorted(q)) for name, q in found.items()})


def _quant(formats: dict[str, str]) -> Quant:
    return tuple(sorted((name, f) for name, f in formats.items() if f))
