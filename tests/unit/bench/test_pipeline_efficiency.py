"""Pipeline efficiency and per-stage fractions from occupancy deltas (pure)."""

from __future__ import annotations

import pytest

from apps.bench.pipeline_efficiency import StageWindow, pipeline_efficiency


def test_efficiency_is_the_bottleneck_stage_busy_share_of_the_window():
    stages = {"stage-0": StageWindow(busy_s=4.0, credit_wait_s=5.0, input_wait_s=1.0),
              "stage-1": StageWindow(busy_s=8.5, credit_wait_s=0.0, input_wait_s=1.5)}
    figure = pipeline_efficiency(output_tokens=512, wall_s=10.0, stages=stages)
    assert figure["slowest_stage"] == "stage-1"
    assert figure["slowest_stage_alone_tokens_per_s"] == pytest.approx(512 / 8.5)
    assert figure["pipeline_efficiency"] == pytest.approx(0.85)
    assert stages["stage-0"].fractions() == pytest.approx(
        {"busy_fraction": 0.4, "credit_wait_fraction": 0.5, "input_wait_fraction": 0.1})


def test_an_empty_window_is_refused():
    with pytest.raises(ValueError):
        pipeline_efficiency(0, 1.0, {"stage-0": StageWindow(1.0, 0.0, 0.0)})
