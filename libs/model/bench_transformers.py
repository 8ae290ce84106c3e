"""Transformers' own DeepSeek-V2 decoder layers, loaded with the bench's weights, as a runner."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from libs.model.config import DeepseekV2Config
from libs.model.weights import LayerWeights, StageWeights
from libs.weights.tensor import Weight, dense

EXPERTS_IMPLEMENTATION = "grouped_mm"


def hf_layer_state(lw: LayerWeights) -> dict[str, np.ndarray]:
    """A `DeepseekV2DecoderLayer`'s state dict for one layer's weights, each decoded to float32
    (a packed weight runs dequantized: the reference of the same quantized model). The routed
    experts fill their [experts, ...] tensors one expert at a time, so no second stacked copy
    of them is ever held."""
    a = lw.attention
    state = {
        "input_layernorm.weight": lw.input_norm,
        "post_attention_layernorm.weight": lw.post_attention_norm,
        "self_attn.kv_a_proj_with_mqa.weight": a.kv_a_proj,
        "self_attn.kv_a_layernorm.weight": a.kv_a_norm,
        "self_attn.kv_b_proj.weight": a.kv_b_proj,
        "self_attn.o_proj.weight": a.o_proj,
    }
    if a.q_proj is not None:
        state["self_attn.q_proj.weight"] = a.q_proj
    else:
        q_a_proj, q_a_norm, q_b_proj = a.query_lora()
        state.update({"self_attn.q_a_proj.weight": q_a_proj, "self_attn.q_a_layernorm.weight": q_a_norm,
                      "self_attn.q_b_proj.weight": q_b_proj})
    if lw.moe is None:
        mlp = lw.dense()
        state.update({"mlp.gate_proj.weight": mlp.gate, "mlp.up_proj.weight": mlp.up,
                      "mlp.down_proj.weight": mlp.down})
    else:
        m = lw.moe
        state["mlp.gate.weight"] = m.router
        if m.shared is not None:
            state.update({"mlp.shared_experts.gate_proj.weight": m.shared.gate,
                          "mlp.shared_experts.up_proj.weight": m.shared.up,
                          "mlp.shared_experts.down_proj.weight": m.shared.down})
    out = {name: np.ascontiguousarray(dense(value), dtype=np.float32) for name, value in state.items()}
    if lw.moe is not None:
        out["mlp.experts.gate_up_proj"] = _expert_stack(lw.moe.experts_gate, lw.moe.experts_up)
        out["mlp.experts.down_proj"] = _expert_stack(lw.moe.experts_down)
    return out


def _expert_stack(*parts: Sequence[Weight]) -> np.ndarray:
    """[experts, sum of the parts' rows, cols]: each expert's parts decoded into place, in order."""
    experts = len(parts[0])
    first = [dense(part[0]) for part in parts]
    rows = [f.shape[0] for f in first]
    out = np.empty((experts, sum(rows), first[0].shape[1]), dtype=np.float32)
    for e in range(experts):
        offset = 0
        for part, count in zip(parts, rows, strict=True):
            out[e, offset:offset + count] = dense(part[e])
            offset += count
    return out


def _load_layer_weights(layer, cfg: DeepseekV2Config, weights: StageWeights, index: int) -> None:
    import torch

    state = hf_layer_state(weights.layer(index))
    layer.load_state_dict({name: torch.from_numpy(value) for name, value in state.items()}, strict=True)


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
