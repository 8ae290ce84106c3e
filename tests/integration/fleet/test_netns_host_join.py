"""`fornax host add epsilon --fleet fleets/five-hosts.yaml --keep-serving --apply` beside a
four-host netns fleet that serves two replica routes, under concurrent greedy streams: the fifth
host is built, its worker starts with a fleet-CA certificate, the proposal (`+ epsilon` beside the
serving routes) is printed as a diff and applied make-before-break (the new route is installed
and warmed before it takes a request), and no stream is disturbed (identical text, no client
error); new requests then spread over three routes, and the set of three is committed to the
orchestrator's `route_set.json` (what it serves if it restarts). The joined host's clock was
checked (one box: no skew). `fornax down` removes the fifth host too.

Needs root and namespaces (CI is root); skipped elsewhere. numpy on every host, tiny checkpoint.
"""

from __future__ import annotations

import asyncio
import time

from apps.fleet.netns import leftovers, read_record
from libs.service.fleet_state import read_fleet
from services.orchestrator.route.route_set_store import read_route_set
from tests.integration.fleet.netns_routes import NETNS_ONLY, REPO, fornax
from tests.integration.fleet.test_netns_host_drain import _streams

pytestmark = NETNS_ONLY


def test_a_fifth_host_joins_under_greedy_streams_and_nothing_is_lost(tmp_path, checkpoint):
    started_at = time.monotonic()
    up = fornax("up", "--fleet", str(REPO / "fleets" / "four-hosts.yaml"), "--checkpoint", str(checkpoint),
                 "--routes", "2", cwd=tmp_path)
    try:
        assert up.returncode == 0, up.stderr
        state = read_fleet(tmp_path / ".fornax")
        began_at = time.monotonic()
        reference = asyncio.run(_streams(state))
        assert all(error is None for _, error, _ in reference), reference
        joined: list = []
        outcomes = asyncio.run(_streams(state, lambda: joined.append(fornax(
            "host", "add", "epsilon", "--fleet", str(REPO / "fleets" / "five-hosts.yaml"),
            "--checkpoint", str(checkpoint), "--keep-serving", "--apply", cwd=tmp_path, timeout=120))))
        for (expected, _, _), (got, error, _) in zip(reference, outcomes, strict=True):
            assert error is None, error
            assert got == expected
        assert joined and joined[0].returncode == 0, joined[0].stderr if joined else "add never ran"
        report = joined[0].stdout
        assert "host epsilon joined: stage_worker_4" in report and "proposed layout: " in report, report
        assert "+ epsilon" in report.splitlines() and "applied: 1 route(s) added" in report, report
        assert "clock of epsilon: " in report, report
        after = read_fleet(tmp_path / ".fornax")
        assert "stage_worker_4" in [s.name for s in after.services]
        committed = read_route_set(next((tmp_path / ".fornax" / "hosts").glob("*/orchestrator")))
        assert committed is not None and len(committed.routes) == 3, committed
        assert (after.entry("stage_worker_4").grpc,) in committed.routes and committed.route_groups[2] == ()
        again = fornax("host", "add", "epsilon", "--fleet", str(REPO / "fleets" / "five-hosts.yaml"),
                        "--checkpoint", str(checkpoint), cwd=tmp_path, timeout=120)
        assert again.returncode == 1 and "HOST_ALREADY_IN_FLEET" in again.stderr, again.stderr
        status = fornax("status", cwd=tmp_path, timeout=60)
        assert status.returncode == 0 and "route 2: SERVING" in status.stdout, status.stdout
        late = asyncio.run(_streams(after))
        assert [got for got, _, _ in late] == [expected for expected, _, _ in reference]
        print(report + f"client largest gap during the join {max(g for _, _, g in outcomes):.3f} s; up "
              f"{began_at - started_at:.0f} s, the rest {time.monotonic() - began_at:.0f} s (physical, this host)")
    finally:
        record = read_record(tmp_path / ".fornax")
        down = fornax("down", cwd=tmp_path, timeout=120)
    assert down.returncode == 0, down.stderr
    assert record is not None and any(ns.endswith("-epsilon") for ns in record.namespaces)
    assert leftovers(record) == []
