"""The in-process reference commits KV in the networked route's order: run every stage, then commit."""

from __future__ import annotations

import asyncio
import uuid

from libs.model.config import load_config
from libs.model.executor import StageExecutor, StageSpec
from libs.model.kernels import make_kernels
from libs.model.layout import even_layer_split
from libs.model.sampling import GREEDY
from libs.model.weights import load_stage_weights
from services.orchestrator.engine.domain import Microbatch, Phase, SequenceStatus, request_slice
from services.orchestrator.engine.model_card import served_model
from services.orchestrator.route.inprocess_pipeline import InProcessPipeline
from tests.integration.orchestrator.harness import tiny_checkpoint

KV_LIMIT_BYTES = 64 << 20


def _executors(checkpoint, stages: int):
    cfg = load_config(checkpoint)
    ranges = even_layer_split(cfg.num_hidden_layers, stages)
    executors = []
    for index, (start, end) in enumerate(ranges):
        first, last = index == 0, index == stages - 1
        weights = load_stage_weights(checkpoint, cfg, start, end, first, last)
        spec = StageSpec(start, end, first, last, KV_LIMIT_BYTES)
        executors.append(StageExecutor(cfg, spec, make_kernels("numpy", cfg, weights)))
    return executors, served_model(cfg, ranges, "tiny", KV_LIMIT_BYTES)


def _step(request_id: str, sequence_no: int, tokens: tuple[int, ...], position: int, epoch: int,
          phase: Phase) -> Microbatch:
    piece = request_slice(request_id, sequence_no, tokens, position, epoch, None, GREEDY, sequence_no,
                          len(tokens) + 8)
    return Microbatch(sequence_no, 0, phase, (piece,))


def test_a_later_stage_failure_leaves_every_earlier_stage_epoch_unchanged(tmp_path):
    executors, served = _executors(tiny_checkpoint(tmp_path / "tiny"), 2)
    pipeline = InProcessPipeline(executors, served)
    request_id = str(uuid.uuid4())
    key = (request_id, pipeline.lease_id(request_id))

    async def scenario():
        prefill = await pipeline.submit(_step(request_id, 0, (1, 2, 3), 0, 0, Phase.PREFILL))
        # The last stage loses the sequence (as a restarted stage would); stage 0 still holds it.
        executors[1].release(*key)
        decode = await pipeline.submit(_step(request_id, 1, (prefill[0].sampled_token_id,),
                                             3, 1, Phase.DECODE))
        await pipeline.close()
        return prefill[0], decode[0]

    prefill, decode = asyncio.run(scenario())
    assert (prefill.status, prefill.kv_epoch_after) == (SequenceStatus.OK, 1)
    assert prefill.sequence.identity == key  # the FNX2 result of the slice the route's lease ran
    assert decode.status is SequenceStatus.FAILED and "stage 1" in decode.error
    assert executors[0].kv.epoch(key) == 1  # stage 0 ran the decode but did not commit it
