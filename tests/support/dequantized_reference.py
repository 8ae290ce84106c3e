"""Transformers' DeepSeek-V2 run on a weight policy's dequantized weights: the reference of the
same quantized model (every weight decoded from the bytes the artifact builder writes)."""

from __future__ import annotations

from pathlib import Path


def reference_greedy_under_policy(checkpoint: Path, policy: str, prompts: list[list[int]],
                                  new_tokens: int) -> list[list[int]]:
    from libs.model.config import load_config

    layers = load_config(checkpoint).num_hidden_layers
    return reference_greedy_of_stages(checkpoint, [(0, layers, policy)], prompts, new_tokens)


def reference_greedy_of_stages(checkpoint: Path, stages: list[tuple[int, int, str]], prompts: list[list[int]],
                               new_tokens: int) -> list[list[int]]:
    """Greedy ids of a route whose stages (layer_start, layer_end, policy) hold their own formats."""
    import torch
    import transformers

    from libs.model.bench_transformers import load_policy_weights
    from libs.model.config import load_config
    from libs.model.weights import load_stage_weights

    cfg = load_config(checkpoint)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(checkpoint), dtype=torch.float32, attn_implementation="eager").eval()
    for index, (start, end, policy) in enumerate(stages):
        weights = load_stage_weights(checkpoint, cfg, start, end, index == 0, index == len(stages) - 1, policy=policy)
        load_policy_weights(model, cfg, weights)
    out = []
    with torch.no_grad():
        for ids in prompts:
            generated = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False)
            out.append(generated[0, len(ids):].tolist())
    return out
