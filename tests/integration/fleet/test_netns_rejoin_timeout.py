"""`fornax up --fleet fleets/four-hosts.yaml --routes 2 --rejoin-timeout 3`: a stage worker is
killed with kill -9 under concurrent greedy streams and kept down (listed in
`<state>/retired.json`, as a drain leaves a worker, so the supervisor does not restart it). No
client sees an error and every stream's text equals an uninterrupted run's (the lost route's
streams replay on the other route); after the rejoin timeout the orchestrator removes the lost
route, and `fornax status` shows one serving route and the removed one, REJOIN_TIMEOUT, with its
host's worker.

Needs root and namespaces (CI is root); skipped elsewhere. numpy on every host, tiny checkpoint.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from apps.fleet.host_leave import retire_service
from apps.fleet.netns import leftovers, read_record
from libs.service.fleet_state import read_fleet
from tests.integration.fleet.netns_routes import NETNS_ONLY, REPO, fornax
from tests.integration.fleet.test_netns_replica_routes import _log_events, _streams

pytestmark = NETNS_ONLY

REJOIN_TIMEOUT_S = 3
REMOVAL_WAIT_S = 30  # the timeout, the probes that find the worker gone, and the removal


def _status_once_removed(cwd: Path) -> subprocess.CompletedProcess:
    """`fornax status` once it shows a removed route, or the last one after REMOVAL_WAIT_S."""
    give_up = time.monotonic() + REMOVAL_WAIT_S
    while True:
        status = fornax("status", cwd=cwd, timeout=60)
        if "removed route: " in status.stdout or time.monotonic() >= give_up:
            return status
        time.sleep(0.5)


def test_a_route_whose_host_stays_gone_is_removed_after_the_rejoin_timeout_with_nothing_lost(tmp_path, checkpoint):
    up = fornax("up", "--fleet", str(REPO / "fleets" / "four-hosts.yaml"), "--checkpoint", str(checkpoint),
                 "--routes", "2", "--rejoin-timeout", str(REJOIN_TIMEOUT_S), cwd=tmp_path)
    state_dir = tmp_path / ".fornax"
    record = read_record(state_dir)
    try:
        assert up.returncode == 0, up.stderr
        state = read_fleet(state_dir)
        reference = asyncio.run(_streams(state))
        assert all(error is None for _, error in reference), reference
        victim = state.entry(next(d.name for d in (state_dir / "hosts" / "delta").iterdir()
                                  if d.name.startswith("stage_worker_")))

        def kill_and_keep_down() -> None:
            retire_service(state_dir, victim.name)  # the supervisor must not bring it back
            os.kill(victim.pid, signal.SIGKILL)

        began = time.monotonic()
        outcomes = asyncio.run(_streams(state, kill_and_keep_down))
        for (expected, _), (got, error) in zip(reference, outcomes, strict=True):
            assert error is None, error  # a pause, never an error
            assert got == expected  # nothing lost, nothing doubled
        status = _status_once_removed(tmp_path)
        removed_after_s = time.monotonic() - began
        assert f"removed route: REJOIN_TIMEOUT host {victim.grpc}: " in status.stdout, status.stdout
        assert "route: SERVING" in status.stdout and "route 0:" not in status.stdout, status.stdout  # one route
        events = _log_events(state, "orchestrator")
        removed = [e for e in events if e.get("event") == "route_removed_rejoin_timeout"]
        assert [e.get("host") for e in removed] == [victim.grpc], removed
        moved = [e for e in events if e.get("event") == "route_failover"]
        assert moved or removed[0].get("handed_off"), "no stream was on the lost route"
        metrics = urllib.request.urlopen(f"http://{state.entry('orchestrator').metrics}/metrics", timeout=10)
        assert 'fornax_orchestrator_routes_removed_total{reason="REJOIN_TIMEOUT"} 1.0' in metrics.read().decode()
        late = asyncio.run(_streams(state))
        assert [got for got, _ in late] == [expected for expected, _ in reference]
        print(f"route removed {removed_after_s:.1f} s after the kill, rejoin timeout {REJOIN_TIMEOUT_S} s "
              "(physical, this host: four half-core netns hosts)")
    finally:
        down = fornax("down", cwd=tmp_path, timeout=120)
    assert down.returncode == 0, down.stderr
    assert record is not None and leftovers(record) == []
