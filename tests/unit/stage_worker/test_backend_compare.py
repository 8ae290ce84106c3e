"""CompareDecodeStep's worker half: the request grid is checked, and both backends run the served
step over the same weights, alternating run by run."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fornax.stage_worker.v1 import stage_worker_pb2 as pb
from libs.common.kinds import Backend
from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from libs.model.config import load_config
from libs.model.executor import StageSpec
from libs.model.kernels import make_kernels
from libs.model.weights import load_stage_weights
from libs.service.config import ServerConfig
from libs.service.errors import FailedPrecondition, InvalidArgument
from services.stage_worker.backend_compare import DecodeStepComparer, StepGrid, grid_from, time_steps
from services.stage_worker.config import StageWorkerConfig
from services.stage_worker.step_profile import KV_LIMIT_BYTES


@pytest.mark.parametrize(("fields", "field"), [
    ({"rows": []}, "rows"),
    ({"rows": [0, 1]}, "rows"),
    ({"rows": [1, 2000]}, "rows"),
    ({"rows": list(range(1, 10))}, "rows"),
    ({"rows": [1], "runs": 51}, "runs"),
    ({"rows": [1], "min_run_ms": 2001}, "min_run_ms"),
])
def test_bad_grids_are_refused_by_field(fields, field):
    with pytest.raises(InvalidArgument) as err:
        grid_from(pb.CompareDecodeStepRequest(**fields))
    assert err.value.field == field


def test_defaults():
    assert grid_from(pb.CompareDecodeStepRequest(rows=[8, 1, 8])) == StepGrid((1, 8), 32, 5, 0.05)


class CountingClock:
    """Each reading advances by one second: a run of n steps then reads n+1 ... seconds apart."""

    def __init__(self):
        self.now = 0.0
        self.readings = 0

    def __call__(self) -> float:
        self.readings += 1
        self.now += 1.0
        return self.now


def test_both_backends_run_the_served_step_every_run(tmp_path: Path):
    checkpoint = write_checkpoint(CheckpointRequest("tiny", tmp_path / "model", seed=3)).out_dir
    cfg = load_config(checkpoint)
    layers = cfg.num_hidden_layers
    weights = load_stage_weights(str(checkpoint), cfg, 0, layers, True, True)
    kernels = {"numpy": make_kernels("numpy", cfg, weights), "other": make_kernels("numpy", cfg, weights)}
    clock = CountingClock()
    samples = time_steps(cfg, kernels, StageSpec(0, layers, True, True, KV_LIMIT_BYTES),
                         StepGrid((1, 3), 4, 3, 0.0), clock)
    # min_run_s 0: one step per run, timed between two readings one second apart
    assert samples == {"numpy": {1: [1.0] * 3, 3: [1.0] * 3}, "other": {1: [1.0] * 3, 3: [1.0] * 3}}
    assert clock.readings == 2 * 2 * (1 + 3) * 2  # rows x backends x (warm + runs) x two readings


def test_a_numpy_worker_has_nothing_to_compare():
    cfg = StageWorkerConfig(ServerConfig("stage_worker"), backend=Backend.NUMPY)
    comparer = DecodeStepComparer(cfg, lambda: None, lambda: [])
    with pytest.raises(FailedPrecondition) as err:
        asyncio.run(comparer.compare(pb.CompareDecodeStepRequest(rows=[1])))
    assert err.value.reason == "NOTHING_TO_COMPARE"


def test_a_busy_worker_is_refused(tmp_path: Path):
    checkpoint = write_checkpoint(CheckpointRequest("tiny", tmp_path / "model", seed=3)).out_dir
    cfg = StageWorkerConfig(ServerConfig("stage_worker"), backend=Backend.MAX, read_roots=(tmp_path,))
    comparer = DecodeStepComparer(cfg, lambda: None, lambda: ["executing"])
    request = pb.CompareDecodeStepRequest(rows=[1], checkpoint_dir=str(checkpoint))
    request.layer_range.layer_end_exclusive = 1
    with pytest.raises(FailedPrecondition) as err:
        asyncio.run(comparer.compare(request))
    assert err.value.reason == "STAGE_BUSY"
