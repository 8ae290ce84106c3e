"""One stage worker holds two plan generations at once: a new plan's range loads beside the
serving one, each generation serves its own FNX2 channels and control calls, and unloading one
leaves the other serving. A second generation that would not fit in memory is refused."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from fornax.stage_worker.v1 import stage_worker_pb2 as pb
from libs.model.config import load_config
from libs.service.interceptors import reason_of
from services.orchestrator.route.direct_load import checkpoint_stage_loads
from services.orchestrator.route.stage_chain import Route, load_route, unload_generation
from tests.integration.stage_worker.test_stage_pipeline import PROMPTS, generate, local_greedy

pytestmark = pytest.mark.integration
STEPS = 5


def loads_for(two_workers, checkpoint, ranges, **spec_changes):
    loads = checkpoint_stage_loads(two_workers.addresses, str(checkpoint), ranges, backends=["numpy", "numpy"])
    for load in loads:
        for name, value in spec_changes.items():
            setattr(load.spec, name, value)
    return loads


def health(two_workers, index: int, generation: str = "") -> pb.GetHealthResponse:
    return two_workers.stub(index).GetHealth(pb.GetHealthRequest(plan_generation_id=generation), timeout=10)


def test_two_generations_serve_side_by_side_and_unload_apart(two_workers, checkpoint):
    layers = load_config(checkpoint).num_hidden_layers
    expected, _, _ = local_greedy(checkpoint, PROMPTS, steps=STEPS)

    async def scenario():
        old_plan = await load_route(loads_for(two_workers, checkpoint, [(0, 1), (1, layers)]))
        new_plan = await load_route(loads_for(two_workers, checkpoint, [(0, layers - 1), (layers - 1, layers)]),
                                    keep_generation=old_plan.plan_generation_id)
        old, new = Route(old_plan), Route(new_plan)
        await old.open()
        await new.open()
        runs = await asyncio.gather(generate(old, PROMPTS, STEPS), generate(new, PROMPTS, STEPS))
        loaded = [list(health(two_workers, i).loaded_plan_generation_ids) for i in range(2)]
        # Releases go to each request's own generation; the old one keeps one request live.
        for rid in runs[0][0][1:]:
            await old.release(rid)
        for rid in runs[1][0]:
            await new.release(rid)
        unloaded = await unload_generation(two_workers.addresses, old_plan.plan_generation_id)
        request_ids, after = await generate(new, PROMPTS, STEPS)
        for rid in request_ids:
            await new.release(rid)
        both = [tokens for _, tokens in runs]
        with pytest.raises(Exception):  # noqa: B017  (the old generation's channel was closed)
            await generate(old, PROMPTS, STEPS)
        await old.close()
        await new.close()
        return old_plan, new_plan, both, loaded, unloaded, after

    old_plan, new_plan, both, loaded, unloaded, after = asyncio.run(scenario())
    old_gen, new_gen = old_plan.plan_generation_id, new_plan.plan_generation_id
    assert both[0] == both[1] == expected and after == expected
    assert loaded == [[old_gen, new_gen], [old_gen, new_gen]]
    # Each generation has its own listener on each worker.
    for a, b in zip(old_plan.stages, new_plan.stages, strict=True):
        assert a.data_plane_address != b.data_plane_address
    # What the old generation still held when unloaded: the one request never released.
    assert unloaded.live_sequences == 2 and unloaded.kv_bytes_used > 0 and unloaded.failures == ()
    for index in range(2):
        assert list(health(two_workers, index).loaded_plan_generation_ids) == [new_gen]
        assert health(two_workers, index, old_gen).state == pb.STAGE_STATE_UNLOADED
        current = health(two_workers, index, new_gen)
        assert current.plan.plan_generation_id == new_gen and current.state == pb.STAGE_STATE_READY
        assert current.live_sequences == 0  # every request was released
    asyncio.run(unload_generation(two_workers.addresses, new_gen))


def test_a_second_generation_is_refused_when_memory_or_slots_run_out(two_workers, checkpoint):
    layers = load_config(checkpoint).num_hidden_layers

    async def scenario():
        serving = await load_route(loads_for(two_workers, checkpoint, [(0, 1), (1, layers)]))
        # A KV reserve no host has: refused before anything loads; the serving generation stays.
        with pytest.raises(Exception) as refused:
            await load_route(loads_for(two_workers, checkpoint, [(0, 1), (1, layers)], kv_limit_bytes=1 << 50),
                             keep_generation=serving.plan_generation_id)
        second = await load_route(loads_for(two_workers, checkpoint, [(0, 1), (1, layers)]),
                                  keep_generation=serving.plan_generation_id)
        third = loads_for(two_workers, checkpoint, [(0, 1), (1, layers)])[1]
        third.spec.plan.plan_generation_id = str(uuid.uuid4())
        with pytest.raises(grpc.RpcError) as full:
            two_workers.stub(1).LoadStage(pb.LoadStageRequest(request_id=str(uuid.uuid4()), spec=third.spec),
                                      timeout=30)
        await unload_generation(two_workers.addresses, "")  # every generation
        return serving, second, refused.value, full.value

    serving, second, refused, full = asyncio.run(scenario())
    assert getattr(refused, "reason", None) == "INSUFFICIENT_MEMORY_FOR_OVERLAP"
    assert "stage 1 refused the load" in str(refused) and "the host has" in str(refused)
    assert full.code() is grpc.StatusCode.FAILED_PRECONDITION and reason_of(full) == "GENERATIONS_FULL"
    assert second.plan_generation_id != serving.plan_generation_id
    for index in range(2):
        assert list(health(two_workers, index).loaded_plan_generation_ids) == []
