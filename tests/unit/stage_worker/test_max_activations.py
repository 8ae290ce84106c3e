"""A MAX stage's block-format activations are part of its contract: the spec field reaches the
LoadSpec, a bad value or a value on a numpy stage is refused with a stable reason, the worker's
--max-activations fills an empty field, and the MaxOptions a load builds carry it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from fornax.common.v1 import common_pb2
from fornax.stage_worker.v1 import stage_worker_pb2 as pb
from libs.common.kinds import Backend, DType
from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from libs.model.kernels import make_kernels
from libs.service.errors import InvalidArgument
from services.stage_worker import runtime as runtime_module
from services.stage_worker.config import StageWorkerConfig
from services.stage_worker.convert import load_spec_from_pb
from services.stage_worker.runtime import LoadSpec, PlanBinding, StageRuntime

PLAN = PlanBinding("p", "sha256:" + "0" * 64, "g")


def _request(backend: int, activations: str) -> pb.LoadStageRequest:
    return pb.LoadStageRequest(spec=pb.StageSpec(
        stage_index=0, stage_count=1, layer_range=common_pb2.LayerRange(layer_start=0, layer_end_exclusive=1),
        plan=common_pb2.PlanBinding(plan_id=PLAN.plan_id, plan_hash=PLAN.plan_hash,
                                    plan_generation_id=PLAN.plan_generation_id),
        checkpoint_dir="/never/read", backend=backend, boundary_dtype=common_pb2.ELEMENT_TYPE_FP32,
        output_mode=pb.OUTPUT_MODE_LOGITS, device="cpu", max_activations=activations))


def _spec(backend: Backend, activations: str | None, checkpoint: str = "/never/read") -> LoadSpec:
    return LoadSpec(0, 1, 0, 1, PLAN, backend, DType.FP32, checkpoint_dir=checkpoint, return_logits=True,
                    max_activations=activations)


@pytest.mark.parametrize(("activations", "expected"), [("float32", "float32"), ("int8", "int8"), ("", None)])
def test_the_spec_field_reaches_the_load_spec(activations, expected):
    assert load_spec_from_pb(_request(common_pb2.BACKEND_MAX, activations)).max_activations == expected


@pytest.mark.parametrize("bad", ["fp16", "INT8", "float"])
def test_an_unknown_value_is_refused_with_a_stable_reason(bad):
    with pytest.raises(InvalidArgument) as err:
        load_spec_from_pb(_request(common_pb2.BACKEND_MAX, bad))
    assert err.value.reason == "MAX_ACTIVATIONS_UNSUPPORTED" and err.value.field == "spec.max_activations"


@pytest.mark.parametrize("value", ["int8", "float32"])
def test_a_value_on_a_numpy_stage_is_refused_not_ignored(value):
    with pytest.raises(InvalidArgument) as err:
        load_spec_from_pb(_request(common_pb2.BACKEND_NUMPY, value))
    assert err.value.reason == "MAX_ACTIVATIONS_BACKEND" and err.value.field == "spec.max_activations"
    assert load_spec_from_pb(_request(common_pb2.BACKEND_NUMPY, "")).max_activations is None


def test_the_runtime_refuses_the_same_specs_before_loading():
    numpy_worker = StageRuntime(Backend.NUMPY, "cpu", 1 << 20)
    with pytest.raises(InvalidArgument) as err:
        numpy_worker._check_spec(_spec(Backend.NUMPY, "float32"))
    assert err.value.reason == "MAX_ACTIVATIONS_BACKEND"
    numpy_worker._check_spec(_spec(Backend.NUMPY, None))
    max_worker = StageRuntime(Backend.MAX, "cpu", 1 << 20)
    with pytest.raises(InvalidArgument) as err:
        max_worker._check_spec(_spec(Backend.MAX, "bf16"))
    assert err.value.reason == "MAX_ACTIVATIONS_UNSUPPORTED"
    max_worker._check_spec(_spec(Backend.MAX, "float32"))


def test_backend_options_carry_the_spec_value_else_the_workers():
    worker = StageRuntime(Backend.MAX, "cpu", 1 << 20, max_activations="float32")
    own = worker._backend_options(_spec(Backend.MAX, None))
    assert own is not None and own.block_activations == "float32" and own.device == "cpu"
    asked = worker._backend_options(_spec(Backend.MAX, "int8"))
    assert asked is not None and asked.block_activations == "int8"
    default = StageRuntime(Backend.MAX, "cpu", 1 << 20)._backend_options(_spec(Backend.MAX, None))
    assert default is not None and default.block_activations == "int8"
    assert StageRuntime(Backend.NUMPY, "cpu", 1 << 20)._backend_options(_spec(Backend.NUMPY, None)) is None


def test_a_loaded_stage_reports_the_activations_its_graphs_run(tmp_path: Path, monkeypatch):
    checkpoint = str(write_checkpoint(CheckpointRequest("tiny", tmp_path / "model", seed=1)).out_dir)
    built: list[object] = []

    def numpy_in_place_of_max(backend, cfg, weights, device, options):  # no MAX compile in a unit test
        built.append(options)
        return make_kernels("numpy", cfg, weights)

    monkeypatch.setattr(runtime_module, "make_kernels", numpy_in_place_of_max)
    worker = StageRuntime(Backend.MAX, "cpu", 1 << 20, max_activations="float32")
    assert worker._load_blocking(_spec(Backend.MAX, None, checkpoint)).max_activations == "float32"
    assert worker._load_blocking(_spec(Backend.MAX, "int8", checkpoint)).max_activations == "int8"
    assert [getattr(o, "block_activations", None) for o in built] == ["float32", "int8"]
    numpy_worker = StageRuntime(Backend.NUMPY, "cpu", 1 << 20)
    assert numpy_worker._load_blocking(replace(_spec(Backend.NUMPY, None, checkpoint))).max_activations == ""


def test_the_worker_setting_comes_from_the_flag_or_the_environment():
    assert StageWorkerConfig.from_env([], {"FORNAX_BACKEND": "max"}).max_activations == "int8"
    env = {"FORNAX_BACKEND": "max", "FORNAX_MAX_ACTIVATIONS": "float32"}
    assert StageWorkerConfig.from_env([], env).max_activations == "float32"
    assert StageWorkerConfig.from_env(["--max-activations", "int8"], env).max_activations == "int8"
    with pytest.raises(SystemExit, match="MAX_ACTIVATIONS_UNSUPPORTED"):
        StageWorkerConfig.from_env([], {"FORNAX_BACKEND": "max", "FORNAX_MAX_ACTIVATIONS": "fp16"})
    with pytest.raises(SystemExit, match="MAX_ACTIVATIONS_BACKEND"):
        StageWorkerConfig.from_env([], {"FORNAX_BACKEND": "numpy", "FORNAX_MAX_ACTIVATIONS": "float32"})
    assert StageWorkerConfig.from_env([], {"FORNAX_BACKEND": "numpy"}).max_activations == "int8"
