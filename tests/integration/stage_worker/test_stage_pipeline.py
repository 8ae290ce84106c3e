"""Stage workers as real processes: load a split model, run ragged batches over FNX2 hops,
and compare with the same model run in one process."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import numpy as np
import pytest

from fornax.common.v1 import common_pb2
from fornax.stage_worker.v1 import stage_worker_pb2 as pb
from libs.fnx2.wire.messages import Phase, SequenceStatus
from libs.model.config import load_config
from libs.model.executor import StageBatch, StageExecutor, StageSpec
from libs.model.kernels import make_kernels
from libs.model.kv_store import kv_slice
from libs.model.sampling import SamplingParams
from libs.model.weights import load_stage_weights
from libs.service.errors import ResourceExhausted
from libs.service.interceptors import reason_of
from services.orchestrator.route.stage_chain import Route, route_slice
from tests.support.stages import load_pipeline, start_workers

pytestmark = pytest.mark.integration
BUDGET_NS = 60 * 10**9
PROMPTS = [np.array([5, 17, 42], np.int32), np.array([7, 8, 9, 10, 11], np.int32)]


def local_greedy(checkpoint, prompts, steps):
    """Reference: the whole model in this process, greedy, one sequence at a time."""
    cfg = load_config(checkpoint)
    weights = load_stage_weights(checkpoint, cfg, 0, cfg.num_hidden_layers, True, True)
    executor = StageExecutor(cfg, StageSpec(0, cfg.num_hidden_layers, True, True), make_kernels("numpy", cfg, weights))
    outputs = []
    for prompt in prompts:
        rid, lease = str(uuid.uuid4()), str(uuid.uuid4())
        tokens, ids, pos = [], prompt, 0
        for step in range(steps + 1):
            ident = kv_slice(rid, lease, step, pos, step, len(ids))
            result = executor.execute(StageBatch((ident,), token_ids=ids))
            token = int(np.argmax(result.logits[-1]))
            tokens.append(token)
            pos += len(ids)
            ids = np.array([token], np.int32)
        outputs.append(tokens)
    return outputs, executor, cfg


async def run(route, phase, items):
    """`items`: (request_id, sequence_no, position_start, kv_epoch, token ids) per slice; returns
    each slice's (FNX2 SequenceResult, output rows), in order."""
    slices = [route_slice(route.plan, rid, no, position, epoch, len(ids), BUDGET_NS)
              for rid, no, position, epoch, ids in items]
    return await route.run(phase, slices, np.concatenate([np.asarray(ids, np.int32) for *_, ids in items]))


def ok(answer) -> bool:
    return answer[0].status is SequenceStatus.OK


async def generate(route, prompts, steps, sampling=SamplingParams()):
    request_ids = [str(uuid.uuid4()) for _ in prompts]
    for rid, prompt in zip(request_ids, prompts, strict=True):
        await route.admit(rid, len(prompt) + steps + 1, sampling)
    outputs = await run(route, Phase.PREFILL, [(rid, 0, 0, 0, prompt)
                                               for rid, prompt in zip(request_ids, prompts, strict=True)])
    tokens = [[int(rows[0])] for _, rows in outputs]
    positions = [len(p) for p in prompts]
    for step in range(1, steps + 1):
        outputs = await run(route, Phase.DECODE, [
            (rid, step, positions[i], outputs[i][0].kv_epoch_after, [tokens[i][-1]])
            for i, rid in enumerate(request_ids)])
        assert all(ok(o) for o in outputs), [(o.error_code, o.error_message) for o, _ in outputs]
        for i, (_, rows) in enumerate(outputs):
            tokens[i].append(int(rows[0]))
            positions[i] += 1
    return request_ids, tokens


def test_two_stage_greedy_matches_the_single_process_model(checkpoint, two_workers):
    cfg = load_config(checkpoint)
    plan = load_pipeline(two_workers, checkpoint, cfg.num_hidden_layers, boundary="fp32")
    expected, _, _ = local_greedy(checkpoint, PROMPTS, steps=6)

    async def scenario():
        route = Route(plan)
        await route.open()
        try:
            request_ids, tokens = await generate(route, PROMPTS, steps=6)
            during = await route.health()
            epochs = [await route.release(rid) for rid in request_ids]
            after = await route.health()
            return tokens, during, epochs, after
        finally:
            await route.close()

    tokens, during, epochs, after = asyncio.run(scenario())
    assert tokens == expected
    assert all(h.kv_bytes_used > 0 and h.live_sequences == 2 for h in during)
    assert epochs == [[7, 7], [7, 7]]  # prefill + 6 decodes, on both stages
    assert all(h.kv_bytes_used == 0 and h.live_sequences == 0 for h in after)
    assert all(h.state == pb.STAGE_STATE_READY and h.batches_executed == 7 for h in after)


