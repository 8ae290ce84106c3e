"""Chunked prefill mixed with decode keeps the numpy backend's KV exact: greedy text and
tokens equal those of unchunked prefill, with long prompts arriving while others decode."""

from __future__ import annotations

import asyncio

from libs.text.context import TextContext
from services.orchestrator.engine.domain import GenerationRequest, Phase, SchedulerConfig
from services.orchestrator.engine.serving import ServingConfig, ServingEngine
from services.orchestrator.route.inprocess_pipeline import InProcessPipeline, InProcessRouteConfig

NEW_TOKENS = 10
EARLY = ("Mixture of experts", "Stages")
LATE = ("The quick brown fox jumps over the lazy dog while the stages pass activations along "
        "the pipeline, one chunk of the prompt at a time",)


def served(checkpoint, scheduler: SchedulerConfig, issued: list | None = None):
    """(tokens, texts) per request; `issued` collects (phase, rows) of every microbatch."""
    async def main():
        pipeline = InProcessPipeline.from_checkpoint(InProcessRouteConfig(checkpoint, 1))
        submit = pipeline.submit

        async def recording_submit(batch):
            if issued is not None:
                issued.append((batch.phase, batch.row_count))
            return await submit(batch)

        pipeline.submit = recording_submit
        text = TextContext.from_checkpoint(checkpoint)
        engine = ServingEngine(pipeline, pipeline.served, text, ServingConfig(scheduler))

        async def collect(stream):
            outs = [out async for out in stream]
            return [t for o in outs for t in o.token_ids], "".join(o.text for o in outs)

        early = [asyncio.create_task(collect(engine.submit(GenerationRequest(
            f"e{i}", tuple(text.tokenizer.encode(p)), NEW_TOKENS)))) for i, p in enumerate(EARLY)]
        await asyncio.sleep(0)  # the late prompt arrives while the early ones run
        late = [asyncio.create_task(collect(engine.submit(GenerationRequest(
            f"l{i}", tuple(text.tokenizer.encode(p)), NEW_TOKENS)))) for i, p in enumerate(LATE)]
        done = [await t for t in early + late]
        await engine.close()
        return [d[0] for d in done], [d[1] for d in done]

    return asyncio.run(main())


def test_budgeted_chunks_give_the_unchunked_greedy_text(checkpoint):
    text = TextContext.from_checkpoint(checkpoint)
    assert len(text.tokenizer.encode(LATE[0])) > 3 * 4  # several chunks of at most 4 tokens
    plain_tokens, plain_text = served(checkpoint, SchedulerConfig())
    issued: list = []
    chunked_tokens, chunked_text = served(checkpoint, SchedulerConfig(
        inflight_microbatches=2, max_tokens_per_step=6, min_prefill_chunk_tokens=2), issued)
    prefill_rows = [rows for phase, rows in issued if phase is Phase.PREFILL]
    assert len(prefill_rows) >= 4 and max(prefill_rows) <= 6
    assert chunked_tokens == plain_tokens
    assert chunked_text == plain_text
    assert all(len(t) == NEW_TOKENS for t in plain_tokens)
