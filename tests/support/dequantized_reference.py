"""Transformers' DeepSeek-V2 run on a weight policy's dequantized weights: the reference of the
same quantized model (every weight decoded from the bytes the artifact builder writes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def reference_greedy_under_policy(checkpoint: Path, policy: str, prompts: list[list[int]],
                                  new_tokens: int) -> list[list[int]]:
    import torch
    import transformers

    from libs.model.bench_transformers import _load_layer_weights
    from libs.model.config import load_config
    from libs.model.weights import load_stage_weights
    from libs.weights.tensor import dense

    cfg = load_config(checkpoint)
    weights = load_stage_weights(checkpoint, cfg, 0, cfg.num_hidden_layers, True, True, policy=policy)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(checkpoint), dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        for index, layer in enumerate(model.model.layers):
            _load_layer_weights(layer, cfg, weights, index)
        model.model.embed_tokens.weight.copy_(torch.from_numpy(np.ascontiguousarray(dense(weights.embed))))
        model.model.norm.weight.copy_(torch.from_numpy(weights.final_norm))
        model.lm_head.weight.copy_(torch.from_numpy(np.ascontiguousarray(dense(weights.lm_head))))
        out = []
        for ids in prompts:
            generated = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False)
            out.append(generated[0, len(ids):].tolist())
    return out
