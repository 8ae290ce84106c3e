"""Which MAX graphs a whole model needs, from its weights' formats, without loading weights or MAX.

A MAX stage's graphs depend on the formats of its linear weights (`max_graphs.GraphSpec.quant`):
a layer kind whose layers hold different formats (llama.cpp's Q4_K_M gives some layers' down
projections more bits) needs one graph per distinct set. The formats are the ones a build for the
max backend gives: under a weight policy (`libs.weights.policy.choose(..., backend="max")`), or, for
a GGUF file, each tensor's stored format as a MAX stage holds it (`keep_stored(..., backend="max")`:
kept where MAX runs it in-graph, else the recorded build-time conversion). So a background compile
and the stage that later loads the artifact agree on every graph.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from libs.model.compile_cache import GraphName
from libs.model.config import DeepseekV2Config
from libs.model.errors import CheckpointError
from libs.model.layout import EMBED, LM_HEAD, layer_prefix, layer_tensors
from libs.weights.formats import BY_GGUF_TYPE, WeightFormat
from libs.weights.policy import DEFAULT_POLICY, SOURCE_POLICY, choose, keep_stored

# (Hugging Face tensor name, shape) -> the format a MAX stage holds the tensor in.
FormatOf = Callable[[str, tuple[int, ...]], WeightFormat]

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
    """The variants of MAX stages built under the weight policy `policy`."""
    layers = cfg.num_hidden_layers
    return variants_of(cfg, lambda name, shape: choose(policy, name, shape, layers, "max").fmt)


def stored_graph_variants(cfg: DeepseekV2Config, stored: Mapping[str, str]) -> GraphVariants:
    """The variants of MAX stages built from a GGUF whose tensors are stored as `stored`
    ({Hugging Face name: GGUF type}, `libs.model.gguf_source.map_tensors`)."""

    def format_of(name: str, shape: tuple[int, ...]) -> WeightFormat:
        if name not in stored and name == LM_HEAD and cfg.tie_word_embeddings:
            name_stored = stored.get(EMBED)  # a tied head is the embeddings' copy, as stored
        else:
            name_stored = stored.get(name)
        if name_stored is None:
            raise CheckpointError(f"the GGUF holds no {name}", reason="GGUF_TENSOR_MISSING")
        return keep_stored(BY_GGUF_TYPE[name_stored], name, shape, "max").fmt

    return variants_of(cfg, format_of)


def checkpoint_graph_variants(checkpoint: Path, cfg: DeepseekV2Config, policy: str) -> GraphVariants | None:
    """The variants MAX stages serving `checkpoint` need: a GGUF file's from its stored formats,
    a checkpoint directory's from `policy`; None for float32 (one unquantized variant)."""
    from libs.model.gguf_source import config_from_metadata, is_gguf_file, map_tensors, read_gguf

    if is_gguf_file(checkpoint):
        if policy not in (DEFAULT_POLICY, SOURCE_POLICY):
            raise CheckpointError(f"a GGUF keeps the formats it stores; weight policy {policy!r} cannot apply "
                                  "to it", reason="GGUF_WEIGHTS_POLICY")
        metadata, tensors = read_gguf(str(checkpoint))
        mapped = map_tensors(tensors, config_from_metadata(metadata, {t.name for t in tensors}))
        return stored_graph_variants(cfg, {t.name: t.gguf_type for t in mapped})
    return graph_variants(cfg, policy) if policy != DEFAULT_POLICY else None


def variants_of(cfg: DeepseekV2Config, format_of: FormatOf) -> GraphVariants:
    """Every distinct block-format set per graph kind, and the graphs' float dtype, when each
    tensor is held in `format_of(name, shape)`."""
    layers = cfg.num_hidden_layers
    found: dict[GraphName, set[Quant]] = defaultdict(set)
    floats: set[str] = set()

    def fmt(name: str, shape: tuple[int, ...]) -> str:
        chosen = format_of(name, shape)
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