def test_cancel_stops_a_request_and_keeps_its_epoch(checkpoint, two_workers):
    cfg = load_config(checkpoint)
    plan = load_pipeline(two_workers, checkpoint, cfg.num_hidden_layers, boundary="bf16")

    async def scenario():
        route = Route(plan)
        await route.open()
        try:
            request_ids, _ = await generate(route, PROMPTS[:1], steps=1)
            rid = request_ids[0]
            epochs = await route.cancel(rid)
            late = await run(route, Phase.DECODE, [(rid, 2, 4, 2, [1])])
            return epochs, late[0][0], await route.release(rid)
        finally:
            await route.close()

    epochs, late, released = asyncio.run(scenario())
    assert epochs == [2, 2]
    assert late.status is not SequenceStatus.OK and late.error_code == "CANCELLED"
    assert released == [2, 2]


def test_admission_beyond_kv_capacity_is_refused_and_reserves_nothing(checkpoint, two_workers):
    cfg = load_config(checkpoint)
    plan = load_pipeline(two_workers, checkpoint, cfg.num_hidden_layers)

    async def scenario():
        route = Route(plan)
        await route.open()
        try:
            with pytest.raises(ResourceExhausted) as caught:  # refused in band, on stage 0
                await route.admit(str(uuid.uuid4()), 10**9, SamplingParams())
            await route.admit(str(uuid.uuid4()), 16, SamplingParams())  # room is still there
            return caught.value
        finally:
            await route.close()

    error = asyncio.run(scenario())
    assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.reason == "KV_CAPACITY"
    # The refusal names the blocks: free of total, and how many the request needs.
    assert "KV blocks" in str(error) and f"needs {-(-10**9 // 16)}" in str(error)


def test_load_refuses_a_backend_this_worker_does_not_run(checkpoint, two_workers):
    spec = pb.StageSpec(
        stage_index=0, stage_count=1, layer_range=common_pb2.LayerRange(layer_start=0, layer_end_exclusive=1),
        plan=common_pb2.PlanBinding(plan_id=str(uuid.uuid4()), plan_hash="sha256:" + "0" * 64,
                                    plan_generation_id=str(uuid.uuid4())),
        checkpoint_dir=str(checkpoint), backend=common_pb2.BACKEND_MAX, boundary_dtype=common_pb2.ELEMENT_TYPE_FP32,
        output_mode=pb.OUTPUT_MODE_LOGITS, device="cpu",
    )
    with pytest.raises(grpc.RpcError) as caught:
        two_workers.stub(0).LoadStage(pb.LoadStageRequest(request_id="r", spec=spec), timeout=30)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason_of(caught.value) == "BACKEND_MISMATCH"


