"""`fornax up --fleet fleets/four-hosts.yaml --routes 2`: four netns hosts form two replica routes
behind one API. kill -9 of one stage worker under concurrent greedy streams costs no client an
error: the lost route's streams are replayed on the other route (prompt plus emitted tokens),
and every stream's text equals an uninterrupted run's.

Needs root and namespaces (CI is root); skipped elsewhere. numpy on every host, tiny checkpoint.
"""

from __future__ import annotations

import asyncio
import os
import signal

import openai

from apps.fleet.netns import leftovers, read_record
from libs.service.fleet_state import read_fleet
from tests.integration.fleet.netns_routes import NETNS_ONLY, PROMPTS, REPO, fornax, log_events

pytestmark = NETNS_ONLY
MAX_TOKENS = 40
TIMEOUT_S = 240


async def _streams(state, fault=None) -> list[tuple[str, str | None]]:
    """(text, error) per prompt, streamed at once; `fault` runs once every stream has a token."""
    client = openai.AsyncOpenAI(base_url=state.api, api_key="none", max_retries=0, timeout=TIMEOUT_S,
                                http_client=openai.DefaultAsyncHttpxClient(verify=state.api_ssl_context()))
    started = [asyncio.Event() for _ in PROMPTS]

    async def one(index: int) -> tuple[str, str | None]:
        parts: list[str] = []
        try:
            stream = await client.completions.create(model="fornax", prompt=list(PROMPTS[index]),
                                                     max_tokens=MAX_TOKENS, temperature=0, stream=True)
            async for chunk in stream:
                parts.append(chunk.choices[0].text if chunk.choices else "")
                started[index].set()
        except Exception as exc:  # noqa: BLE001  (any client-visible error fails the test below)
            return "".join(parts), f"{type(exc).__name__}: {exc}"
        finally:
            started[index].set()
        return "".join(parts), None

    tasks = [asyncio.create_task(one(i)) for i in range(len(PROMPTS))]
    if fault is not None:
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), TIMEOUT_S)
        fault()
    return await asyncio.wait_for(asyncio.gather(*tasks), TIMEOUT_S)


def _log_events(state, name: str) -> list[dict]:
    return log_events(state.entry(name).log)


def test_two_replica_routes_survive_kill_9_of_a_stage_with_identical_greedy_text(tmp_path, checkpoint):
    up = fornax("up", "--fleet", str(REPO / "fleets" / "four-hosts.yaml"), "--checkpoint", str(checkpoint),
                 "--routes", "2", cwd=tmp_path)
    record = read_record(tmp_path / ".fornax")
    try:
        assert up.returncode == 0, up.stderr
        assert "replica routes: 2 routes: " in up.stderr
        state = read_fleet(tmp_path / ".fornax")
        status = fornax("status", cwd=tmp_path, timeout=60)
        assert "route 0: SERVING" in status.stdout and "route 1: SERVING" in status.stdout, status.stdout
        reference = asyncio.run(_streams(state))
        assert all(error is None for _, error in reference), reference
        victim = state.entry("stage_worker_1").pid
        outcomes = asyncio.run(_streams(state, lambda: os.kill(victim, signal.SIGKILL)))
        for (expected, _), (got, error) in zip(reference, outcomes, strict=True):
            assert error is None, error  # a pause, never an error
            assert got == expected  # nothing lost, nothing doubled
        events = _log_events(state, "orchestrator")
        moved = [e for e in events if e.get("event") == "route_failover"]
        replayed_in_place = [e for e in events if e.get("event") == "route_recovered" and e.get("replayed")]
        assert moved or replayed_in_place, "no stream was on the lost route"
        print(f"failovers={[e.get('moved') for e in moved]} (physical, this host)")
    finally:
        down = fornax("down", cwd=tmp_path, timeout=120)
    assert down.returncode == 0, down.stderr
    assert record is not None and leftovers(record) == []
