"""`fornax bench prefix --fleet`: the prefix bench's chat and agent workloads through a 2-host
numpy netns fleet (tiny checkpoint, short workloads) over its HTTPS front: with reuse on the
chat's cached tokens grow turn by turn and the agent calls after the first hit the shared system
prompt; with it off (a fresh cache_salt per request) nothing is cached; the greedy text is the
same either way, and the report names the fleet. TTFT figures are printed, never asserted.

Needs root and namespaces (CI is root); skipped elsewhere.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from apps.bench.prefix import PrefixBenchOptions
from apps.bench.prefix_fleet import PrefixFleetOptions, run_prefix_fleet
from apps.fleet.spec import load_fleet_spec
from tests.integration.orchestrator.harness import tiny_checkpoint

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or not Path("/proc/self/ns/net").exists(),
                       reason="netns fleets need root and namespaces"),
]
REPO = Path(__file__).resolve().parents[3]


def test_prefix_bench_through_a_netns_fleet(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path / "tiny")
    fleet_file = str(REPO / "fleets" / "two-hosts-core-each.yaml")
    bench = PrefixBenchOptions(str(checkpoint), turns=3, turn_tokens=40, agent_system_tokens=100,
                               agent_call_tokens=8, agent_calls=3, max_tokens=6)
    report = run_prefix_fleet(PrefixFleetOptions(fleet_file, load_fleet_spec(fleet_file), bench), "test")
    assert report["greedy_outputs_identical"] is True
    assert report["route"].startswith(f"netns fleet {fleet_file}") and report["backend"] == "numpy"
    on, off = report["chat"]["on"], report["chat"]["off"]
    assert [t["prompt_tokens"] for t in on] == [t["prompt_tokens"] for t in off]
    assert all(t["cached_tokens"] == 0 for t in off)
    cached = [t["cached_tokens"] for t in on]
    assert cached[0] == 0 and all(a < b for a, b in itertools.pairwise(cached)), cached
    assert report["agent"]["hit_rate_on"] > 0.5  # 3 calls of 108 tokens: the last two reuse 96 each
