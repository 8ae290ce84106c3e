"""A downed link in a netns fleet: the host running stage 1 loses its veth mid-decode. Every
affected stream ends well before its deadline with a clean terminal error (no internal
address), the route shows DEGRADED naming the stage on /health and in GetPlanStatus, new
requests get 503 ROUTE_UNAVAILABLE, and once the link is back the route serves again.

Needs root and namespaces; skipped elsewhere. numpy on both hosts, tiny model."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import grpc
import pytest
import yaml

from apps.fleet.netns import leftovers, read_record
from fornax.orchestrator.v1 import orchestrator_pb2 as pb
from fornax.orchestrator.v1 import orchestrator_pb2_grpc as pb_grpc
from libs.service.fleet_state import read_fleet
from tests.faults.fleet import stream_completion

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or not Path("/proc/self/ns/net").exists(),
                       reason="netns fleets need root and namespaces"),
]
STREAMS = 8
DEADLINE_S = 60.0
END_WITHIN_S = 15.0  # detection (missed 1 s probes) + the release budget, on a busy host
ENV = {"FORNAX_DEFAULT_DEADLINE_S": str(DEADLINE_S), "FORNAX_RELEASE_BUDGET_S": "3",
       "FORNAX_RECOVERY_TIMEOUT_S": "0"}
INTERNAL_ADDRESS = re.compile(r"198\.1[89]\.|127\.0\.0\.1")


def _fornax(*args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apps.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **ENV})


def _two_hosts(path: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "version": 1, "control_host": "alpha", "boundary_dtype": "fp32",
        "hosts": [{"name": "alpha", "backend": "numpy", "cpu_cores": 1.0, "memory_limit": "3GiB",
                   "link": {"rate": "1Gbit/s"}},
                  {"name": "beta", "backend": "numpy", "cpu_cores": 1.0, "memory_limit": "2GiB",
                   "link": {"rate": "1Gbit/s"}}]}))
    return path


def _health(api: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(api.removesuffix("/v1") + "/health", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return 0, {}


def _route_state(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        reply = pb_grpc.OrchestratorServiceStub(channel).GetPlanStatus(pb.GetPlanStatusRequest(), timeout=5)
    return reply.current.state


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.2)


async def _streams_through(api: str, fault, count: int = STREAMS, max_tokens: int = 400):
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=DEADLINE_S + 30)) as session:
        started = [asyncio.Event() for _ in range(count)]
        tasks = [asyncio.create_task(stream_completion(session, api, [5 + i, 17, 42], max_tokens, started[i]))
                 for i in range(count)]
        fault_at = None
        if fault is not None:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
            fault()
            fault_at = time.monotonic()
        return await asyncio.gather(*tasks), fault_at


def _link(name: str, state: str) -> None:
    subprocess.run(["ip", "link", "set", name, state], check=True, capture_output=True, timeout=10)


def test_a_downed_link_ends_streams_before_their_deadline_and_the_route_recovers(tmp_path, checkpoint):
    up = _fornax("up", "--fleet", str(_two_hosts(tmp_path / "two.yaml")), "--checkpoint", str(checkpoint),
                 "--insecure", "--state-dir", str(tmp_path / ".fornax"),
                 cwd=tmp_path, timeout=400)
    record = read_record(tmp_path / ".fornax")
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        state = read_fleet(tmp_path / ".fornax")
        orchestrator = state.entry("orchestrator").grpc
        beta_link = record.links[2]  # bridge, then one veth per host in file order: beta's
        outcomes, fault_at = asyncio.run(_streams_through(state.api, lambda: _link(beta_link, "down")))
        try:
            for outcome in outcomes:
                assert outcome.status == 200 and outcome.error_code == "route_unavailable", outcome
                assert not INTERNAL_ADDRESS.search(outcome.error_message), outcome.error_message
                assert outcome.finished_at - fault_at < END_WITHIN_S < DEADLINE_S
            status, body = _wait_for(lambda: (lambda h: h if h[0] == 503 else None)(_health(state.api)), 10,
                                     "/health answers 503")
            reason = body["error"]["message"]
            assert "stage 1" in reason and not INTERNAL_ADDRESS.search(reason), reason
            assert _route_state(orchestrator) == pb.ROUTE_STATE_DEGRADED
            refused, _ = asyncio.run(_streams_through(state.api, None, count=1, max_tokens=4))
            assert refused[0].status == 503 and refused[0].error_code == "route_unavailable"
        finally:
            _link(beta_link, "up")
        _wait_for(lambda: _health(state.api)[0] == 200, 60, "the route serves again after link up")
        assert _route_state(orchestrator) == pb.ROUTE_STATE_SERVING
        after, _ = asyncio.run(_streams_through(state.api, None, count=2, max_tokens=8))
        assert all(a.status == 200 and a.error_code is None and a.tokens >= 1 for a in after)
    finally:
        down = _fornax("down", "--state-dir", str(tmp_path / ".fornax"), cwd=tmp_path, timeout=180)
    assert down.returncode == 0, down.stderr
    assert record is not None and leftovers(record) == []