def test_load_needs_a_next_hop_on_a_middle_stage(checkpoint, two_workers):
    spec = pb.StageSpec(
        stage_index=0, stage_count=2, layer_range=common_pb2.LayerRange(layer_start=0, layer_end_exclusive=1),
        plan=common_pb2.PlanBinding(plan_id=str(uuid.uuid4()), plan_hash="sha256:" + "0" * 64,
                                    plan_generation_id=str(uuid.uuid4())),
        checkpoint_dir=str(checkpoint), backend=common_pb2.BACKEND_NUMPY, boundary_dtype=common_pb2.ELEMENT_TYPE_FP32,
        device="cpu",
    )
    with pytest.raises(grpc.RpcError) as caught:
        two_workers.stub(0).LoadStage(pb.LoadStageRequest(request_id="r", spec=spec), timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "next_hop" in caught.value.details()


def test_three_stage_logits_match_the_single_process_model(checkpoint, tmp_path):
    cfg = load_config(checkpoint)
    fleet = start_workers(3, tmp_path)
    try:
        plan = load_pipeline(fleet, checkpoint, cfg.num_hidden_layers, boundary="fp32", logits=True)

        async def scenario():
            route = Route(plan)
            await route.open()
            try:
                rid = str(uuid.uuid4())
                await route.admit(rid, 8, SamplingParams(), logits=True)
                return (await run(route, Phase.PREFILL, [(rid, 0, 0, 0, PROMPTS[1])]))[0]
            finally:
                await route.close()

        output = asyncio.run(scenario())
    finally:
        fleet.stop()
    _, executor, _ = local_greedy(checkpoint, [], 0)
    reference = executor.execute(
        StageBatch((kv_slice("r", "l", 0, 0, 0, len(PROMPTS[1])),), token_ids=PROMPTS[1], all_logits=True)
    ).logits
    assert ok(output)
    assert output[1].shape == reference.shape
    np.testing.assert_allclose(output[1], reference, atol=1e-4, rtol=0)


def test_a_cancelled_sequence_between_others_leaves_their_rows_intact(checkpoint, two_workers):
    cfg = load_config(checkpoint)
    plan = load_pipeline(two_workers, checkpoint, cfg.num_hidden_layers, boundary="fp32")
    prompts = [PROMPTS[0], np.array([3, 1, 4, 1, 5], np.int32), PROMPTS[1]]
    expected, _, _ = local_greedy(checkpoint, prompts, steps=1)

    async def scenario():
        route = Route(plan)
        await route.open()
        try:
            ids = [str(uuid.uuid4()) for _ in prompts]
            for rid in ids:
                await route.admit(rid, 8, SamplingParams())
            first = await run(route, Phase.PREFILL, [(r, 0, 0, 0, p) for r, p in zip(ids, prompts, strict=True)])
            await route.cancel(ids[1])
            second = await run(route, Phase.DECODE, [(r, 1, len(p), o.kv_epoch_after, [int(rows[0])])
                                                     for r, p, (o, rows) in zip(ids, prompts, first, strict=True)])
            for rid in ids:
                await route.release(rid)
            return first, second
        finally:
            await route.close()

    first, second = asyncio.run(scenario())
    assert [int(rows[0]) for _, rows in first] == [e[0] for e in expected]
    assert not ok(second[1]) and second[1][0].error_code == "CANCELLED"
    assert [int(second[i][1][0]) for i in (0, 2)] == [expected[0][1], expected[2][1]]


def test_a_failure_further_on_leaves_the_earlier_stage_kv_untouched(checkpoint, two_workers):
    cfg = load_config(checkpoint)
    plan = load_pipeline(two_workers, checkpoint, cfg.num_hidden_layers, boundary="fp32")

    async def scenario():
        route = Route(plan)
        await route.open()
        try:
            rid = str(uuid.uuid4())
            await route.admit(rid, 8, SamplingParams())
            ((_, first),) = await run(route, Phase.PREFILL, [(rid, 0, 0, 0, PROMPTS[0])])
            before = (await route.health())[0].kv_bytes_used
            # Only the final stage drops the request: stage 0 runs the step, stage 1 refuses it.
            two_workers.stub(1).CancelRequest(pb.CancelRequestRequest(request_id="c", target_request_id=rid))
            ((step, _),) = await run(route, Phase.DECODE, [(rid, 1, len(PROMPTS[0]), 1, [int(first[0])])])
            after = (await route.health())[0].kv_bytes_used
            stage0 = two_workers.stub(0).CancelRequest(pb.CancelRequestRequest(request_id="d", target_request_id=rid))
            await route.release(rid)
            return step, before, after, stage0.kv_epoch
        finally:
            await route.close()

    step, before, after, stage0_epoch = asyncio.run(scenario())
    assert step.status is not SequenceStatus.OK and step.error_code == "CANCELLED"
    assert stage0_epoch == 1 and after == before


def test_health_splits_each_stage_wall_time_into_busy_credit_wait_and_input_wait(checkpoint, two_workers):
    import time

    cfg = load_config(checkpoint)
    plan = load_pipeline(two_workers, checkpoint, cfg.num_hidden_layers, boundary="fp32")

    async def scenario():
        route = Route(plan)
        await route.open()
        try:
            before, started = await route.health(), time.monotonic_ns()
            request_ids, _ = await generate(route, PROMPTS, steps=3)
            ended = time.monotonic_ns()  # the workers' own snapshots bracket [started, ended]
            after = await route.health()
            for rid in request_ids:
                await route.release(rid)
            return before, after, ended - started
        finally:
            await route.close()

    before, after, wall_ns = asyncio.run(scenario())
    delta = [{k: getattr(a.phase_totals, k) - getattr(b.phase_totals, k)
              for k in ("busy_ns", "credit_wait_ns", "input_wait_ns", "compute_ns")}
             for b, a in zip(before, after, strict=True)]
    first, last = delta
    assert first["busy_ns"] >= first["compute_ns"] > 0 and last["busy_ns"] >= last["compute_ns"] > 0
    assert first["credit_wait_ns"] > 0  # stage 0 idles while stage 1 works on its batches
    assert last["credit_wait_ns"] == 0  # the final stage hands nothing on
    for d in delta:  # every instant in exactly one state: the three cover the window between the probes
        assert d["busy_ns"] + d["credit_wait_ns"] + d["input_wait_ns"] >= wall_ns
