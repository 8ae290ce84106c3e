"""`fornax bench placement` on a numpy-only netns fleet of two unlike hosts (tiny checkpoint):
the report carries its figures with their classes and provenance, and the calibrated split gives
the slower host fewer layers. Bounded: one concurrency level, short generations, one repeat.

Needs root and namespaces (CI is root); skipped elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from apps.bench.placement import PlacementBenchOptions, run_placement_bench
from apps.bench.placement_core import HostFit, calibrated_ranges
from apps.fleet.spec import load_fleet_spec
from tests.integration.orchestrator.harness import tiny_checkpoint

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or not Path("/proc/self/ns/net").exists(),
                       reason="netns fleets need root and namespaces"),
]


def _fleet(path: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "version": 1, "control_host": "alpha", "boundary_dtype": "fp32",
        "hosts": [
            {"name": "alpha", "backend": "numpy", "cpu_cores": 1.0, "memory_limit": "3GiB",
             "link": {"rate": "1Gbit/s"}},
            {"name": "beta", "backend": "numpy", "cpu_cores": 0.05, "memory_limit": "2GiB",
             "link": {"rate": "1Gbit/s"}},
        ],
    }))
    return path


def test_calibrated_split_gives_the_slower_host_fewer_layers(tmp_path):
    fleet_file = _fleet(tmp_path / "unlike.yaml")
    checkpoint = tiny_checkpoint(tmp_path / "tiny")
    options = PlacementBenchOptions(str(fleet_file), load_fleet_spec(str(fleet_file)), str(checkpoint),
                                    prompt_tokens=8, max_tokens=8, concurrency=4, repeats=1)
    report = run_placement_bench(options, "fornax bench placement --fleet unlike.yaml --json")

    assert report["calibrated_vs_even_tok_s"] > 0 and report["bottleneck_prediction_error"] >= 0
    (alpha_start, alpha_end), (beta_start, beta_end) = report["calibrated"]["layer_ranges"]
    assert alpha_start == 0 and alpha_end == beta_start and beta_end == 4
    # The calibrated split is the planner's answer to the costs this run measured (which host is
    # slower per layer is itself a measurement: on a starved 2-core box a 0.05-core quota can
    # throttle both warm-up splits alike, so the test checks the decision, not the noise).
    costs = report["host_costs"]
    fits = tuple(HostFit(costs[h]["per_layer_decode_s"], costs[h]["fixed_decode_s"], ()) for h in ("alpha", "beta"))
    assert [list(r) for r in calibrated_ranges(fits, 4, hop_s=0.0)] == report["calibrated"]["layer_ranges"]
    alpha, beta = fits
    if max(alpha.predict(3), beta.predict(1)) < min(max(alpha.predict(2), beta.predict(2)),
                                                    max(alpha.predict(1), beta.predict(3))):
        assert beta_end - beta_start < alpha_end - alpha_start  # beta measured slower: fewer layers
    assert report["even"]["layer_ranges"] == [[0, 2], [2, 4]]
    assert report["calibrated_equals_even"] is (report["calibrated"]["layer_ranges"] == [[0, 2], [2, 4]])
    assert set(report["host_costs"]) == {"alpha", "beta"}
    for split in ("even", "calibrated"):
        view = report[split]
        assert view["output_tokens_per_s"] > 0
        assert [s["host"] for s in view["stages"]] == ["alpha", "beta"]
        assert all(s["measured_decode_service_s"] > 0 for s in view["stages"])
        assert view["measured_bottleneck_s"] == max(s["measured_decode_service_s"] for s in view["stages"])
    prov = report["provenance"]
    assert prov["evidence_class"] == "physical" and prov["command"].startswith("fornax bench placement")
    assert prov["model_snapshot"].startswith("sha256:") and len(prov["load_average"]) == 3
    assert prov["hosts"]["beta"]["cpu_quota_cores"] == pytest.approx(0.05)
    assert prov["hosts"]["alpha"]["backend_build"].startswith("numpy")
    assert set(report["figure_classes"]) >= {"calibrated_vs_even_tok_s", "bottleneck_prediction_error"}
