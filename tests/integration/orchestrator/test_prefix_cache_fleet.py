"""Prefix reuse through two real stage-worker processes (gRPC admission, FNX2 data plane) and the
OpenAI HTTP API, driven by the `openai` client: a multi-turn chat reports growing
`cached_tokens` with the same greedy text as with the cache off; a turn reuses the previous
turn's output blocks and a prompt longer than the prefill row budget reuses past its first
chunk; tenants do not share under `tenant` and do under `global`; forged admission chains are
refused and change nothing."""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid

import grpc
import openai
import pytest

from fornax.stage_worker.v1 import stage_worker_pb2 as sw_pb
from libs.model.config import load_config
from libs.model.kv_blocks import KV_BLOCK_TOKENS as B
from libs.model.kv_blocks import prefix_chain
from libs.model.layout import even_layer_split
from libs.service.interceptors import reason_of
from libs.text.context import TextContext
from services.orchestrator.api.http_api import build_http_app, start_http
from services.orchestrator.engine.domain import GenerationRequest, SamplingParams, SchedulerConfig
from services.orchestrator.engine.model_card import served_model
from services.orchestrator.engine.prefix_salt import PrefixPolicy, prefix_salt
from services.orchestrator.engine.route_slot import RouteSlot
from services.orchestrator.engine.serving import ServingConfig, ServingEngine
from services.orchestrator.route.direct_load import load_checkpoint_route
from services.orchestrator.route.route_pipeline import RoutePipeline
from services.orchestrator.route.stage_chain import Route, lease_id_for
from tests.support.stages import load_pipeline, start_workers

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SYSTEM = ("You are a careful assistant for a distributed inference engine. Answer briefly, "
          "name the stage that holds each layer, and never invent numbers you did not measure.")
TURNS = ("How many stages serve this model?", "Which stage holds the first layers?",
         "What does the second stage send back?", "Summarise the route in one line.")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, checkpoint):
    workers = start_workers(2, tmp_path_factory.mktemp("prefix"))
    try:
        plan = load_pipeline(workers, checkpoint, load_config(checkpoint).num_hidden_layers)
        yield workers, plan
    finally:
        workers.stop()


@contextlib.asynccontextmanager
async def serving(plan, checkpoint, policy: PrefixPolicy):
    cfg = load_config(checkpoint)
    served = served_model(cfg, even_layer_split(cfg.num_hidden_layers, 2), "tiny")
    route = Route(plan)
    await route.open()
    engine = ServingEngine(RoutePipeline(route, served), served, TextContext.from_checkpoint(checkpoint),
                           ServingConfig(prefix_cache=policy))
    slot = RouteSlot()
    slot.engine = engine
    runner, port = await start_http(build_http_app(slot), "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()
        await engine.close()


async def chat(base_url: str, key: str, messages: list[dict]) -> tuple[str, int, int]:
    client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0)
    reply = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=6,
                                                 temperature=0)
    usage = reply.usage
    return reply.choices[0].message.content, usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens


async def conversation(base_url: str, key: str) -> list[tuple[str, int, int]]:
    messages = [{"role": "system", "content": SYSTEM}]
    turns = []
    for question in TURNS:
        messages.append({"role": "user", "content": question})
        text, prompt, cached = await chat(base_url, key, messages)
        turns.append((text, prompt, cached))
        messages.append({"role": "assistant", "content": text})
    return turns


def test_multi_turn_chat_reuses_a_growing_prefix_with_the_same_greedy_text(fleet, checkpoint):
    _, plan = fleet

    async def main():
        async with serving(plan, checkpoint, PrefixPolicy.OFF) as url:
            off = await conversation(url, "tenant-a")
        async with serving(plan, checkpoint, PrefixPolicy.TENANT) as url:
            on = await conversation(url, "tenant-a")
        return off, on

    off, on = asyncio.run(main())
    assert [t[0] for t in on] == [t[0] for t in off]  # greedy text identical, cache on and off
    assert [t[2] for t in off] == [0] * len(TURNS)
    cached = [t[2] for t in on]
    assert cached[0] == 0
    assert all(later > earlier for earlier, later in zip(cached, cached[1:], strict=False))  # grows
    for (_, prompt, hit), (_, previous_prompt, _) in zip(on[1:], on, strict=False):
        assert hit % B == 0 and B <= hit < prompt
        # Only committed blocks of the earlier prompt and its reply (6 tokens, 5 fed back) can be hit.
        assert hit <= previous_prompt + 5


