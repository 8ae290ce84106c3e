"""Transformers' DeepSeek-V2 run on a weight policy's dequantized weights: the reference of the
same quantized model (every weight decoded from the bytes the artifact builder writes)."""

from __future__ import annotations

from pathlib import Path


def reference_greedy_under_policy(checkpoint: Path, policy: str, prompts: list[list[int]],
                                  new_tokens: int) -> list[list[int]]:
    import torch
    import transformers

    from libs.model.bench_transformers import load_policy_weights
    from libs.model.config import load_config
    from libs.model.weights import load_stage_weights

    cfg = load_config(checkpoint)
    weights = load_stage_weights(checkpoint, cfg, 0, cfg.num_hidden_layers, True, True, policy=policy)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(checkpoint), dtype=torch.float32, attn_implementation="eager").eval()
    load_policy_weights(model, cfg, weights)
    with torch.no_grad():
        out = []
        for ids in prompts:
            generated = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False)
            out.append(generated[0, len(ids):].tolist())
    return out
