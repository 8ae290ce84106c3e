"""`fornax host drain delta` on a four-host netns fleet serving two replica routes, under
concurrent greedy streams: the route that holds delta stops taking requests, hands the streams
still running to the other route (prompt plus emitted tokens), and is unloaded; delta's worker
is stopped and not restarted. No client sees an error, every stream's text equals an
uninterrupted run's, and the route left serves new requests. Then the orchestrator is killed
(SIGKILL): the fleet's keeper starts it again on its ports, and it serves the route set it
committed (`route_set.json`), not its configured two routes: `fornax status` lists the drained
route as removed and the same streams come out unchanged.

Needs root and namespaces (CI is root); skipped elsewhere. numpy on every host, tiny checkpoint.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time

import openai

from apps.fleet.netns import leftovers, read_record
from libs.service.fleet_state import read_fleet
from libs.service.host import pid_alive
from tests.integration.fleet.netns_routes import NETNS_ONLY, PROMPTS, REPO, fornax, log_events

pytestmark = NETNS_ONLY
# Every stream runs to MAX_TOKENS (ignore_eos): on tiny some prompts reach end-of-sequence within
# a second, and the drain (a CLI process) must find streams still running on delta's route even
# on a loaded box (with 256 tokens and EOS, one CI run saw all of them end first: 0 handed off).
MAX_TOKENS = 512
TIMEOUT_S = 120


async def _streams(state, during=None) -> list[tuple[str, str | None, float]]:
    """(text, error, largest inter-token gap in s) per prompt, streamed at once; `during` runs
    in a thread once every stream has a token."""
    client = openai.AsyncOpenAI(base_url=state.api, api_key="none", max_retries=0, timeout=TIMEOUT_S,
                                http_client=openai.DefaultAsyncHttpxClient(verify=state.api_ssl_context()))
    started = [asyncio.Event() for _ in PROMPTS]

    async def one(index: int) -> tuple[str, str | None, float]:
        parts: list[str] = []
        gap, last = 0.0, None
        try:
            stream = await client.completions.create(model="fornax", prompt=list(PROMPTS[index]),
                                                     max_tokens=MAX_TOKENS, temperature=0, stream=True,
                                                     extra_body={"ignore_eos": True})
            async for chunk in stream:
                now = time.monotonic()
                gap, last = (max(gap, now - last) if last is not None else gap), now
                parts.append(chunk.choices[0].text if chunk.choices else "")
                started[index].set()
        except Exception as exc:  # noqa: BLE001  (any client-visible error fails the test below)
            return "".join(parts), f"{type(exc).__name__}: {exc}", gap
        finally:
            started[index].set()
        return "".join(parts), None, gap

    tasks = [asyncio.create_task(one(i)) for i in range(len(PROMPTS))]
    if during is not None:
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), TIMEOUT_S)
        thread = threading.Thread(target=during, daemon=True)
        thread.start()
    outcomes = await asyncio.wait_for(asyncio.gather(*tasks), TIMEOUT_S)
    if during is not None:
        await asyncio.to_thread(thread.join, TIMEOUT_S)
    return outcomes


def _orchestrator_restarts_on_the_stored_set(tmp_path, drained_worker: str, expected: list[str]) -> None:
    state_dir = tmp_path / ".fornax"
    killed = read_fleet(state_dir).entry("orchestrator")
    os.kill(killed.pid, signal.SIGKILL)
    began, status = time.monotonic(), None
    while time.monotonic() - began < 240:  # the keeper restarts it; it plans, builds and loads again
        time.sleep(2.0)
        now = read_fleet(state_dir)
        if now is not None and now.entry("orchestrator").pid != killed.pid:
            status = fornax("status", cwd=tmp_path, timeout=60)
            if "route: SERVING" in status.stdout:
                break
    assert status is not None and "route: SERVING" in status.stdout, status.stdout if status else "never restarted"
    print(f"orchestrator restarted and serving in {time.monotonic() - began:.1f} s (physical, this host)")
    serving_lines = [line for line in status.stdout.splitlines() if not line.startswith("removed route: ")]
    assert not [line for line in serving_lines if drained_worker in line], status.stdout
    assert f"removed route: HOST_DRAINED host {drained_worker}: " in status.stdout, status.stdout
    restarted = read_fleet(state_dir)
    events = log_events(restarted.entry("orchestrator").log)
    assert [e for e in events if e.get("event") == "route_set_resumed"], events[-20:]
    assert [got for got, _, _ in asyncio.run(_streams(restarted))] == expected


def test_a_host_drains_away_under_greedy_streams_and_nothing_is_lost(tmp_path, checkpoint):
    up = fornax("up", "--fleet", str(REPO / "fleets" / "four-hosts.yaml"), "--checkpoint", str(checkpoint),
                 "--routes", "2", cwd=tmp_path)
    record = read_record(tmp_path / ".fornax")
    try:
        assert up.returncode == 0, up.stderr
        state = read_fleet(tmp_path / ".fornax")
        began = time.monotonic()
        reference = asyncio.run(_streams(state))
        print(f"uninterrupted streams took {time.monotonic() - began:.1f} s")
        assert all(error is None for _, error, _ in reference), reference
        leaving = state.entry(next(d.name for d in (tmp_path / ".fornax" / "hosts" / "delta").iterdir()
                                   if d.name.startswith("stage_worker_")))
        drained: list[subprocess.CompletedProcess] = []
        outcomes = asyncio.run(_streams(state, lambda: drained.append(
            fornax("host", "drain", "delta", "--timeout-s", "0.2", cwd=tmp_path, timeout=TIMEOUT_S))))
        for (expected, _, _), (got, error, _) in zip(reference, outcomes, strict=True):
            assert error is None, error  # a pause, never an error
            assert got == expected  # nothing lost, nothing doubled
        assert drained and drained[0].returncode == 0, drained[0].stderr if drained else "drain never ran"
        report = drained[0].stdout
        assert "routes removed: " in report and "delta" in report.splitlines()[0], report
        handed_off = int(report.split(" handed off")[0].rsplit(", ", 1)[-1])
        assert handed_off >= 1, report  # the drain caught streams on delta's route
        after = read_fleet(tmp_path / ".fornax")
        assert leaving.name not in [s.name for s in after.services]
        time.sleep(1.0)  # a supervisor poll or five: the worker stays down
        assert not pid_alive(leaving.pid)
        keeper = [e for name in ("keeper.out", "keeper.log") for e in log_events(tmp_path / ".fornax" / name)]
        assert not [e for e in keeper if e.get("event") == "worker_restarted"], keeper
        status = fornax("status", cwd=tmp_path, timeout=60)
        # The leaving route's other worker stays up, idle: no fault.
        assert status.returncode == 0 and "route: SERVING" in status.stdout, status.stdout
        serving_lines = [line for line in status.stdout.splitlines() if not line.startswith("removed route: ")]
        assert not [line for line in serving_lines if leaving.grpc in line] and "IDLE" in status.stdout, status.stdout
        assert f"removed route: HOST_DRAINED host {leaving.grpc}: " in status.stdout, status.stdout
        late = asyncio.run(_streams(after))
        assert [got for got, _, _ in late] == [expected for expected, _, _ in reference]
        _orchestrator_restarts_on_the_stored_set(tmp_path, leaving.grpc, [expected for expected, _, _ in reference])
        print(report + f"client largest gap {max(g for _, _, g in outcomes):.3f} s (physical, this host: "
              "four half-core netns hosts)")
    finally:
        down = fornax("down", cwd=tmp_path, timeout=120)
    assert down.returncode == 0, down.stderr
    assert record is not None and leftovers(record) == []