async def _token_turns(plan, checkpoint, policy: PrefixPolicy, turns: int) -> list[tuple[int, int, tuple[int, ...]]]:
    """A token-id conversation on an engine with a 32-row prefill budget: each turn sends every
    earlier prompt and output plus 42 new tokens (so each turn's fed outputs complete a block);
    (prompt tokens, cached tokens, output) per turn."""
    cfg = load_config(checkpoint)
    served = served_model(cfg, even_layer_split(cfg.num_hidden_layers, 2), "tiny")
    route = Route(plan)
    await route.open()
    config = ServingConfig(prefix_cache=policy, scheduler=SchedulerConfig(max_prefill_rows_per_microbatch=32))
    engine = ServingEngine(RoutePipeline(route, served), served, TextContext.from_checkpoint(checkpoint), config)
    salt = prefix_salt(policy, "tiny", "tokenizer", f"tokens-{uuid.uuid4()}")
    context: tuple[int, ...] = ()
    out = []
    try:
        for turn in range(turns):
            prompt = context + tuple(range(10 + turn, 52 + turn))
            request = GenerationRequest(str(uuid.uuid4()), prompt, 7, SamplingParams(temperature=0.0),
                                        ignore_eos=True, prefix_salt=salt)
            produced, cached = [], 0
            async for output in engine.submit(request):
                produced.extend(output.token_ids)
                cached = output.cached_tokens
            await engine.wait_idle()  # every stage has released (and published) the turn
            out.append((len(prompt), cached, tuple(produced)))
            context = prompt + tuple(produced)
    finally:
        await engine.close()
    return out


