"""Greedy output through the serving core equals transformers' greedy `generate`."""

from __future__ import annotations

import asyncio

import pytest

from libs.text.context import TextContext
from services.orchestrator.engine.domain import GenerationRequest, SchedulerConfig
from services.orchestrator.engine.serving import ServingConfig, ServingEngine
from services.orchestrator.route.inprocess_pipeline import InProcessPipeline, InProcessRouteConfig

PROMPTS = ("Mixture of experts", "The quick brown fox jumps", "Stages")
NEW_TOKENS = 12


def reference_greedy(checkpoint, prompts: list[list[int]]) -> list[list[int]]:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(checkpoint), dtype=torch.float32, attn_implementation="eager").eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            generated = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS,
                                       do_sample=False)
            out.append(generated[0, len(ids):].tolist())
    return out


def served_greedy(checkpoint, stages: int, prompts: list[list[int]],
                  prefill_rows: int = 2048) -> list[list[int]]:
    async def main():
        pipeline = InProcessPipeline.from_checkpoint(InProcessRouteConfig(checkpoint, stages))
        config = ServingConfig(SchedulerConfig(max_prefill_rows_per_microbatch=prefill_rows))
        engine = ServingEngine(pipeline, pipeline.served, TextContext.from_checkpoint(checkpoint),
                               config)
        streams = [engine.submit(GenerationRequest(f"p{i}", tuple(ids), NEW_TOKENS))
                   for i, ids in enumerate(prompts)]  # all in flight together
        tokens = [[t async for out in s for t in out.token_ids] for s in streams]
        await engine.close()
        return tokens

    return asyncio.run(main())


@pytest.mark.slow
@pytest.mark.parametrize("stages, prefill_rows", [(2, 2048), (3, 3)])
def test_greedy_tokens_equal_transformers(checkpoint, stages, prefill_rows):
    text = TextContext.from_checkpoint(checkpoint)
    prompts = [text.tokenizer.encode(p) for p in PROMPTS]
    assert max(map(len, prompts)) > prefill_rows or prefill_rows == 2048
    ours = served_greedy(checkpoint, stages, prompts, prefill_rows)  # 3 rows: chunked prefill
    assert ours == reference_greedy(checkpoint, prompts)
    assert all(len(t) >= 1 for t in ours)
