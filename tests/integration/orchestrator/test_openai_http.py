from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest

from services.orchestrator.api.http_api import HttpConfig
from services.orchestrator.engine.domain import FinishReason
from services.orchestrator.engine.serving import ServingConfig
from tests.integration.orchestrator.harness import MODEL_ID, serve

pytestmark = pytest.mark.integration
GREEDY = {"temperature": 0, "model": MODEL_ID}
MESSAGES = [{"role": "user", "content": "Tell me about experts."}]


def client(base_url: str, key: str = "none") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=60)


def test_streaming_chat_completion_matches_non_streaming(checkpoint):
    async def main():
        async with serve(checkpoint) as served:
            api = client(served.base_url)
            chunks = [c async for c in await api.chat.completions.create(
                messages=MESSAGES, max_tokens=12, stream=True,
                stream_options={"include_usage": True}, **GREEDY)]
            whole = await api.chat.completions.create(messages=MESSAGES, max_tokens=12, **GREEDY)
            return chunks, whole, served.pipeline.live_kv_sequences()

    chunks, whole, _ = asyncio.run(main())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert finishes[-1] in ("stop", "length") and all(f is None for f in finishes[:-1])
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens > 0
    assert text == whole.choices[0].message.content
    assert finishes[-1] == whole.choices[0].finish_reason
    if finishes[-1] == "length":
        assert whole.usage.completion_tokens == 12


def test_streaming_completion_from_text_and_from_token_ids(checkpoint):
    async def main():
        async with serve(checkpoint, stages=1) as served:
            api = client(served.base_url)
            ids = served.engine.text.tokenizer.encode("Mixture of experts")
            by_text = [c async for c in await api.completions.create(
                prompt="Mixture of experts", max_tokens=6, stream=True, **GREEDY)]
            by_ids = await api.completions.create(prompt=ids, max_tokens=6, **GREEDY)
            models = await api.models.list()
            one = await api.models.retrieve(MODEL_ID)
            with pytest.raises(openai.NotFoundError) as missing:
                await api.models.retrieve("other")
            return by_text, by_ids, models, one, missing.value

    by_text, by_ids, models, one, missing = asyncio.run(main())
    assert [m.id for m in models.data] == [MODEL_ID]
    assert one.id == MODEL_ID
    assert missing.body["code"] == "model_not_found"
    assert "".join(c.choices[0].text for c in by_text) == by_ids.choices[0].text
    assert by_text[-1].choices[0].finish_reason == by_ids.choices[0].finish_reason


def test_return_token_ids_gives_each_choice_its_generated_ids(checkpoint):
    async def main():
        async with serve(checkpoint, stages=1) as served:
            api = client(served.base_url)
            tokenizer = served.engine.text.tokenizer
            ids = tokenizer.encode("Mixture of experts")
            extra = {"return_token_ids": True, "ignore_eos": True}
            whole = await api.completions.create(prompt=ids, max_tokens=6, extra_body=extra, **GREEDY)
            chunks = [c async for c in await api.completions.create(
                prompt=ids, max_tokens=6, stream=True, extra_body=extra, **GREEDY)]
            chat = await api.chat.completions.create(messages=MESSAGES, max_tokens=4, extra_body=extra, **GREEDY)
            plain = await api.completions.create(prompt=ids, max_tokens=6, **GREEDY)
            return tokenizer, whole, chunks, chat, plain

    tokenizer, whole, chunks, chat, plain = asyncio.run(main())
    generated = whole.choices[0].model_extra["token_ids"]
    assert len(generated) == 6 and tokenizer.decode(generated) == whole.choices[0].text
    assert [t for c in chunks if c.choices for t in c.choices[0].model_extra["token_ids"]] == generated
    assert len(chat.choices[0].model_extra["token_ids"]) == 4
    assert "token_ids" not in (plain.choices[0].model_extra or {})


def test_32_concurrent_streams_complete_with_correct_counts(checkpoint):
    async def one(api, ids, max_tokens):
        stream = await api.completions.create(prompt=ids, max_tokens=max_tokens, stream=True,
                                              stream_options={"include_usage": True}, **GREEDY)
        chunks = [c async for c in stream]
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        return text, finish, chunks[-1].usage

    async def main():
        async with serve(checkpoint) as served:
            api = client(served.base_url)
            prompts = [[5 + i, 40 + i, 77] for i in range(32)]
            together = await asyncio.gather(*(one(api, p, 4 + i % 5)
                                              for i, p in enumerate(prompts)))
            alone = [await one(api, prompts[i], 4 + i % 5) for i in (0, 13, 31)]
            await served.engine.wait_idle()
            return together, alone, served.pipeline.live_kv_sequences()

    together, alone, live_kv = asyncio.run(main())
    for i, (_text, finish, usage) in enumerate(together):
        assert usage.prompt_tokens == 3
        if finish == "length":
            assert usage.completion_tokens == 4 + i % 5
        else:
            assert finish == "stop" and usage.completion_tokens <= 4 + i % 5
    assert [together[i] for i in (0, 13, 31)] == alone  # batching does not change greedy output
    assert live_kv == [0, 0]


def test_admission_rejects_overflow_at_once_with_429(checkpoint):
    config = ServingConfig(max_live_requests=1)

    async def main():
        async with serve(checkpoint, config=config) as served:
            api = client(served.base_url)
            first = await api.chat.completions.create(messages=MESSAGES, max_tokens=500,
                                                      stream=True, **GREEDY)
            await anext(aiter(first))  # admitted and streaming
            with pytest.raises(openai.RateLimitError) as info:
                await api.chat.completions.create(messages=MESSAGES, max_tokens=5, **GREEDY)
            await first.close()
            await served.engine.wait_idle()
            after = await api.chat.completions.create(messages=MESSAGES, max_tokens=2, **GREEDY)
            return info.value, after

    error, after = asyncio.run(main())
    assert error.status_code == 429
    assert error.body["code"] == "capacity"
    assert "queue is full" in error.body["message"]
    assert after.usage.completion_tokens >= 1


