"""A background fleet (`fornax up` without --foreground) is supervised too: kill -9 of a
stage worker mid-decode, and its keeper restarts the worker on the same ports, the
orchestrator replays the streams the failure hit (same text as an uninterrupted run), the
fleet file names the new pid, and `fornax down` leaves nothing running."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import aiohttp
import pytest

from apps.fleet.keeper import keeper_pid
from libs.service.fleet_state import read_fleet
from libs.service.host import pid_alive
from tests.faults.fleet import stream_completion

pytestmark = [pytest.mark.integration]
ENV = {"FORNAX_RECOVERY_TIMEOUT_S": "60", "FORNAX_DEFAULT_DEADLINE_S": "180"}
PROMPTS = [[7 + 3 * i, 17, 42, 9 + i] for i in range(8)]
MAX_TOKENS = 48


def _fornax(*args: str, cwd, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apps.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **ENV})


async def _streams(api: str, fault=None):
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=200)) as session:
        started = [asyncio.Event() for _ in PROMPTS]
        tasks = [asyncio.create_task(stream_completion(session, api, p, MAX_TOKENS, started[i]))
                 for i, p in enumerate(PROMPTS)]
        if fault is not None:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 120)
            await asyncio.sleep(0.2)
            fault()
        return await asyncio.gather(*tasks)


def _health(api: str) -> int:
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(api.removesuffix("/v1") + "/health", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def test_kill_9_of_a_background_fleets_worker_is_restarted_and_replayed(tmp_path, checkpoint):
    state_dir = tmp_path / ".fornax"
    up = _fornax("up", "--state-dir", str(state_dir), "--checkpoint", str(checkpoint),
                 "--boundary-dtype", "fp32", cwd=tmp_path, timeout=300)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        keeper = keeper_pid(state_dir)
        assert keeper is not None  # `fornax up` returned; the keeper holds the fleet
        state = read_fleet(state_dir)
        reference = asyncio.run(_streams(state.api))
        assert all(r.status == 200 and r.error_code is None for r in reference)
        victim = state.entry("stage_worker_1").pid
        outcomes = asyncio.run(_streams(state.api, lambda: os.kill(victim, signal.SIGKILL)))
        for expected, got in zip(reference, outcomes, strict=True):
            assert (got.status, got.error_code) == (200, None), got.error_message
            assert got.text == expected.text and got.finish_reason == expected.finish_reason
        deadline = time.monotonic() + 30
        while True:
            fresh = read_fleet(state_dir).entry("stage_worker_1").pid
            if fresh != victim and pid_alive(fresh):
                break
            assert time.monotonic() < deadline, "the fleet file never named the restarted worker"
            time.sleep(0.2)
        assert _health(state.api) == 200
        pids = [s.pid for s in read_fleet(state_dir).services]
    finally:
        down = _fornax("down", "--state-dir", str(state_dir), cwd=tmp_path, timeout=120)
    assert down.returncode == 0, down.stderr
    assert _gone(keeper) and all(_gone(pid) for pid in pids)


def _gone(pid: int) -> bool:
    """Exited (a zombie waiting for init to reap it counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] == "Z"
    except OSError:
        return not pid_alive(pid)
