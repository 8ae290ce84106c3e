"""A fleet built in a quantized weight policy serves, through the `openai` client on a 2-stage
numpy route, exactly the greedy text of transformers run on the same dequantized weights."""

from __future__ import annotations

import asyncio

import openai
import pytest

from apps.fleet.compose import start_fleet
from apps.fleet.launcher import FleetOptions
from libs.text.context import TextContext
from tests.integration.orchestrator.test_fleet_serving import wait_route_ready
from tests.support.dequantized_reference import reference_greedy_under_policy

pytestmark = [pytest.mark.integration, pytest.mark.slow]
NEW_TOKENS = 10
PROMPTS = [[5, 17, 42], [7, 8, 9, 10, 11, 12]]


@pytest.mark.parametrize("policy", ["q8_0", "q4_k_m"])
def test_a_quantized_fleet_serves_the_reference_of_its_own_weights(tmp_path, checkpoint, policy):
    options = FleetOptions(state_dir=tmp_path / ".fornax", stages=2, backend="numpy", boundary_dtype="fp32",
                           weights=policy, checkpoint=str(checkpoint), startup_timeout_s=180)
    state, launcher = start_fleet(options)
    try:
        wait_route_ready(state.api)

        async def main():
            api = openai.AsyncOpenAI(base_url=state.api, api_key="none", max_retries=0)
            model = (await api.models.list()).data[0]
            completions = await asyncio.gather(*(api.completions.create(
                model=model.id, prompt=p, max_tokens=NEW_TOKENS, temperature=0)
                for p in PROMPTS))
            return model, completions

        model, served = asyncio.run(main())
    finally:
        launcher.stop_all()
    expected = reference_greedy_under_policy(checkpoint, policy, PROMPTS, NEW_TOKENS)
    unquantized = reference_greedy_under_policy(checkpoint, "fp32", PROMPTS, NEW_TOKENS)
    tokenizer = TextContext.from_checkpoint(checkpoint).tokenizer
    assert [c.choices[0].text for c in served] == [tokenizer.decode(e) for e in expected]
    assert model.model_extra["fornax"]["execution"]["stage_weights"] == [policy, policy]
    assert expected != unquantized or policy == "q8_0"  # 4-bit changes this model's greedy text
