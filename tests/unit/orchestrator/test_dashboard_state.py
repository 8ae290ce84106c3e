"""The dashboard's pure core: rates and per-batch phase means from cumulative counters,
bounded history, error counts by reason over a window."""

from __future__ import annotations

import pytest

from services.orchestrator.api.dashboard_state import HISTORY_SAMPLES, DashboardState, Sample
from services.orchestrator.engine.domain import ServedModel, StageLayout, StageStats


def _stage(index: int, batches: int, compute_ns: int, wire_ns: int = 0) -> StageStats:
    return StageStats(index, f"10.0.0.{index}:1", 1024 * batches, 1 << 20, 2, batches,
                      queue_ns=batches * 1000, compute_ns=compute_ns, transfer_ns=wire_ns)


def _sample(t: float, tokens: int, live: int, errors: dict[str, int], *stages) -> Sample:
    return Sample(t, tokens, live, errors, tuple(stages))


SERVED = ServedModel("m", 4096, 512, (StageLayout(0, 2, 10), StageLayout(2, 4, 10)))


def test_rates_and_phase_means_come_from_deltas():
    state = DashboardState()
    state.record(_sample(10.0, 100, 0, {}, _stage(0, 10, 10_000_000, 5_000_000), _stage(1, 10, 20_000_000)))
    state.record(_sample(12.0, 160, 3, {}, _stage(0, 14, 18_000_000, 9_000_000), _stage(1, 14, 40_000_000)))
    snap = state.snapshot(SERVED, 12.0)
    assert snap["tokens_per_s"] == [30.0] and snap["active_requests"] == [3]
    first, second = snap["stages"]
    assert first["phase_ms"]["compute"] == pytest.approx(2.0)   # 8 ms over 4 batches
    assert first["phase_ms"]["transfer"] == pytest.approx(1.0)
    assert second["phase_ms"]["compute"] == pytest.approx(5.0)
    assert first["kv_bytes_used"] == 14 * 1024 and first["host"] == "10.0.0.0:1"
    assert [s["layer_start"] for s in snap["route"]["stages"]] == [0, 2]


def test_an_idle_interval_has_no_phase_means():
    state = DashboardState()
    state.record(_sample(1.0, 5, 0, {}, _stage(0, 3, 900)))
    state.record(_sample(2.0, 5, 0, {}, _stage(0, 3, 900)))
    assert state.snapshot(SERVED, 2.0)["stages"][0]["phase_ms"]["compute"] is None
    assert state.snapshot(SERVED, 2.0)["tokens_per_s"] == [0.0]


def test_history_is_bounded_and_errors_expire():
    state = DashboardState()
    for t in range(HISTORY_SAMPLES + 150):
        state.record(_sample(float(t), t * 2, 1, {"deadline": t // 100}, _stage(0, t, t)))
    state.error(float(HISTORY_SAMPLES + 149), "capacity")
    snap = state.snapshot(SERVED, float(HISTORY_SAMPLES + 149))
    assert len(snap["tokens_per_s"]) == HISTORY_SAMPLES
    # deadline counts rose at t = 100, 200, 300 and 400; the one at 100 is older than the window.
    assert snap["errors"] == {"capacity": 1, "deadline": 3}


def test_a_stage_reports_its_kv_blocks_and_prefix_hit_rate():
    state = DashboardState()
    stage = StageStats(0, "h:1", 0, 1 << 20, 0, 1, kv_blocks_free=60, kv_blocks_total=64,
                       prefix_hit_blocks=3, prefix_missed_blocks=1)
    state.record(_sample(1.0, 0, 0, {}, stage, _stage(1, 1, 10)))
    first, second = state.snapshot(SERVED, 1.0)["stages"]
    assert (first["kv_blocks_free"], first["kv_blocks_total"], first["prefix_hit_rate"]) == (60, 64, 0.75)
    assert second["prefix_hit_rate"] is None  # no lookup yet: no rate
