"""Structured outputs and tool calls through the whole fleet: planner, artifact builder, two
stage-worker processes and the orchestrator. The final stage's artifact carries the tokenizer
and the grammar masks are applied there, before every sample."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import jsonschema
import numpy as np
import openai
import pytest

from apps.fleet.compose import start_fleet
from apps.fleet.launcher import FleetOptions
from libs.model.config import load_config
from libs.text.context import TextContext
from services.planner.model import describe_checkpoint
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


class _Reference:
    """transformers in float32: log-softmax of the next-token logits after a token sequence."""

    def __init__(self, checkpoint) -> None:
        self.torch = pytest.importorskip("torch")
        transformers = pytest.importorskip("transformers")
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            str(checkpoint), dtype=self.torch.float32, attn_implementation="eager").eval()

    def next_logprobs(self, ids: list[int]) -> np.ndarray:
        with self.torch.no_grad():
            logits = self.model(self.torch.tensor([ids])).logits[0, -1].float()
        return self.torch.log_softmax(logits, dim=-1).numpy()


def test_logprobs_cross_the_fnx2_hops_and_match_a_float32_reference(fleet, checkpoint):
    prompt = [5, 17, 42, 9, 100, 7]

    async def main():
        client = openai.AsyncOpenAI(base_url=fleet.api, api_key="none", max_retries=0)
        model = (await client.models.list()).data[0].id
        return await asyncio.gather(*(client.completions.create(
            model=model, prompt=prompt, max_tokens=6, logprobs=5, **sampling)
            for sampling in ({"temperature": 0}, {"temperature": 1.0, "seed": 11})))

    reference = _Reference(checkpoint)
    text = TextContext.from_checkpoint(checkpoint)
    by_text: dict[str, list[int]] = {}
    for token_id, raw in enumerate(text.tokenizer.token_bytes):
        by_text.setdefault(raw.decode("utf-8", errors="replace"), []).append(token_id)
    for response in asyncio.run(main()):
        lp = response.choices[0].logprobs
        assert len(lp.tokens) == response.usage.completion_tokens == 6
        generated: list[int] = []
        for step, (token, value) in enumerate(zip(lp.tokens, lp.token_logprobs, strict=True)):
            expected = reference.next_logprobs(prompt + generated)
            # The token's id is the one among those spelling its text whose logprob matches.
            token_id = min(by_text[token], key=lambda c: abs(expected[c] - value))
            assert abs(expected[token_id] - value) < 1e-4
            generated.append(token_id)
            # Legacy completions key top_logprobs by text, so equal spellings share an entry.
            best = np.sort(expected)[::-1][:5]
            top = lp.top_logprobs[step]
            assert max(top.values()) == pytest.approx(best[0], abs=1e-4)
            assert all(np.min(np.abs(best - v)) < 1e-4 for v in top.values())


def test_models_report_snapshot_hashes_context_and_evidence(fleet, checkpoint):
    with urllib.request.urlopen(fleet.api + "/models", timeout=10) as response:
        listed = json.loads(response.read())
    (model,) = listed["data"]
    card = model["fornax"]
    text = TextContext.from_checkpoint(checkpoint)
    assert card["model_snapshot"] == describe_checkpoint(str(checkpoint)).model_snapshot
    assert card["tokenizer_sha256"] == text.identity.tokenizer_sha256
    assert card["chat_template_sha256"] == text.identity.template_sha256
    assert card["context_length"] == model["max_model_len"] == load_config(checkpoint).max_position_embeddings
    assert card["plan"]["mode"] == "exploratory" and card["plan"]["plan_id"]
    assert card["plan"]["evidence_class"] == "prediction"  # cost-model figures, not measured
    assert card["execution"] == {"backend": "numpy", "boundary_dtype": "fp32", "stages": 2,
                                 "evidence_class": "reference"}