@pytest.mark.parametrize("kwargs, status, code, param", [
    ({"model": "nope", "messages": MESSAGES}, 404, "model_not_found", "model"),
    ({"model": MODEL_ID, "messages": MESSAGES, "max_tokens": -3}, 400, "invalid_max_tokens",
     "max_tokens"),
    ({"model": MODEL_ID, "messages": MESSAGES, "n": 17}, 400, "invalid_n", "n"),
    ({"model": MODEL_ID, "messages": MESSAGES, "max_tokens": 5000}, 400,
     "context_length_exceeded", "max_tokens"),
])
def test_bad_chat_requests_are_4xx_with_codes(checkpoint, kwargs, status, code, param):
    async def main():
        async with serve(checkpoint, stages=1) as served:
            with pytest.raises(openai.APIStatusError) as info:
                await client(served.base_url).chat.completions.create(**kwargs)
            return info.value

    error = asyncio.run(main())
    assert (error.status_code, error.body["code"], error.body["param"]) == (status, code, param)
    assert error.body["message"]


def test_prompt_longer_than_context_and_malformed_json(checkpoint):
    async def main():
        async with serve(checkpoint, stages=1) as served, aiohttp.ClientSession() as http:
            url = f"{served.base_url}/completions"
            long_prompt = {"model": MODEL_ID, "prompt": [7] * 2048}
            async with http.post(url, json=long_prompt) as resp:
                too_long = (resp.status, await resp.json())
            async with http.post(url, data=b'{"model": ', headers={
                    "Content-Type": "application/json"}) as resp:
                malformed = (resp.status, await resp.json())
            async with http.get(f"{served.base_url}/nothing") as resp:
                missing = (resp.status, await resp.json())
            return too_long, malformed, missing

    too_long, malformed, missing = asyncio.run(main())
    assert too_long[0] == 400
    assert too_long[1]["error"]["code"] == "context_length_exceeded"
    assert "2048" in too_long[1]["error"]["message"]
    assert malformed[0] == 400 and malformed[1]["error"]["code"] == "invalid_json"
    assert missing[0] == 404 and missing[1]["error"]["type"] == "invalid_request_error"


def test_bearer_auth(checkpoint):
    async def main():
        async with serve(checkpoint, stages=1, http=HttpConfig(api_key="s3cret")) as served:
            results = []
            for key in ("wrong", "s3cret"):
                try:
                    await client(served.base_url, key).models.list()
                    results.append("ok")
                except openai.AuthenticationError as exc:
                    results.append(exc.body["code"])
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{served.base_url}/models") as resp:
                    results.append((resp.status, (await resp.json())["error"]["code"]))
            return results

    assert asyncio.run(main()) == ["invalid_api_key", "ok", (401, "missing_api_key")]


def test_health_is_503_until_a_route_is_installed(checkpoint):
    async def main():
        async with serve(checkpoint, install=False) as served, aiohttp.ClientSession() as http:
            health = f"{served.base_url.removesuffix('/v1')}/health"
            async with http.get(health) as resp:
                before = (resp.status, (await resp.json())["error"]["code"])
            with pytest.raises(openai.APIStatusError) as info:
                await client(served.base_url).completions.create(prompt="x", **GREEDY)
            return before, info.value.status_code

    assert asyncio.run(main()) == ((503, "route_not_ready"), 503)


def test_client_disconnect_cancels_and_frees_kv_on_every_stage(checkpoint):
    async def main():
        async with serve(checkpoint) as served:
            body = {"model": MODEL_ID, "prompt": [5, 6, 7], "max_tokens": 1500, "stream": True,
                    "temperature": 0}
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{served.base_url}/completions", json=body) as resp:
                    await resp.content.readuntil(b"\n\n")
                    resp.close()  # drop the connection mid-stream
            await served.engine.wait_idle()
            return list(served.engine.retired), served.pipeline.live_kv_sequences()

    retired, live_kv = asyncio.run(main())
    assert [r.finish_reason for r in retired] == [FinishReason.CANCELLED]
    assert len(retired[0].released_stage_epochs) == 2
    assert live_kv == [0, 0]


def test_a_stream_that_fails_before_its_first_token_gets_a_status(checkpoint):
    """A stage refusing the KV reservation at prefill: 429 before any SSE byte is sent."""
    from services.orchestrator.engine.domain import SequenceStatus, failed_result

    async def main():
        async with serve(checkpoint, stages=1) as served:
            async def refuse(batch):
                return tuple(failed_result(s, "stage 0: KV full", status=SequenceStatus.REJECTED,
                                           error_code="ADMISSION") for s in batch.slices)

            served.pipeline.submit = refuse
            with pytest.raises(openai.RateLimitError) as info:
                await client(served.base_url).chat.completions.create(
                    messages=MESSAGES, max_tokens=3, stream=True, **GREEDY)
            return info.value

    error = asyncio.run(main())
    assert error.body["code"] == "capacity" and "KV full" in error.body["message"]


def test_body_cap_is_enforced_before_parsing(checkpoint):
    async def main():
        async with serve(checkpoint, stages=1, http=HttpConfig(max_body_bytes=1024)) as served, \
                aiohttp.ClientSession() as http:
            body = {"model": "fornax", "prompt": "x" * 4096, "max_tokens": 1}
            async with http.post(f"{served.base_url}/completions", json=body) as resp:
                return resp.status, (await resp.json())["error"]["code"]

    assert asyncio.run(main()) == (413, "request_entity_too_large")
