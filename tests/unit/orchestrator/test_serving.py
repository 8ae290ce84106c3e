from __future__ import annotations

import asyncio

from services.orchestrator.engine.domain import (
    FinishReason,
    GenerationRequest,
    SchedulerConfig,
    ServedModel,
    StageLayout,
)
from services.orchestrator.engine.serving import ServingConfig, ServingEngine
from tests.unit.orchestrator.fakes import FakePipeline

SERVED = ServedModel("tiny", 256, 420, (StageLayout(0, 2, 10), StageLayout(2, 4, 10)))


def req(rid: str, max_tokens: int = 6, deadline_ns: int | None = None) -> GenerationRequest:
    return GenerationRequest(rid, (5, 6, 7), max_tokens, deadline_budget_ns=deadline_ns)


def engine(text_context, pipeline, capacity: int = 16, max_live: int = 64) -> ServingEngine:
    config = ServingConfig(scheduler=SchedulerConfig(output_queue_capacity=capacity),
                           max_live_requests=max_live)
    return ServingEngine(pipeline, SERVED, text_context, config)


async def collect(stream):
    return [out async for out in stream]


def test_concurrent_requests_complete_with_every_stage_busy(text_context):
    async def main():
        pipeline = FakePipeline(2)
        eng = engine(text_context, pipeline)
        streams = [eng.submit(req(f"r{i}", max_tokens=3 + i)) for i in range(8)]
        results = await asyncio.gather(*(collect(s) for s in streams))
        await eng.wait_idle()
        return pipeline, results

    pipeline, results = asyncio.run(main())
    for i, events in enumerate(results):
        assert events[-1].finish_reason is FinishReason.LENGTH
        assert events[-1].completion_tokens == 3 + i
        assert sum(len(e.token_ids) for e in events) == 3 + i
    assert pipeline.max_inflight >= 2
    assert pipeline.stages.live_kv() == [0, 0]


def test_a_burst_submitted_in_one_loop_turn_is_prefilled_and_decoded_together(text_context):
    """One stage, one microbatch slot: the burst's prompts share one prefill, then every
    decode step carries all of them (none runs ahead alone)."""
    one_stage = ServedModel("tiny", 256, 420, (StageLayout(0, 4, 10),))

    async def main():
        pipeline = FakePipeline(1)
        eng = ServingEngine(pipeline, one_stage, text_context, ServingConfig())
        streams = [eng.submit(req(f"r{i}", max_tokens=4)) for i in range(8)]
        results = await asyncio.gather(*(collect(s) for s in streams))
        await eng.wait_idle()
        return pipeline, results

    pipeline, results = asyncio.run(main())
    assert all(events[-1].completion_tokens == 4 for events in results)
    batches = pipeline.stages.executed_batches
    assert [(b.phase.value, len(b.slices)) for b in batches] == [("prefill", 8)] + [("decode", 8)] * 3
    assert pipeline.stages.live_kv() == [0]


def test_slow_reader_stalls_only_its_own_decode(text_context):
    async def main():
        pipeline = FakePipeline(2)
        eng = engine(text_context, pipeline, capacity=2)
        slow = eng.submit(req("slow", max_tokens=20))
        fast_events = await collect(eng.submit(req("fast", max_tokens=20)))
        slow_steps = sum(1 for b in pipeline.stages.executed_batches for s in b.slices
                         if s.request_id == "slow")
        assert eng.admission.holds("slow")  # a stalled request keeps its admission
        slow_events = await collect(slow)
        return fast_events, slow_steps, slow_events

    fast_events, slow_steps, slow_events = asyncio.run(main())
    assert fast_events[-1].completion_tokens == 20
    assert slow_steps == 2  # two events fill the stream; decode stops there
    assert slow_events[-1].completion_tokens == 20


def test_cancel_mid_stream_finishes_after_release_on_every_stage(text_context):
    async def main():
        pipeline = FakePipeline(2)
        eng = engine(text_context, pipeline)
        stream = eng.submit(req("a", max_tokens=1000))
        first = await stream.next()
        assert stream.cancel()
        rest = await collect(stream)
        await eng.wait_idle()
        return first, rest, pipeline, eng

    first, rest, pipeline, eng = asyncio.run(main())
    assert first.finish_reason is None
    assert rest[-1].finish_reason is FinishReason.CANCELLED
    assert pipeline.stages.live_kv() == [0, 0]
    (retired,) = eng.retired
    assert retired.released_stage_epochs == pipeline.stages.released["a"]
    assert retired.released_stage_epochs[0] >= 1


def test_deadline_budget_expires_a_stalled_request(text_context):
    async def main():
        eng = engine(text_context, FakePipeline(2), capacity=1)
        stream = eng.submit(req("a", max_tokens=1000, deadline_ns=2_000_000))
        return await collect(stream)

    events = asyncio.run(main())
    assert events[-1].finish_reason is FinishReason.DEADLINE


