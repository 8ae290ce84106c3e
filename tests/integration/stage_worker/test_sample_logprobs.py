"""FNX2 extension `sample_logprobs` across two stage-worker processes: a peer that negotiated
it gets fp32 sample records (token, logprob, top pairs) relayed through the middle stage; a
plain peer gets int32 token ids for the same request, the middle stage dropping the records."""

from __future__ import annotations

import asyncio
import uuid

import numpy as np
import pytest

from libs.fnx2.channel.sender import Fnx2Client, SenderConfig
from libs.fnx2.wire.control import EXT_COMPACT_META, EXT_SAMPLE_LOGPROBS, KNOWN_EXTENSIONS, ChannelBinding
from libs.fnx2.wire.messages import Phase
from libs.model.config import load_config
from libs.model.logprobs import RECORD_WIDTH, decode_record
from libs.model.sampling import SamplingParams
from services.orchestrator.route.stage_chain import Route, route_slice
from tests.integration.stage_worker.test_stage_pipeline import BUDGET_NS, local_greedy
from tests.support.stages import load_pipeline

pytestmark = pytest.mark.integration
PROMPT = np.array([5, 17, 42, 9], np.int32)


async def _prefill(route: Route, plain_peer: bool) -> np.ndarray:
    if plain_peer:  # reconnect stage 0 offering every extension but sample_logprobs
        await route._client.close()
        first = route.plan.stages[0]
        binding = ChannelBinding(route.plan.plan_id, route.plan.plan_hash, first.manifest_hash,
                                 "stage-0", route.plan.plan_generation_id)
        host, _, port = first.data_plane_address.rpartition(":")
        route._client = await Fnx2Client.connect(host, int(port), SenderConfig(
            binding, offer_extensions=KNOWN_EXTENSIONS - {EXT_SAMPLE_LOGPROBS}))
    rid = str(uuid.uuid4())
    await route.admit(rid, 16, SamplingParams(top_logprobs=3))
    ((out, rows),) = await route.run(Phase.PREFILL, [route_slice(route.plan, rid, 0, 0, 0, len(PROMPT), BUDGET_NS)],
                                     PROMPT)
    await route.release(rid)
    assert rows is not None, (out.error_code, out.error_message)
    return rows


def test_records_for_a_negotiating_peer_token_ids_for_a_plain_one(checkpoint, two_workers):
    cfg = load_config(checkpoint)
    plan = load_pipeline(two_workers, checkpoint, cfg.num_hidden_layers, boundary="fp32")
    (expected,), _, _ = local_greedy(checkpoint, [PROMPT], steps=0)

    async def scenario():  # one route per plan generation: its lease numbers only go up
        route = Route(plan)
        await route.open()
        try:
            return [await _prefill(route, plain) for plain in (False, True)]
        finally:
            await route.close()

    records, plain = asyncio.run(scenario())
    assert records.dtype == np.float32 and records.shape == (1, RECORD_WIDTH)
    record = decode_record(records[0], 3)
    assert record.token_id == expected[0] and len(record.top) == 3
    assert record.top[0][0] == record.token_id  # greedy: the sampled token is the likeliest
    assert record.logprob == pytest.approx(record.top[0][1]) and record.logprob < 0
    assert plain.dtype == np.int32 and plain.tolist() == [expected[0]]


def test_the_gateway_hop_negotiates_compact_metadata_and_a_plain_gateway_gets_the_same_tokens(
        checkpoint, two_workers):
    cfg = load_config(checkpoint)
    plan = load_pipeline(two_workers, checkpoint, cfg.num_hidden_layers, boundary="fp32")
    (expected,), _, _ = local_greedy(checkpoint, [PROMPT], steps=0)

    async def tokens(route: Route, offer: frozenset[str]) -> tuple[frozenset[str], list[int]]:
        if offer != KNOWN_EXTENSIONS:
            await route._client.close()
            first = route.plan.stages[0]
            binding = ChannelBinding(route.plan.plan_id, route.plan.plan_hash,
                                     first.manifest_hash, "stage-0", route.plan.plan_generation_id)
            host, _, port = first.data_plane_address.rpartition(":")
            route._client = await Fnx2Client.connect(host, int(port), SenderConfig(
                binding, offer_extensions=offer))
        negotiated = route._client.extensions
        rid = str(uuid.uuid4())
        await route.admit(rid, 16, SamplingParams())
        ((out, rows),) = await route.run(Phase.PREFILL, [route_slice(route.plan, rid, 0, 0, 0, len(PROMPT), BUDGET_NS)],
                                         PROMPT)
        await route.release(rid)
        assert rows is not None, (out.error_code, out.error_message)
        return negotiated, rows.tolist()

    async def scenario():  # one route per plan generation: its lease numbers only go up
        route = Route(plan)
        await route.open()
        try:
            return (await tokens(route, KNOWN_EXTENSIONS),
                    await tokens(route, KNOWN_EXTENSIONS - {EXT_COMPACT_META}))
        finally:
            await route.close()

    (compact_ext, compact_rows), (plain_ext, plain_rows) = asyncio.run(scenario())
    assert EXT_COMPACT_META in compact_ext and EXT_COMPACT_META not in plain_ext
    assert compact_rows == plain_rows == [expected[0]]
