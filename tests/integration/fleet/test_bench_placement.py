"""`fornax profile` then `fornax bench placement` on a numpy-only netns fleet of two unlike hosts
(tiny checkpoint): the calibrated split is the planner's plan from the stored profiles, the
report carries its figures with their classes and provenance, and compares each served split
with the planner's prediction for it. Bounded: a small profile grid, short generations, one repeat.

Needs root and namespaces (CI is root); skipped elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from apps.bench.placement import PlacementBenchError, PlacementBenchOptions, run_placement_bench
from apps.cli.main import main
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


def test_the_calibrated_split_is_the_planners_plan_from_the_stored_profiles(tmp_path):
    fleet_file = _fleet(tmp_path / "unlike.yaml")
    checkpoint = tiny_checkpoint(tmp_path / "tiny")
    state = tmp_path / "state"
    assert main(["profile", "--fleet", str(fleet_file), "--checkpoint", str(checkpoint), "--state-dir", str(state),
                 "--runs", "2", "--prefill-lengths", "16", "--decode-batches", "1,4", "--min-run-ms", "50",
                 "--no-serving-window"]) == 0
    options = PlacementBenchOptions(str(fleet_file), load_fleet_spec(str(fleet_file)), str(checkpoint),
                                    prompt_tokens=8, max_tokens=8, concurrency=4, repeats=1,
                                    profiles_state_dir=str(state))
    report = run_placement_bench(options, "fornax bench placement --fleet unlike.yaml --json")

    assert report["calibrated_vs_even_tok_s"] > 0 and report["bottleneck_prediction_error"] >= 0
    calibrated, plan = report["calibrated"], report["plan"]
    assert calibrated["layer_ranges"] == [[s["layer_start"], s["layer_end_exclusive"]] for s in plan["stages"]]
    assert calibrated["hosts"] == [s["host"] for s in plan["stages"]]
    terms = [t for s in plan["stages"] for t in s["terms"]]
    assert {t["term"] for t in terms} >= {"compute", "step", "wire", "memory"}
    assert all(t["class"].startswith("physical") for t in terms)
    assert report["even"]["layer_ranges"] == [[0, 2], [2, 4]]
    for split in ("even", "calibrated"):
        view = report[split]
        assert view["output_tokens_per_s"] > 0 and view["load"]["stages"] == 2
        assert all(s["measured_decode_service_s"] > 0 and s["predicted_decode_service_s"] > 0
                   and s["predicted_at_rows"] >= 1 for s in view["stages"])
        assert view["measured_bottleneck_s"] == max(s["measured_decode_service_s"] for s in view["stages"])
        # every stage counted the past its decode rows ran at (prompt 8, rows at past 8..14, some
        # fewer if a microbatch ran short), and the prediction was evaluated there
        pasts = [s["measured_past_per_row"] for s in view["stages"]]
        assert all(8 <= p <= 14 for p in pasts) and max(pasts) - min(pasts) < 1e-9
        assert all(s["predicted_at_past_tokens"] == round(pasts[0]) for s in view["stages"])
    assert plan["target_decode_context_tokens"] == 11  # the load's mean past: 8 + (7 - 1) / 2
    prov = report["provenance"]
    assert prov["evidence_class"] == "physical" and prov["command"].startswith("fornax bench placement")
    assert prov["model_snapshot"].startswith("sha256:") and len(prov["load_average"]) == 3
    assert prov["hosts"]["beta"]["cpu_quota_cores"] == pytest.approx(0.05)
    assert prov["hosts"]["alpha"]["backend_build"].startswith("numpy")
    assert set(report["figure_classes"]) >= {"calibrated_vs_even_tok_s", "bottleneck_prediction_error"}


def test_without_stored_profiles_the_bench_refuses_before_starting_a_fleet(tmp_path):
    fleet_file = _fleet(tmp_path / "unlike.yaml")
    options = PlacementBenchOptions(str(fleet_file), load_fleet_spec(str(fleet_file)), str(tmp_path / "ck"),
                                    profiles_state_dir=str(tmp_path / "none"))
    with pytest.raises(PlacementBenchError, match="fornax profile"):
        run_placement_bench(options, "fornax bench placement")
