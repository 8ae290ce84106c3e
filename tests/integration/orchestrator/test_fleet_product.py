"""The product surface through the whole fleet (planner, artifact builder, two stage-worker
processes, the orchestrator), with auth on: structured outputs and tool calls (the final
stage's artifact carries the tokenizer and masks every sample), logprobs across the FNX2
hops, /v1/models provenance, and the live dashboard in headless chromium."""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

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
from tests.support.chromium import Browser, chromium_binary

pytestmark = [pytest.mark.integration, pytest.mark.slow]
API_KEY = "sk-fornax-dashboard-test-key-5f3a9c"


def _client(fleet) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=fleet.api, api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, checkpoint):
    options = FleetOptions(state_dir=tmp_path_factory.mktemp("fleet") / ".fornax", stages=2,
                           backend="numpy", boundary_dtype="fp32", checkpoint=str(checkpoint),
                           startup_timeout_s=180, api_key=API_KEY)
    state, launcher = start_fleet(options)
    try:
        wait_route_ready(state.api)
        yield state
    finally:
        launcher.stop_all()


def test_schema_valid_json_and_tool_calls_through_two_stage_workers(fleet):
    async def main():
        client = _client(fleet)
        model = (await client.models.list()).data[0].id
        common = {"model": model, "messages": USER, "max_tokens": 160, "temperature": 1.0}
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
        client = _client(fleet)
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
    request = urllib.request.Request(fleet.api + "/models",
                                     headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(request, timeout=10) as response:
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
                                 "stage_weights": ["fp32", "fp32"], "stage_conversions": [[], []],
                                 "stage_max_activations": ["", ""],  # numpy stages: no block products
                                 "backend_choice": None,  # no live switch on a numpy fleet
                                 "evidence_class": "reference"}


ARTIFACTS = Path(os.environ.get("FORNAX_TEST_ARTIFACTS", Path(__file__).parents[3] / ".test-artifacts"))
_STAGE_ROWS = """JSON.stringify([...document.querySelectorAll('#stages tbody tr')].map(tr =>
  Object.fromEntries([...tr.querySelectorAll('td[data-field]')].map(td => [td.dataset.field, td.textContent]))))"""
_PAGE = """JSON.stringify({status: document.getElementById('status').textContent,
  live: document.getElementById('live-requests').textContent,
  rate: document.getElementById('tokens-per-s').textContent,
  spark: document.querySelector('#spark-tokens polyline').getAttribute('points'),
  errors: Object.fromEntries([...document.querySelectorAll('#errors tr[data-reason]')].map(tr =>
    [tr.dataset.reason, tr.querySelector('[data-field=count]').textContent])),
  href: location.href, html: document.documentElement.outerHTML.length,
  hasKey: document.documentElement.outerHTML.includes(%r)})"""


def _get(url: str, token: str | None = None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


async def _until(browser: Browser, expression: str, done, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = json.loads(await browser.evaluate(expression))
        if done(value) or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.25)


async def _load(fleet, requests: int = 6) -> None:
    client = _client(fleet)
    model = (await client.models.list()).data[0].id
    await asyncio.gather(*(client.completions.create(
        model=model, prompt=[5, 6, 7, i], max_tokens=48, temperature=1.0, seed=i)
        for i in range(requests)))


def test_dashboard_shows_every_stage_live_in_chromium_with_auth_on(fleet):
    assert chromium_binary(), "Debian's chromium is required (`make test` installs it through scripts/system_deps.sh)"
    base = fleet.api.removesuffix("/v1")
    status, page = _get(base + "/dashboard")
    assert status == 200 and b"<script" in page
    assert b"src=" not in page and b"href=\"http" not in page  # self-contained: no CDN
    assert API_KEY.encode() not in page
    assert _get(base + "/dashboard/state")[0] == 401  # the data needs the key, as /v1/ does
    status, state = _get(base + "/dashboard/state", API_KEY)
    assert status == 200 and API_KEY.encode() not in state
    assert _get(fleet.api + "/completions", API_KEY)[0] in (400, 405)  # an error to show

    async def main():
        browser = await Browser().open()
        try:
            await browser.navigate(f"{base}/dashboard#token={API_KEY}")
            idle = await _until(browser, _STAGE_ROWS,
                                lambda rows: len(rows) == 2 and all(r["host"] for r in rows))
            load = asyncio.create_task(_load(fleet))
            busy = await _until(browser, _STAGE_ROWS, lambda rows: len(rows) == len(idle) and all(
                r["compute"] != "-" and int(r["batches"]) > int(i["batches"])
                for r, i in zip(rows, idle, strict=True)))
            during = await _until(browser, _PAGE % API_KEY,
                                  lambda p: float(p["rate"]) > 0 and len(p["spark"]) > 0)
            await browser.screenshot(ARTIFACTS / "dashboard.png")
            await load
            after = await _until(browser, _PAGE % API_KEY, lambda p: p["errors"])
            return idle, busy, during, after
        finally:
            await browser.close()

    idle, busy, during, after = asyncio.run(main())
    layers = [r["layers"] for r in busy]
    assert [r["index"] for r in busy] == ["0", "1"] and layers[0] != layers[1]
    assert all(r["backend"] == "numpy" and ":" in r["host"] for r in busy)
    for row, before in zip(busy, idle, strict=True):
        assert int(row["batches"]) > int(before["batches"])  # live numbers that moved
        assert float(row["compute"]) > 0 and row["kv"].endswith("%)")
    assert busy[0]["wire"] != "-" and float(busy[0]["wire"]) >= 0  # stage 0 sends to stage 1
    assert float(during["rate"]) > 0 and during["status"].startswith("live")
    assert API_KEY not in during["href"] and not during["hasKey"]
    assert "method_not_allowed" in after["errors"] or "invalid_json" in after["errors"]
    assert (ARTIFACTS / "dashboard.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
