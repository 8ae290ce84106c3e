"""Admission under KV block pressure on the tiny model (numpy, in-process stages): a request
whose blocks are not free waits and then runs (`--kv-full queue`), or is refused with 429
naming the blocks (`reject`); one that can never fit is refused at once with KV_NEVER_FITS."""

from __future__ import annotations

import asyncio

import openai
import pytest

from libs.text.context import TextContext
from services.orchestrator.engine.admission import KvFullPolicy
from services.orchestrator.engine.domain import FinishReason, GenerationRequest
from services.orchestrator.engine.serving import ServingConfig, ServingEngine
from services.orchestrator.route.inprocess_pipeline import InProcessPipeline, InProcessRouteConfig
from tests.integration.orchestrator.harness import MODEL_ID, serve

pytestmark = pytest.mark.integration
GREEDY = {"temperature": 0, "model": MODEL_ID}
PER_TOKEN = 384  # tiny, two stages: (32 + 16) * 4 bytes * 2 layers per stage
BLOCK = 16 * PER_TOKEN


def client(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=60)


def test_a_request_waits_for_blocks_held_by_another_and_runs_once_they_are_released(checkpoint):
    """The stages themselves hold two blocks each: the second request could not even be
    prefilled next to the first, so it waits in the orchestrator's queue instead of failing."""
    async def main():
        pipeline = InProcessPipeline.from_checkpoint(InProcessRouteConfig(
            checkpoint, 2, kv_limit_bytes_per_stage=2 * BLOCK, model_id=MODEL_ID))
        engine = ServingEngine(pipeline, pipeline.served, TextContext.from_checkpoint(checkpoint))
        events: list[tuple[str, FinishReason | None]] = []

        async def collect(stream):
            async for out in stream:
                events.append((out.request_id, out.finish_reason))

        try:
            first = engine.submit(GenerationRequest("first", (1, 2, 3), 29, ignore_eos=True))  # both blocks
            second = engine.submit(GenerationRequest("second", (1, 2, 3), 5, ignore_eos=True))  # one block
            queued = engine.scheduler.queued_requests
            await asyncio.gather(collect(first), collect(second))
            await engine.wait_idle()
            pools = [e.kv.pool.stats() for e in pipeline._executors]
        finally:
            await engine.close()
        return queued, events, pools

    queued, events, pools = asyncio.run(main())
    assert queued == 1
    assert [p.total_blocks for p in pools] == [2, 2] and all(p.referenced_blocks == 0 for p in pools)
    finals = [(rid, reason) for rid, reason in events if reason is not None]
    assert finals == [("first", FinishReason.LENGTH), ("second", FinishReason.LENGTH)]
    # Every token of the second request came after the first one ended.
    assert events.index(("first", FinishReason.LENGTH)) < min(
        i for i, (rid, _) in enumerate(events) if rid == "second")
    assert sum(1 for rid, _ in events if rid == "second") >= 1


def test_reject_policy_answers_429_naming_blocks_needed_and_free(checkpoint):
    config = ServingConfig(stage_kv_budget_bytes=(2 * BLOCK, 2 * BLOCK), kv_full=KvFullPolicy.REJECT)

    async def main():
        async with serve(checkpoint, config=config) as served:
            api = client(served.base_url)
            holder = await api.completions.create(prompt=[1, 2, 3], max_tokens=29, stream=True,
                                                  extra_body={"ignore_eos": True}, **GREEDY)
            await holder.__anext__()  # admitted: both blocks of every stage are reserved
            with pytest.raises(openai.RateLimitError) as info:
                await api.completions.create(prompt=[1, 2, 3], max_tokens=5, **GREEDY)
            rest = [c async for c in holder]
            await served.engine.wait_idle()  # released on every stage
            after = await api.completions.create(prompt=[1, 2, 3], max_tokens=5, **GREEDY)
            return info.value, rest, after

    error, rest, after = asyncio.run(main())
    assert error.status_code == 429
    assert error.body["code"] == "kv_blocks_full"
    assert error.body["kv_blocks"] == {"stage": 0, "needed": 1, "free": 0, "total": 2, "block_tokens": 16}
    assert rest[-1].choices[0].finish_reason == "length"
    assert after.usage.completion_tokens >= 1  # the blocks came back with the release


def test_a_request_larger_than_a_stage_is_refused_at_once_with_kv_never_fits(checkpoint):
    config = ServingConfig(stage_kv_budget_bytes=(PER_TOKEN * 100, PER_TOKEN * 100))  # 6 blocks

    async def main():
        async with serve(checkpoint, config=config) as served:
            with pytest.raises(openai.BadRequestError) as info:
                await client(served.base_url).completions.create(
                    prompt=[1, 2, 3], max_tokens=200, **GREEDY)
            return info.value, served.engine.live_requests

    error, live = asyncio.run(main())
    assert error.status_code == 400 and error.body["code"] == "kv_never_fits"
    assert error.body["param"] == "max_tokens" and "KV space on stage 0" in error.body["message"]
    assert error.body["kv_blocks"] == {"stage": 0, "needed": 13, "free": 6, "total": 6, "block_tokens": 16}
    assert live == 0  # refused, not queued
