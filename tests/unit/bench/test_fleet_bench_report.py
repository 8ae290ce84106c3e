"""The fleet bench's per-level arithmetic: hops, links and exposed wait from counter deltas."""

from __future__ import annotations

import pytest

from apps.bench.fleet_serve import _level_report
from apps.bench.serve import RunFigures


def test_a_level_turns_counter_deltas_into_per_token_figures():
    figures = RunFigures(output_tokens=10, wall_s=2.0, ttft_s=[0.1], itl_s=[0.05, 0.07])
    # Route stage 0 runs on worker 1 and stage 1 on worker 0: hops follow the route, not the names.
    before = {"stage-10": {"compute_s": 0.0, "queue_s": 0.0, "boundary_bytes": 0.0, "worker": "stage_worker_0"},
              "stage-0": {"compute_s": 1.0, "queue_s": 0.0, "boundary_bytes": 1000.0, "worker": "stage_worker_1"}}
    after = {"stage-10": {"compute_s": 2.5, "queue_s": 0.0, "boundary_bytes": 0.0, "worker": "stage_worker_0"},
             "stage-0": {"compute_s": 1.5, "queue_s": 0.25, "boundary_bytes": 6000.0, "worker": "stage_worker_1"}}
    report = _level_report(figures, before, after, {"fxh0": (100, 50)}, {"fxh0": (2100, 1050)},
                           {"alpha": "fxh0"})
    assert report["hops"] == {"hop_0": {"from": "stage-0", "to": "stage-10",
                                        "boundary_payload_bytes_per_token": 500.0}}
    assert report["host_links"]["alpha"] == {"bytes_out_per_token": 200.0, "bytes_in_per_token": 100.0}
    first, second = report["stages"]["stage-0"], report["stages"]["stage-10"]
    assert first["worker"] == "stage_worker_1"
    assert (first["compute_s"], first["device_queue_s"], first["exposed_wait_s"]) == (0.5, 0.25, 1.5)
    assert first["exposed_wait_fraction"] == 0.75
    assert (first["compute_fraction"], second["compute_fraction"]) == (0.25, 1.25)  # compute ÷ the level's wall
    assert second["exposed_wait_s"] == 0.0  # busier than the wall clock never goes negative
    assert report["output_tokens_per_s"] == 5.0


def test_a_level_reports_each_stage_fractions_and_the_pipeline_efficiency_from_gethealth_occupancy():
    figures = RunFigures(output_tokens=100, wall_s=2.0, ttft_s=[0.1], itl_s=[0.05])
    counters = {"stage-0": {"compute_s": 0.0, "queue_s": 0.0, "boundary_bytes": 0.0, "worker": "w0"},
                "stage-1": {"compute_s": 0.0, "queue_s": 0.0, "boundary_bytes": 0.0, "worker": "w1"}}
    # (busy, credit wait, input wait) ns, cumulative since each worker started.
    before = {"w0": (5 * 10**9, 0, 10**9), "w1": (10**9, 0, 10**9)}
    after = {"w0": (5 * 10**9 + 8 * 10**8, 10**9, 12 * 10**8), "w1": (10**9 + 17 * 10**8, 0, 13 * 10**8)}
    report = _level_report(figures, counters, counters, {}, {}, {}, before, after)
    first, second = report["stages"]["stage-0"], report["stages"]["stage-1"]
    assert (first["busy_fraction"], first["credit_wait_fraction"], first["input_wait_fraction"]) == \
        pytest.approx((0.4, 0.5, 0.1))
    assert second["busy_fraction"] == pytest.approx(0.85) and second["credit_wait_fraction"] == 0.0
    assert report["pipeline"]["slowest_stage"] == "stage-1"
    assert report["pipeline"]["pipeline_efficiency"] == pytest.approx(0.85)
