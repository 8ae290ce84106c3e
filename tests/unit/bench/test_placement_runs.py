"""A placement bench run: passes of the load merged into one figure, and options refused before
anything starts. Nothing is served here."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.bench.placement import PlacementBenchError, PlacementBenchOptions, merged_runs, run_placement_bench
from apps.bench.serve import RunFigures
from apps.fleet.spec import load_fleet_spec

FLEET = str(Path(__file__).resolve().parents[3] / "fleets" / "two-unlike-hosts.yaml")


def test_passes_of_a_load_merge_into_one_run_of_their_tokens_over_their_summed_wall_time():
    first = RunFigures(192, 0.25, [0.01, 0.02], [0.005], ((1, 2),))
    second = RunFigures(192, 0.15, [0.03], [0.004, 0.006], ((3,),))
    run = merged_runs([first, second])
    assert run.output_tokens == 384 and run.wall_s == pytest.approx(0.40)
    assert run.summary()["output_tokens_per_s"] == pytest.approx(960.0)  # not the mean of 768 and 1280
    assert run.ttft_s == [0.01, 0.02, 0.03] and run.itl_s == [0.005, 0.004, 0.006]
    assert run.streams == ((1, 2), (3,))


@pytest.mark.parametrize("field", ["repeats", "waves"])
def test_a_run_count_below_one_is_refused_before_any_fleet_starts(field, tmp_path):
    options = PlacementBenchOptions(FLEET, load_fleet_spec(FLEET), str(tmp_path), **{field: 0})
    with pytest.raises(PlacementBenchError, match=f"{field} must be at least 1, got 0"):
        run_placement_bench(options, "fornax bench placement")
