"""`fornax bench load --json` against a running fleet: every request accounted for."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request

import pytest

from apps.bench.load import Outcome, summarize
from tests.faults.fleet import live_fleet


def test_summary_counts_every_loss_by_cause():
    outcomes = [Outcome(True, 0.1 * i) for i in range(1, 11)] + [
        Outcome(False, 0.5, "http_503"), Outcome(False, 0.2, "connection_lost"),
        Outcome(False, 0.3, "http_503")]
    figures = summarize(outcomes, wall_s=2.0)
    assert (figures["requests"], figures["completed"], figures["lost"]) == (13, 10, 3)
    assert figures["lost_by_cause"] == {"connection_lost": 1, "http_503": 2}
    assert figures["p99_s"] == pytest.approx(0.991)
    assert figures["requests_per_s"] == 5.0


@pytest.mark.integration
def test_bench_load_json_against_a_running_fleet(tmp_path, checkpoint):
    with live_fleet(tmp_path, checkpoint) as fleet:
        run = subprocess.run(
            [sys.executable, "-m", "apps.cli.main", "bench", "load", "--state-dir",
             str(fleet.state_dir), "--requests", "120", "--concurrency", "16", "--json"],
            capture_output=True, text=True, timeout=300)
        fence = [_stage_metric(fleet, name, metric) for name in ("stage_worker_0", "stage_worker_1")
                 for metric in ("fornax_stage_lease_tombstones", "fornax_stage_lease_fence_entries")]
    assert run.returncode == 0, run.stderr
    figures = json.loads(run.stdout)
    assert (figures["requests"], figures["lost"], figures["completed"]) == (120, 0, 120)
    assert 0 < figures["p50_s"] <= figures["p99_s"]
    assert figures["provenance"]["evidence_class"] == "physical"
    # Leases are numbered (lease_sequence): 120 ended leases leave no per-lease tombstone on
    # either stage, and what fences them is bounded by the recent-end-reasons window.
    assert fence[0] == fence[2] == 0.0 and fence[1] <= 120 and fence[3] <= 120


def _stage_metric(fleet, name: str, metric: str) -> float:
    url = f"http://{fleet.entry(name).metrics}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    match = re.search(rf'^{re.escape(metric)}{{stage="stage-[0-9]+"}} ([0-9.e+-]+)$', text, re.MULTILINE)
    assert match, f"{metric} not exported by {name}"
    return float(match.group(1))
