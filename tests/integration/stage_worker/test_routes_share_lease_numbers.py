"""Lease numbers (FNX2 `lease_sequence`) belong to the plan generation, not to a `Route`:
two routes opened on one generation serve side by side, and a route whose counter starts
from nothing (as in an orchestrator restarted onto the generation) starts above what stage 0
has seen, so none of their leases is fenced as ended."""

from __future__ import annotations

import asyncio
import uuid

import numpy as np
import pytest

from libs.fnx2 import Phase, SequenceResult, SequenceStatus
from libs.model.config import load_config
from libs.model.sampling import SamplingParams
from services.orchestrator.route.lease_numbers import LeaseNumbers
from services.orchestrator.route.stage_chain import Route, route_slice
from tests.integration.stage_worker.test_stage_pipeline import BUDGET_NS, local_greedy
from tests.support.stages import load_pipeline

pytestmark = pytest.mark.integration
PROMPT = np.array([5, 17, 42, 9], np.int32)


async def _prefill(route: Route) -> tuple[SequenceResult, np.ndarray | None]:
    rid = str(uuid.uuid4())
    await route.admit(rid, 16, SamplingParams())
    try:
        (out,) = await route.run(Phase.PREFILL, [route_slice(route.plan, rid, 0, 0, 0, len(PROMPT), BUDGET_NS)],
                                 PROMPT)
    finally:
        await route.release(rid)
    return out


async def _first_token(route: Route) -> int:
    out, rows = await _prefill(route)
    assert rows is not None, (out.error_code, out.error_message)
    return int(rows[0])


def test_two_routes_on_one_generation_serve_side_by_side(checkpoint, two_workers):
    cfg = load_config(checkpoint)
    plan = load_pipeline(two_workers, checkpoint, cfg.num_hidden_layers, boundary="fp32")
    (expected,), _, _ = local_greedy(checkpoint, [PROMPT], steps=0)

    async def scenario():
        first, second = Route(plan), Route(plan)
        await first.open()
        await second.open()
        try:
            tokens = []
            for _ in range(3):  # alternately, then both at once
                tokens.append(await _first_token(first))
                tokens.append(await _first_token(second))
            tokens += await asyncio.gather(*(_first_token(r) for r in (first, second, first, second)))
            # A route opened later, with a counter of its own that starts at 0 (another
            # process's): stage 0's ACK raises it above the 10 numbers already used.
            restarted_numbers = LeaseNumbers()
            third = Route(plan, numbers=restarted_numbers)
            await third.open()
            try:
                floor = restarted_numbers.next
                tokens.append(await _first_token(third))
                tokens.append(await _first_token(third))
                # Two counters numbering one generation at once collide: the stage refuses
                # the reused number (fails closed), it never serves a lease twice.
                collided, _ = await _prefill(first)
            finally:
                await third.close()
            return tokens, floor, collided
        finally:
            await first.close()
            await second.close()

    tokens, floor, collided = asyncio.run(scenario())
    assert tokens == [expected[0]] * 12
    assert floor == 10  # the ten leases the first two routes numbered 0..9
    assert (collided.status is SequenceStatus.OK, collided.error_code) == (False, "RELEASED")
    assert "lease-sequence watermark" in collided.error_message
