"""The serving core over real stage-worker processes (FNX2 data plane, gRPC control)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from fornax.stage_worker.v1 import stage_worker_pb2 as sw_pb
from libs.model.config import load_config
from libs.model.layout import even_layer_split
from libs.text.context import TextContext
from services.orchestrator.engine.domain import (
    FinishReason,
    GenerationRequest,
    SamplingParams,
    SchedulerConfig,
)
from services.orchestrator.engine.model_card import served_model
from services.orchestrator.engine.serving import ServingConfig, ServingEngine
from services.orchestrator.route.route_pipeline import RoutePipeline
from services.orchestrator.route.stage_chain import Route
from tests.integration.orchestrator.test_greedy_parity import NEW_TOKENS, served_greedy
from tests.support.stages import load_pipeline, start_workers

pytestmark = [pytest.mark.integration, pytest.mark.slow]
LONG = str(uuid.uuid4())


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    fleet = start_workers(2, tmp_path_factory.mktemp("route"))
    yield fleet
    fleet.stop()


def test_route_pipeline_serves_like_the_in_process_pipeline(checkpoint, workers):
    cfg = load_config(checkpoint)
    plan = load_pipeline(workers, checkpoint, cfg.num_hidden_layers, boundary="fp32")
    served = served_model(cfg, even_layer_split(cfg.num_hidden_layers, 2), "tiny")
    text = TextContext.from_checkpoint(checkpoint)
    prompts = [text.tokenizer.encode(p) for p in ("Mixture of experts", "Stages", "abc")]

    async def main():
        route = Route(plan)
        await route.open()
        # Three-row prefill chunks: prompts continue their prefill over FNX2.
        config = ServingConfig(SchedulerConfig(max_prefill_rows_per_microbatch=3))
        engine = ServingEngine(RoutePipeline(route, served), served, text, config)
        streams = [engine.submit(GenerationRequest(str(uuid.uuid4()), tuple(ids), NEW_TOKENS))
                   for ids in prompts]
        tokens = [[t async for out in s for t in out.token_ids] for s in streams]
        long = engine.submit(GenerationRequest(LONG, (5, 6, 7), 1000,
                                               SamplingParams(temperature=0.9, seed=3)))
        await long.next()
        long.cancel()
        final = [out async for out in long][-1]
        await engine.wait_idle()
        health = await route.health()
        await engine.close()
        return tokens, final, health, list(engine.retired)

    tokens, final, health, retired = asyncio.run(main())
    assert tokens == served_greedy(checkpoint, 2, prompts)
    assert final.finish_reason is FinishReason.CANCELLED
    assert [h.live_sequences for h in health] == [0, 0]
    assert [h.kv_bytes_used for h in health] == [0, 0]
    assert all(h.state == sw_pb.STAGE_STATE_READY for h in health)
    cancelled = next(r for r in retired if r.request_id == LONG)
    assert len(cancelled.released_stage_epochs) == 2
