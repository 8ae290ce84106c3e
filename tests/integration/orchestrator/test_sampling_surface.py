"""The OpenAI sampling surface over a 2-stage in-process route, with the `openai` client:
n > 1 with independent seeded streams, logprobs, logit_bias, penalties, stop token ids,
ignore_eos and exact usage, streaming and not."""

from __future__ import annotations

import asyncio
import math

import openai
import pytest

from libs.text.context import TextContext
from tests.integration.orchestrator.harness import MODEL_ID, serve

pytestmark = pytest.mark.integration
PROMPT = [5, 17, 42, 9]


def _run(checkpoint, body):
    async def main():
        async with serve(checkpoint) as served:
            client = openai.AsyncOpenAI(base_url=served.base_url, api_key="none", max_retries=0)
            return await body(client)

    return asyncio.run(main())


def test_n_choices_are_independent_reproducible_and_counted(checkpoint):
    async def body(client):
        common = {"model": MODEL_ID, "prompt": PROMPT, "max_tokens": 10, "temperature": 1.0, "seed": 7,
                  "logprobs": 0}
        many = await client.completions.create(n=4, **common)
        again = await client.completions.create(n=4, **common)
        single = await client.completions.create(**common)
        stream = await client.completions.create(n=3, stream=True,
                                                 stream_options={"include_usage": True}, **common)
        parts, usage = {}, None
        async for chunk in stream:
            for choice in chunk.choices:
                parts[choice.index] = parts.get(choice.index, "") + choice.text
            usage = chunk.usage or usage
        return many, again, single, parts, usage

    many, again, single, parts, usage = _run(checkpoint, body)
    texts = [c.text for c in sorted(many.choices, key=lambda c: c.index)]
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    assert texts == [c.text for c in sorted(again.choices, key=lambda c: c.index)]
    assert len(set(texts)) == 4  # independent streams
    assert texts[0] == single.choices[0].text  # choice 0 keeps the request's own seed
    assert many.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in many.choices)
    assert many.usage.prompt_tokens == len(PROMPT)  # the prompt is counted once
    assert [parts[i] for i in range(3)] == texts[:3]
    assert usage.completion_tokens == sum(len(c.logprobs.tokens) for c in many.choices[:3])


def test_logit_bias_forces_and_stop_token_ids_end(checkpoint):
    text = TextContext.from_checkpoint(checkpoint)
    forced, other = text.tokenizer.encode("stage")[0], text.tokenizer.encode("fox")[0]

    async def body(client):
        common = {"model": MODEL_ID, "prompt": PROMPT, "max_tokens": 5, "temperature": 0}
        biased = await client.completions.create(logit_bias={str(forced): 100}, **common)
        stopped = await client.completions.create(
            logit_bias={str(forced): 100}, extra_body={"stop_token_ids": [forced]}, **common)
        # Two forced tokens; the one banned with -100 never appears.
        banned = await client.completions.create(
            logit_bias={str(forced): -100, str(other): 100}, **common)
        return biased, stopped, banned

    biased, stopped, banned = _run(checkpoint, body)
    assert biased.choices[0].text == text.tokenizer.decode([forced] * 5)
    assert biased.choices[0].finish_reason == "length" and biased.usage.completion_tokens == 5
    assert stopped.choices[0].text == "" and stopped.choices[0].finish_reason == "stop"
    assert stopped.usage.completion_tokens == 1
    assert banned.choices[0].text == text.tokenizer.decode([other] * 5)


def test_ignore_eos_runs_past_end_of_sequence_to_max_tokens(checkpoint):
    text = TextContext.from_checkpoint(checkpoint)
    eos = min(text.eos_token_ids)

    async def body(client):
        common = {"model": MODEL_ID, "prompt": PROMPT, "max_tokens": 4, "temperature": 0,
                  "logit_bias": {str(eos): 100}}
        ended = await client.completions.create(**common)
        ignored = await client.completions.create(**common, extra_body={"ignore_eos": True})
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                response_format={"type": "json_object"}, extra_body={"ignore_eos": True})
        return ended, ignored, refused.value

    ended, ignored, refused = _run(checkpoint, body)
    assert ended.choices[0].finish_reason == "stop" and ended.usage.completion_tokens == 1
    assert ignored.choices[0].finish_reason == "length"
    assert ignored.usage.completion_tokens == 4  # eos four times, each an ordinary token
    error = refused.body
    assert (error["code"], error["param"]) == ("invalid_ignore_eos", "ignore_eos")


def test_frequency_penalty_spreads_a_greedy_output(checkpoint):
    async def body(client):
        common = {"model": MODEL_ID, "prompt": PROMPT, "max_tokens": 24, "temperature": 0, "logprobs": 0}
        plain = await client.completions.create(**common)
        penalised = await client.completions.create(frequency_penalty=2.0,
                                                    presence_penalty=2.0, **common)
        return plain, penalised

    plain, penalised = _run(checkpoint, body)
    plain_tokens = plain.choices[0].logprobs.tokens
    penalised_tokens = penalised.choices[0].logprobs.tokens
    assert penalised_tokens != plain_tokens
    assert len(set(penalised_tokens)) >= len(set(plain_tokens))


def test_chat_logprobs_shape_and_consistency(checkpoint):
    async def body(client):
        common = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Hi"}],
                  "max_tokens": 6, "temperature": 1.0, "seed": 3, "logprobs": True, "top_logprobs": 5}
        full = await client.chat.completions.create(**common)
        stream = await client.chat.completions.create(stream=True, **common)
        streamed = []
        async for chunk in stream:
            for choice in chunk.choices:
                streamed += (choice.logprobs.content if choice.logprobs else None) or []
        return full, streamed

    full, streamed = _run(checkpoint, body)
    content = full.choices[0].logprobs.content
    assert len(content) == full.usage.completion_tokens == len(streamed)
    for entry, other in zip(content, streamed, strict=True):
        assert (entry.token, entry.logprob) == (other.token, other.logprob)
        assert len(entry.top_logprobs) == 5 and entry.logprob <= 0
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert sum(math.exp(v) for v in values) <= 1.0 + 1e-5
        assert entry.logprob <= values[0] + 1e-6
