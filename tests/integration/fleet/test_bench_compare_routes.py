"""`fornax bench serve --fleet fleets/four-hosts.yaml --compare-routes --kill-at S`: both layouts
planned and served in one run, every figure labelled, and the kill window on the replica routes
loses no request and answers no 5xx (the lost route's streams are replayed on the other route).
Asserts the report's shape and the kill's outcome, never a speed.

Needs root and namespaces (CI is root); skipped elsewhere. Tiny checkpoint, short generations.
"""

from __future__ import annotations

import json

import pytest

from apps.bench.layout_compare import REPLICAS, SINGLE
from tests.integration.fleet.netns_routes import NETNS_ONLY, REPO, fornax

pytestmark = [*NETNS_ONLY, pytest.mark.slow]


def test_both_layouts_are_served_side_by_side_and_a_killed_stage_loses_nothing(tmp_path, checkpoint):
    run = fornax("bench", "serve", "--fleet", str(REPO / "fleets" / "four-hosts.yaml"), "--checkpoint",
                 str(checkpoint), "--compare-routes", "--concurrency", "1,8", "--max-tokens", "8",
                 "--kill-at", "0.5", "--json", cwd=tmp_path, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert set(report["layouts"]) == {SINGLE, REPLICAS}
    assert report["layouts"][SINGLE]["description"] == "1 route: alpha>beta>gamma>delta"
    assert [len(group) for group in report["layouts"][REPLICAS]["hosts"]] == [2, 2]
    for layout in report["layouts"].values():
        assert set(layout["measured"]) == {"c1", "c8"}
        assert layout["measured"]["c1"]["output_tokens"] > 0
        assert "c8" in layout["predicted_tok_s"] and "c1" not in layout["predicted_tok_s"]
    assert report["chosen"] in (SINGLE, REPLICAS)
    assert 0 < report["chosen_vs_best_c8"] <= 1.0
    assert isinstance(report["planner_picked_faster"], bool)
    assert report["provenance"]["hardware"] and report["provenance"]["model_snapshot"].startswith("sha256:")
    kill = report["kill"]
    assert (kill["requests"], kill["lost_requests"], kill["http_5xx"]) == (32, 0, 0)
    assert kill["killed"].startswith("stage_worker_")