def test_failed_microbatch_fails_its_requests_and_releases(text_context):
    class Broken(FakePipeline):
        async def submit(self, batch):
            if batch.phase.value == "decode":
                raise ConnectionError("stage 1 unreachable")
            return await super().submit(batch)

    async def main():
        pipeline = Broken(2)
        eng = engine(text_context, pipeline)
        events = await collect(eng.submit(req("a")))
        await eng.wait_idle()
        return events, pipeline

    events, pipeline = asyncio.run(main())
    assert events[-1].finish_reason is FinishReason.ERROR
    # The client learns what failed, never the peer's own words (they may name addresses).
    assert events[-1].error == "the pipeline failed (ConnectionError)"
    assert pipeline.stages.live_kv() == [0, 0]


def test_stage_budgets_come_from_the_served_model(text_context):
    import pytest

    from services.orchestrator.engine.admission import KvNeverFits

    served = ServedModel("tiny", 256, 420, (StageLayout(0, 2, 10, 10_000),
                                            StageLayout(2, 4, 10, 500)))

    async def main():
        eng = ServingEngine(FakePipeline(2), served, text_context)
        with pytest.raises(KvNeverFits, match="stage 1"):
            eng.submit(req("big", max_tokens=100))  # 103 tokens: 7 blocks; 500 bytes hold 3 on stage 1
        return await collect(eng.submit(req("small", max_tokens=40)))

    assert asyncio.run(main())[-1].completion_tokens == 40


def test_metrics_count_admissions_rejections_and_tokens(text_context):
    from prometheus_client import REGISTRY

    from libs.service.errors import ResourceExhausted

    def sample(name, **labels):
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before = (sample("fornax_admissions_total"),
              sample("fornax_admission_rejections_total", reason="CAPACITY"),
              sample("fornax_generated_tokens_total"),
              sample("fornax_ttft_seconds_count"))

    async def main():
        eng = engine(text_context, FakePipeline(2), max_live=1)
        stream = eng.submit(req("m1", max_tokens=5))
        try:
            eng.submit(req("m2"))
        except ResourceExhausted:
            pass
        await collect(stream)

    asyncio.run(main())
    after = (sample("fornax_admissions_total"),
             sample("fornax_admission_rejections_total", reason="CAPACITY"),
             sample("fornax_generated_tokens_total"),
             sample("fornax_ttft_seconds_count"))
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1, 5, 1]


def test_close_gives_up_on_releases_that_cannot_complete(text_context):
    class DeadStage(FakePipeline):
        async def release(self, request_id, publish_token_ids=()):
            raise ConnectionError("stage 1 is gone")

    async def main():
        pipeline = DeadStage(2)
        eng = engine(text_context, pipeline)
        stream = eng.submit(req("a", max_tokens=1000))
        await stream.next()
        await eng.close(release_timeout_s=0.2)
        return eng.live_requests, eng.admission.snapshot().live_requests, list(eng.retired)

    live, admitted, retired = asyncio.run(main())
    # The release was abandoned: the request retired without stage epochs, its slot is free.
    assert (live, admitted) == (0, 0)
    assert [(r.request_id, r.released_stage_epochs) for r in retired] == [("a", ())]


def test_a_stage_refusal_is_a_capacity_error(text_context):
    from services.orchestrator.engine.domain import SequenceStatus, failed_result
    from services.orchestrator.engine.serving import terminal_error

    class Refusing(FakePipeline):
        async def submit(self, batch):
            return tuple(failed_result(s, "KV full", status=SequenceStatus.REJECTED, error_code="ADMISSION")
                         for s in batch.slices)

    async def main():
        eng = engine(text_context, Refusing(2))
        return await collect(eng.submit(req("a")))

    final = asyncio.run(main())[-1]
    assert final.finish_reason is FinishReason.REJECTED
    error = terminal_error(final)
    assert error.reason == "CAPACITY" and "KV full" in error.message


def test_cancelling_an_in_flight_request_tells_the_stages_at_once(text_context):
    async def main():
        pipeline = FakePipeline(2)
        eng = engine(text_context, pipeline)
        stream = eng.submit(req("a", max_tokens=1000))
        await stream.next()
        pipeline.gate.clear()  # hold the next microbatch in flight
        await asyncio.sleep(0)
        assert eng.scheduler.is_inflight("a")
        stream.cancel()
        await asyncio.sleep(0)
        told = list(pipeline.cancelled)
        pipeline.gate.set()
        final = [o async for o in stream][-1]
        await eng.wait_idle()
        return told, final, pipeline

    told, final, pipeline = asyncio.run(main())
    assert told == ["a"]
    assert final.finish_reason is FinishReason.CANCELLED
    assert pipeline.stages.live_kv() == [0, 0]
