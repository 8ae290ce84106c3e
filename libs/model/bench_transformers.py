"""Transformers' own DeepSeek-V2 decoder layers, loaded with the bench's weights, as a runner."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from libs.model.config import DeepseekV2Config
from libs.model.weights import StageWeights
from libs.weights.tensor import Weight, dense

EXPERTS_IMPLEMENTATION = "grouped_mm"


def _load_layer_weights(layer, cfg: DeepseekV2Config, weights: StageWeights, index: int) -> None:
    import torch

    lw = weights.layer(index)
    t = torch.from_numpy
    attn, a = layer.self_attn, lw.attention
    pairs = [
        (layer.input_layernorm.weight, lw.input_norm),
        (layer.post_attention_layernorm.weight, lw.post_attention_norm),
        (attn.kv_a_proj_with_mqa.weight, a.kv_a_proj),
        (attn.kv_a_layernorm.weight, a.kv_a_norm),
        (attn.kv_b_proj.weight, a.kv_b_proj),
        (attn.o_proj.weight, a.o_proj),
    ]
    if a.q_proj is not None:
        pairs.append((attn.q_proj.weight, a.q_proj))
    else:
        q_a_proj, q_a_norm, q_b_proj = a.query_lora()
        pairs += [
            (attn.q_a_proj.weight, q_a_proj),
            (attn.q_a_layernorm.weight, q_a_norm),
            (attn.q_b_proj.weight, q_b_proj),
        ]
    if lw.moe is None:
        mlp = lw.dense()
        pairs += [
            (layer.mlp.gate_proj.weight, mlp.gate),
            (layer.mlp.up_proj.weight, mlp.up),
            (layer.mlp.down_proj.weight, mlp.down),
        ]
    else:
        m = lw.moe
        pairs += [(layer.mlp.gate.weight, m.router),
                  (layer.mlp.experts.gate_up_proj,
                   np.concatenate([_dense_stack(m.experts_gate), _dense_stack(m.experts_up)], axis=1)),
                  (layer.mlp.experts.down_proj, _dense_stack(m.experts_down))]
        if m.shared is not None:
            s = layer.mlp.shared_experts
            pairs += [
                (s.gate_proj.weight, m.shared.gate),
                (s.up_proj.weight, m.shared.up),
                (s.down_proj.weight, m.shared.down),
            ]
    with torch.no_grad():
        for param, value in pairs:
            # a packed weight runs dequantized: the reference of the same quantized model
            param.copy_(t(np.ascontiguousarray(dense(value))))


def load_policy_weights(model, cfg: DeepseekV2Config, weights: StageWeights) -> None:
    """Overwrite a `DeepseekV2ForCausalLM`'s parameters of `weights`' layers (and embeddings, norm
    and head when it holds them) with them decoded to float32: transformers then runs the same
    (quantized) model the stages run. Call once per stage for a route of mixed formats."""
    import torch

    with torch.no_grad():
        for index in weights.layers:
            _load_layer_weights(model.model.layers[index], cfg, weights, index)
        if weights.embed is not None:
            model.model.embed_tokens.weight.copy_(torch.from_numpy(np.ascontiguousarray(dense(weights.embed))))
        if weights.final_norm is not None and weights.lm_head is not None:
            model.model.norm.weight.copy_(torch.from_numpy(weights.final_norm))
            model.lm_head.weight.copy_(torch.from_numpy(np.ascontiguousarray(dense(weights.lm_head))))


def _dense_stack(stack: Sequence[Weight]) -> np.ndarray:
    return stack if isinstance(stack, np.ndarray) else np.stack([dense(w) for w in stack])


def transformers_runner(checkpoint: Path, cfg: DeepseekV2Config, weights: StageWeights):
    import torch
    import transformers
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as hf

    raw = json.loads((checkpoint / "config.json").read_text())
    raw["num_hidden_layers"] = weights.layer_end
    hf_cfg = transformers.DeepseekV2Config(**{k: v for k, v in raw.items() if k != "architectures"})
    # Eager attention (no torch.compile); experts use the implementation from_pretrained picks by default.
    hf_cfg._attn_implementation = "eager"
    hf_cfg._experts_implementation = EXPERTS_IMPLEMENTATION
    layers = {}
    for index in range(weights.layer_start, weights.layer_end):
        layer = hf.DeepseekV2DecoderLayer(hf_cfg, index).eval()
        _load_layer_weights(layer, cfg, weights, index)
        layers[index] = layer
    rotary = hf.DeepseekV2RotaryEmbedding(hf_cfg)
    states: dict[str, tuple] = {}

    def run(scenario, layer_index: int) -> float:
        key = f"{scenario.name}/{layer_index}"
        if key not in states:
            states[key] = _prepare(torch, hf, hf_cfg, rotary, layers[layer_index], scenario, layer_index)
        hidden, mask, pos_emb, cache = states[key]
        with torch.no_grad():
            start = time.perf_counter()
            layers[layer_index](hidden, attention_mask=mask, cache=cache, use_cache=cache is not None,
                                position_embeddings=pos_emb)
            elapsed = time.perf_counter() - start
        if cache is not None:
            cache.crop(-scenario.rows_per_sequence)
        return elapsed

    build = (
        f"transformers {transformers.__version__} (attention eager, experts {EXPERTS_IMPLEMENTATION}), "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads)"
    )
    return run, build


def _prepare(torch, hf, hf_cfg, rotary, layer, scenario, layer_index: int):
    gen = torch.Generator().manual_seed(0)
    b, rows, past = scenario.sequences, scenario.rows_per_sequence, scenario.past_per_sequence
    hidden = torch.randn(b, rows, hf_cfg.hidden_size, generator=gen)
    cache = None
    if past:
        from transformers.cache_utils import DynamicCache

        cache = DynamicCache(config=hf_cfg)
        prefix = torch.randn(b, past, hf_cfg.hidden_size, generator=gen)
        pos = torch.arange(past)[None].expand(b, -1)
        with torch.no_grad():
            layer(prefix, attention_mask=_causal(torch, past, 0), cache=cache, use_cache=True,
                  position_embeddings=rotary(prefix, pos))
    positions = (torch.arange(rows) + past)[None].expand(b, -1)
    mask = _causal(torch, rows, past) if rows > 1 else None
    return hidden, mask, rotary(hidden, positions), cache


def _causal(torch, rows: int, past: int):
    blocked = torch.triu(torch.ones(rows, rows + past, dtype=torch.bool), diagonal=past + 1)
    return torch.zeros(rows, rows + past).masked_fill(blocked, torch.finfo(torch.float32).min)[None, None]
