"""Structured outputs and tool calls through the OpenAI HTTP API with the official `openai`
client, over a 2-stage in-process route of the random-weight tiny model: every output parses
and validates, streaming or not; unsupported schemas are 400s that name the feature."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import openai
import pytest

from services.orchestrator.engine.domain import SchedulerConfig
from services.orchestrator.engine.serving import ServingConfig
from tests.integration.orchestrator.harness import MODEL_ID, serve

pytestmark = pytest.mark.integration

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "member": {"type": "boolean"},
                         "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]},
                                  "maxItems": 3},
                         # Bounded, so a weak model's digits cannot outrun max_tokens.
                         "score": {"type": ["integer", "null"], "minimum": -999,
                                   "maximum": 999}},
          "required": ["name", "age", "member", "tags", "score"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "maxLength": 10},
                                  "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "integer", "minimum": -12, "maximum": 14}}, "required": ["zone"],
        "additionalProperties": False}}}
SEEDS = range(12)
USER = [{"role": "user", "content": "Tell me about someone."}]


def _schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema,
                                                    "strict": True}}


async def _streamed(client, **kwargs) -> tuple[str, str | None, list]:
    stream = await client.chat.completions.create(stream=True, **kwargs)
    text, finish, calls = [], None, []
    async for chunk in stream:
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            calls += choice.delta.tool_calls or []
            finish = choice.finish_reason or finish
    return "".join(text), finish, calls


def test_json_schema_outputs_validate_for_every_seed(checkpoint):
    async def main():
        async with serve(checkpoint) as served:
            client = openai.AsyncOpenAI(base_url=served.base_url, api_key="none", max_retries=0)
            common = {"model": MODEL_ID, "messages": USER, "max_tokens": 160, "temperature": 1.0,
                      "response_format": _schema_format(PERSON)}
            full = await asyncio.gather(*(client.chat.completions.create(seed=s, **common)
                                          for s in SEEDS))
            streamed = await asyncio.gather(*(_streamed(client, seed=s, **common) for s in SEEDS))
            greedy = await client.chat.completions.create(**{**common, "temperature": 0})
            return full, streamed, greedy

    full, streamed, greedy = asyncio.run(main())
    for response, (text, finish, _) in zip(full, streamed, strict=True):
        choice = response.choices[0]
        assert choice.finish_reason == "stop" and finish == "stop"
        jsonschema.validate(json.loads(choice.message.content), PERSON)
        assert text == choice.message.content  # the same seed streams the same tokens
        assert response.usage.completion_tokens >= len(choice.message.content) // 8
    assert len({r.choices[0].message.content for r in full}) > len(SEEDS) // 2
    assert greedy.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(greedy.choices[0].message.content), PERSON)


def test_json_object_mode_gives_an_object(checkpoint):
    async def main():
        async with serve(checkpoint) as served:
            client = openai.AsyncOpenAI(base_url=served.base_url, api_key="none", max_retries=0)
            return await asyncio.gather(*(client.chat.completions.create(
                model=MODEL_ID, messages=USER, max_tokens=200, seed=s, temperature=0.7,
                response_format={"type": "json_object"}) for s in range(6)))

    for response in asyncio.run(main()):
        if response.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(response.choices[0].message.content), dict)


def test_unsupported_schema_features_are_a_400_naming_them(checkpoint):
    async def main():
        async with serve(checkpoint) as served:
            client = openai.AsyncOpenAI(base_url=served.base_url, api_key="none", max_retries=0)
            schema = {"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}
            with pytest.raises(openai.BadRequestError) as info:
                await client.chat.completions.create(model=MODEL_ID, messages=USER,
                                                     response_format=_schema_format(schema))
            return info.value

    error = asyncio.run(main())
    assert error.status_code == 400
    assert error.body["code"] == "unsupported_schema" and error.body["param"] == "response_format"
    assert "if" in error.body["message"] and "then" in error.body["message"]


def _arguments_schema(name: str) -> dict:
    return next(t for t in (WEATHER, CLOCK) if t["function"]["name"] == name)["function"]["parameters"]


def test_forced_tool_calls_validate_streaming_or_not(checkpoint):
    async def main():
        async with serve(checkpoint) as served:
            client = openai.AsyncOpenAI(base_url=served.base_url, api_key="none", max_retries=0)
            common = {"model": MODEL_ID, "messages": USER, "tools": [WEATHER, CLOCK], "max_tokens": 120,
                      "temperature": 1.0}
            required = await asyncio.gather(*(client.chat.completions.create(
                seed=s, tool_choice="required", **common) for s in SEEDS))
            named = await asyncio.gather(*(_streamed(
                client, seed=s, tool_choice={"type": "function", "function": {"name": "get_time"}},
                **common) for s in range(6)))
            return required, named

    required, named = asyncio.run(main())
    for response in required:
        choice = response.choices[0]
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), _arguments_schema(call.function.name))
    assert {r.choices[0].message.tool_calls[0].function.name for r in required} <= {"get_weather", "get_time"}
    for text, finish, calls in named:
        assert finish == "tool_calls" and text == ""
        (call,) = calls
        assert call.function.name == "get_time" and call.index == 0
        jsonschema.validate(json.loads(call.function.arguments), _arguments_schema("get_time"))


def test_call_tool_result_answer_loop(checkpoint):
    async def main():
        async with serve(checkpoint) as served:
            client = openai.AsyncOpenAI(base_url=served.base_url, api_key="none", max_retries=0)
            messages = [{"role": "user", "content": "Weather in Paris?"}]
            first = await client.chat.completions.create(
                model=MODEL_ID, messages=messages, tools=[WEATHER], tool_choice="required",
                max_tokens=120, seed=3)
            call = first.choices[0].message.tool_calls[0]
            messages += [first.choices[0].message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id,
                          "content": json.dumps({"temperature": 21})}]
            answer = await client.chat.completions.create(
                model=MODEL_ID, messages=messages, tools=[WEATHER], tool_choice="none",
                max_tokens=8, seed=3)
            return first, answer

    first, answer = asyncio.run(main())
    assert first.choices[0].finish_reason == "tool_calls"
    choice = answer.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.tool_calls is None
    # The answer's prompt holds the tools, the question, the call and its result.
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens + 20


def test_grammar_state_survives_chunked_prefill_and_regrouping(checkpoint):
    """Prompts prefilled in 3-row chunks, requests regrouped into different microbatches
    (2 in-flight slots vs many): the same seeds give the same schema-valid outputs."""
    async def run(config: ServingConfig) -> list[str]:
        async with serve(checkpoint, config=config) as served:
            client = openai.AsyncOpenAI(base_url=served.base_url, api_key="none", max_retries=0)
            responses = await asyncio.gather(*(client.chat.completions.create(
                model=MODEL_ID, messages=USER, max_tokens=160, temperature=1.0, seed=s,
                response_format=_schema_format(PERSON)) for s in range(6)))
            return [r.choices[0].message.content for r in responses]

    plain = asyncio.run(run(ServingConfig()))
    chunked = asyncio.run(run(ServingConfig(SchedulerConfig(
        inflight_microbatches=2, max_sequences_per_microbatch=2,
        max_prefill_rows_per_microbatch=3))))
    assert chunked == plain
    for text in chunked:
        jsonschema.validate(json.loads(text), PERSON)
