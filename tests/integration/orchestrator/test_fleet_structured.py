"""Structured outputs and tool calls through the whole fleet: planner, artifact builder, two
stage-worker processes and the orchestrator. The final stage's artifact carries the tokenizer
and the grammar masks are applied there, before every sample."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import openai
import pytest

from apps.fleet.compose import start_fleet
from apps.fleet.launcher import FleetOptions
from tests.integration.orchestrator.test_fleet_serving import wait_route_ready
from tests.integration.orchestrator.test_structured_outputs import (
    CLOCK,
    PERSON,
    USER,
    WEATHER,
    _schema_format,
    _streamed,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, checkpoint):
    options = FleetOptions(state_dir=tmp_path_factory.mktemp("fleet") / ".fornax", stages=2,
                           backend="numpy", boundary_dtype="fp32", checkpoint=str(checkpoint),
                           startup_timeout_s=180)
    state, launcher = start_fleet(options)
    try:
        wait_route_ready(state.api)
        yield state
    finally:
        launcher.stop_all()


def test_schema_valid_json_and_tool_calls_through_two_stage_workers(fleet):
    async def main():
        client = openai.AsyncOpenAI(base_url=fleet.api, api_key="none", max_retries=0)
        model = (await client.models.list()).data[0].id
        common = dict(model=model, messages=USER, max_tokens=160, temperature=1.0)
        full = await asyncio.gather(*(client.chat.completions.create(
            seed=s, response_format=_schema_format(PERSON), **common) for s in range(8)))
        streamed = await asyncio.gather(*(_streamed(
            client, seed=s, response_format=_schema_format(PERSON), **common) for s in range(8)))
        calls = await asyncio.gather(*(_streamed(
            client, seed=s, tools=[WEATHER, CLOCK], tool_choice="required", **common)
            for s in range(4)))
        return full, streamed, calls

    full, streamed, calls = asyncio.run(main())
    for response, (text, finish, _) in zip(full, streamed, strict=True):
        assert response.choices[0].finish_reason == "stop" and finish == "stop"
        jsonschema.validate(json.loads(response.choices[0].message.content), PERSON)
        assert text == response.choices[0].message.content
    for _, finish, (call,) in calls:
        assert finish == "tool_calls"
        tool = next(t for t in (WEATHER, CLOCK) if t["function"]["name"] == call.function.name)
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
