"""A stage profile samples the worker's own resident memory after each range loads and after
its timed steps, beside that range's weight files."""

from __future__ import annotations

import pytest

from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from libs.profiles.measure import Grid
from libs.profiles.schema import ResidentSample
from services.stage_worker.profiling import ProfileSource, measure_sources


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_checkpoint(CheckpointRequest("tiny", tmp_path_factory.mktemp("tiny"), seed=1)).out_dir


def test_each_source_is_sampled_after_load_and_after_its_steps_beside_its_own_weights(tiny):
    calls: list[tuple[str, tuple[str, ...], int]] = []

    def sample(point: str, dirs: tuple[str, ...], copied: int) -> ResidentSample:
        calls.append((point, dirs, copied))
        return ResidentSample(point, (len(calls) + 10) << 20, 0, 1 << 20, 0, 0)

    sources = [ProfileSource(str(tiny), 0, 2, True, False, "first"), ProfileSource(str(tiny), 3, 4, False, True,
                                                                                   "last")]
    grid = Grid((4,), (1,), (4,), runs=1, min_run_s=0.0)
    measured = measure_sources("numpy", "cpu", sources, grid, None, sample)
    assert [p for p, _, _ in calls] == ["after load of layers [0, 2)", "after the profiled steps of layers [0, 2)",
                                     "after load of layers [3, 4)", "after the profiled steps of layers [3, 4)"]
    assert all(dirs == (str(tiny),) for _, dirs, _ in calls)
    # the checkpoint's bf16 weights are held as float32 arrays of the process's own: weights, not runtime
    assert all(copied > 0 for _, _, copied in calls)
    assert measured.resident is not None and measured.resident.reserve_bytes == (14 - 1) << 20
    assert measure_sources("numpy", "cpu", sources[:1], grid, None).resident is None