def test_a_turn_reuses_the_previous_turns_output_blocks_past_the_first_chunk(fleet, checkpoint):
    _, plan = fleet
    off = asyncio.run(_token_turns(plan, checkpoint, PrefixPolicy.OFF, 4))
    on = asyncio.run(_token_turns(plan, checkpoint, PrefixPolicy.TENANT, 4))
    assert [t[2] for t in on] == [t[2] for t in off] and all(len(t[2]) == 7 for t in on)
    assert [t[1] for t in off] == [0] * 4
    # Turn k+1 holds turn k's prompt and 6 fed outputs: every full block of them is reused,
    # though the prompts outgrow the 32-row first chunk.
    assert [c for _, c, _ in on] == [0] + [((p + 6) // B) * B for p, _, _ in on[:-1]]
    assert on[-1][0] > 4 * 32


def test_tenants_do_not_share_under_tenant_and_do_under_global(fleet, checkpoint):
    _, plan = fleet
    messages = [{"role": "system", "content": SYSTEM + " Isolation check."},
                {"role": "user", "content": "Which tenant sent this prompt?"}]

    async def main():
        async with serving(plan, checkpoint, PrefixPolicy.TENANT) as url:
            alice_first = await chat(url, "alice", messages)
            alice_again = await chat(url, "alice", messages)
            bob = await chat(url, "bob", messages)
        async with serving(plan, checkpoint, PrefixPolicy.GLOBAL) as url:
            global_alice = await chat(url, "alice", messages)
            global_bob = await chat(url, "bob", messages)
        return alice_first, alice_again, bob, global_alice, global_bob

    alice_first, alice_again, bob, global_alice, global_bob = asyncio.run(main())
    assert alice_first[2] == 0 and alice_again[2] > 0
    assert bob[2] == 0  # another credential never hits alice's blocks
    assert global_alice[2] == 0 and global_bob[2] > 0  # one global salt: shared
    assert {alice_first[0], alice_again[0], bob[0], global_alice[0], global_bob[0]} == {alice_first[0]}


def test_forged_admission_chains_are_refused_and_serve_nothing_wrong(fleet, checkpoint):
    workers, plan = fleet
    rng = random.Random(11)
    stubs = [workers.stub(i) for i in range(2)]
    messages = [{"role": "system", "content": SYSTEM + " Fuzz check."},
                {"role": "user", "content": "Repeat the route."}]

    async def reference():
        async with serving(plan, checkpoint, PrefixPolicy.TENANT) as url:
            first = await chat(url, "fuzz", messages)
            second = await chat(url, "fuzz", messages)
        return first, second

    async def after_fuzz():
        async with serving(plan, checkpoint, PrefixPolicy.TENANT) as url:
            return await chat(url, "fuzz", messages)

    first, second = asyncio.run(reference())
    assert second[2] > 0 and second[0] == first[0]
    victim = list(range(4 * B))
    refused = 0
    for _ in range(40):
        n = rng.randrange(0, 6 * B)
        tokens = [rng.randrange(0, 200) for _ in range(n)]
        salt = rng.choice([b"fuzz", rng.randbytes(rng.randrange(1, 40))])
        chain = rng.choice([
            prefix_chain(salt, victim[: (n // B) * B]),          # another prompt's hashes
            [rng.randbytes(32) for _ in range(n // B + rng.randrange(0, 2))],
            (prefix_chain(salt, tokens)[:1] or [rng.randbytes(32)]) * max(1, n // B),
        ])
        if chain == prefix_chain(salt, tokens):
            continue
        rid = str(uuid.uuid4())
        request = sw_pb.AdmitSequenceRequest(
            request_id=str(uuid.uuid4()), target_request_id=rid, execution_lease_id=lease_id_for(plan, rid),
            reserve_tokens=max(n, 1) + 8, plan_generation_id=plan.plan_generation_id,
            output_mode=sw_pb.OUTPUT_MODE_SAMPLED_TOKENS,
            prefix_salt=salt, prefix_token_ids=tokens, prefix_block_hashes=chain)
        for stub in stubs:
            with pytest.raises(grpc.RpcError) as err:
                stub.AdmitSequence(request, timeout=30)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert reason_of(err.value) == "PREFIX_CHAIN"
            refused += 1
    assert refused > 40
    health = [stub.GetHealth(sw_pb.GetHealthRequest(), timeout=30) for stub in stubs]
    assert all(h.live_sequences == 0 and h.kv_blocks_total > 0 and h.kv_block_tokens == B for h in health)
    again = asyncio.run(after_fuzz())
    assert again[0] == first[0] and again[2] == second[2]  # the honest prefix still serves right


def test_a_bf16_kv_route_halves_block_bytes_and_reuses_prefixes(fleet, checkpoint):
    workers, wide = fleet
    layers = load_config(checkpoint).num_hidden_layers
    wide_health = [workers.stub(i).GetHealth(sw_pb.GetHealthRequest(plan_generation_id=wide.plan_generation_id),
                                             timeout=30) for i in range(2)]
    narrow = load_checkpoint_route(workers.addresses, str(checkpoint), layers, timeout_s=600, kv_dtype="bf16")

    async def main():
        async with serving(narrow, checkpoint, PrefixPolicy.TENANT) as url:
            return await conversation(url, "tenant-bf16")

    turns = asyncio.run(main())
    health = [workers.stub(i).GetHealth(sw_pb.GetHealthRequest(plan_generation_id=narrow.plan_generation_id),
                                        timeout=30) for i in range(2)]
    for h in health:
        assert h.kv_block_tokens == B and h.prefix_hit_blocks > 0
    # The wide route (loaded first, fp32 KV) holds twice the bytes per block of the bf16 one.
    for wide, thin in zip(wide_health, health, strict=True):
        assert wide.kv_bytes_limit // wide.kv_blocks_total == 2 * (thin.kv_bytes_limit // thin.kv_blocks_total)
    cached = [t[2] for t in turns]
    assert cached[0] == 0 and all(b > a for a, b in zip(cached, cached[1:], strict=False))
    with pytest.raises(grpc.RpcError) as err:
        load_checkpoint_route(workers.addresses, str(checkpoint), layers, timeout_s=600, kv_dtype="fp4")
    assert "KV_DTYPE" in str(err.value) or reason_of(err.value) == "KV_DTYPE"
