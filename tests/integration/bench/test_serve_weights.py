"""`fornax bench serve --weights`: a 1-stage route on the policy's artifact measured beside the
float32 one, with the greedy streams and the resident memory the report needs."""

from __future__ import annotations

import pytest

from apps.bench import serve
from tests.integration.orchestrator.harness import tiny_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_the_policy_route_is_measured_beside_float32_with_its_resident_memory(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path / "tiny")
    options = serve.BenchOptions(str(checkpoint), prompt_tokens=8, max_tokens=4, concurrency=(1, 4), repeats=1,
                                 weights="q8_0")
    report = serve.run(options, "fornax bench serve --weights q8_0")
    policy = report["pipeline_1_stage_q8_0"]
    for level in ("c1", "c4"):
        assert policy[level]["output_tokens"] == int(level[1:]) * 4
        assert report[f"vs_fp32_{level}"] == pytest.approx(
            policy[level]["output_tokens_per_s"] / report["pipeline_1_stage"][level]["output_tokens_per_s"])
    resident = report["resident"]
    assert 0 < resident["artifact_bytes"] < 1 << 20 and resident["rss_bytes"] > resident["artifact_bytes"]
    assert resident["resident_vs_artifact"] == pytest.approx(
        resident["rss_bytes"] / (resident["artifact_bytes"] + resident["kv_reserve_bytes"]))
    assert report["provenance"]["weights"] == "q8_0"
