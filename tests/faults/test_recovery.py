"""kill -9 of a stage mid-decode with 16 streams, under a fleet that restarts its workers:
the orchestrator reloads the stored plan as a new generation, replays every stream's prompt
plus the tokens it already emitted, and every stream completes with exactly the text of an
uninterrupted run (fp32 boundaries, greedy): no duplicated and no missing tokens."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import aiohttp
import pytest

from apps.fleet.supervisor import FleetSupervisor
from tests.faults.fleet import live_fleet, stream_completion

pytestmark = [pytest.mark.integration]
STREAMS = 16
MAX_TOKENS = 64
RECOVERY_TIMEOUT_S = 60.0
ENV = {"FORNAX_RECOVERY_TIMEOUT_S": str(RECOVERY_TIMEOUT_S), "FORNAX_DEFAULT_DEADLINE_S": "180"}
PROMPTS = [[5 + 3 * i, 17, 42, 9 + i] for i in range(STREAMS)]


async def _run_all(api: str, fault=None, after_tokens: int = 4):
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=240)) as session:
        progress = [asyncio.Event() for _ in PROMPTS]
        tasks = [asyncio.create_task(stream_completion(session, api, p, MAX_TOKENS, progress[i]))
                 for i, p in enumerate(PROMPTS)]
        fault_at = None
        if fault is not None:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in progress)), 120)
            await asyncio.sleep(0.05 * after_tokens)  # well inside the decode
            fault()
            fault_at = time.monotonic()
        return await asyncio.gather(*tasks), fault_at


@pytest.mark.parametrize("victim_name", ["stage_worker_1", "stage_worker_0"])
def test_kill_9_mid_decode_recovers_by_replay_with_identical_text(tmp_path, checkpoint, victim_name):
    with live_fleet(tmp_path, checkpoint, ENV) as fleet:
        supervisor = FleetSupervisor(fleet.launcher).start()
        try:
            reference, _ = asyncio.run(_run_all(fleet.state.api))
            assert all(r.status == 200 and r.error_code is None for r in reference)
            victim = fleet.pid(victim_name)
            outcomes, fault_at = asyncio.run(_run_all(
                fleet.state.api, lambda: os.kill(victim, signal.SIGKILL)))
        finally:
            supervisor.stop()
        assert supervisor.restarts and supervisor.restarts[0][0] == victim_name
        for expected, got in zip(reference, outcomes, strict=True):
            assert (got.status, got.error_code) == (200, None), got.error_message
            assert got.text == expected.text  # nothing duplicated, nothing missing
            assert got.finish_reason == expected.finish_reason
        log = [json.loads(line) for line in fleet.log("orchestrator").splitlines()
               if line.startswith("{")]
        recovered = [e for e in log if e.get("event") == "route_recovered"]
        assert recovered and recovered[-1]["replayed"] >= 1
        recovery_s = recovered[-1]["recovery_s"]
        assert recovery_s < RECOVERY_TIMEOUT_S
        print(f"recovery_s={recovery_s} replayed={recovered[-1]['replayed']} (physical, this host)")
        assert fleet.health()[0] == 200


def test_a_stopped_stage_costs_a_pause_not_the_streams(tmp_path, checkpoint):
    """SIGSTOP mid-decode, SIGCONT a few seconds later: the route degrades, then reloads as
    a new generation and replays; every stream ends with its uninterrupted text."""
    with live_fleet(tmp_path, checkpoint, ENV) as fleet:
        reference, _ = asyncio.run(_run_all(fleet.state.api))
        victim = fleet.pid("stage_worker_1")

        def stop_then_resume() -> None:
            os.kill(victim, signal.SIGSTOP)
            asyncio.get_running_loop().call_later(3.0, os.kill, victim, signal.SIGCONT)

        try:
            outcomes, _ = asyncio.run(_run_all(fleet.state.api, stop_then_resume))
        finally:
            os.kill(victim, signal.SIGCONT)
        for expected, got in zip(reference, outcomes, strict=True):
            assert (got.status, got.error_code) == (200, None), got.error_message
            assert got.text == expected.text
        assert fleet.health()[0] == 200
