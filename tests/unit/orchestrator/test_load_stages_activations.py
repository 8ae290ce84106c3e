"""An install loads each MAX stage in the block-format activations its plan names (the mode its
profile was timed in), not in whatever its worker defaults to: `load_stages` puts the mode in
each StageSpec, a worker started in the other mode loads the stage in the plan's, and a spec
whose mode its stage cannot run is refused (fail closed, never served in another mode)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fornax.artifact_builder.v1 import artifact_builder_pb2 as ab_pb
from fornax.stage_worker.v1 import stage_worker_pb2 as sw_pb
from libs.common.kinds import Backend, DType
from libs.common.proto import BACKEND_TO_PB
from libs.service.errors import InvalidArgument
from services.orchestrator.route import install
from services.orchestrator.route.install import Fleet, InstallSpec, load_stages
from services.orchestrator.route.stage_chain import RoutePlan
from services.planner import domain as d
from services.stage_worker.convert import load_spec_from_pb
from services.stage_worker.runtime import StageRuntime

NONE = d.StageCost(0.0, 0.0, 0.0, 0.0)


def _stage(index: int, backend: str, mode: str, count: int = 3) -> d.PlannedStage:
    return d.PlannedStage(
        stage_index=index, node=f"stage_worker_{index}", backend=backend, build="b", layer_start=index,
        layer_end=index + 1, owns_embeddings=index == 0, owns_head=index == count - 1, weight_bytes=1,
        kv_bytes=0, activation_bytes=0, reserve_bytes=0, node_memory_bytes=1, decode=NONE, prefill=NONE,
        max_activations=mode)


def _plan(*stages: d.PlannedStage) -> d.Plan:
    return d.Plan(plan_id="plan-x", plan_hash="sha256:" + "1" * 64, mode="exploratory", objective="throughput",
                  model_snapshot="m", method="test", stages=stages, predictions=())


def _specs(plan: d.Plan, monkeypatch, backend: Backend | None = None) -> list[sw_pb.StageSpec]:
    sent: list[sw_pb.StageSpec] = []

    async def no_workers(loads, **kw) -> RoutePlan:  # the specs, as load_route would send them
        sent.extend(load.spec for load in loads)
        return RoutePlan("p", plan.plan_hash, "g", ())

    monkeypatch.setattr(install, "load_route", no_workers)
    spec = InstallSpec("ck", len(plan.stages), backend, DType.FP32, Path("state"))
    fleet = Fleet("planner", "builder", tuple(f"w{i}:1" for i in range(len(plan.stages))))
    artifacts = [ab_pb.StageArtifact(manifest_hash=f"sha256:{i}") for i in range(len(plan.stages))]
    asyncio.run(load_stages(spec, fleet, plan, artifacts, "g", lambda message: None))
    return sent


def test_each_stage_spec_carries_the_plans_mode(monkeypatch):
    plan = _plan(_stage(0, "max", "float32"), _stage(1, "numpy", ""), _stage(2, "max", "int8"))
    sent = _specs(plan, monkeypatch)
    assert [s.max_activations for s in sent] == ["float32", "", "int8"]
    assert [s.stage_index for s in sent] == [0, 1, 2]


def test_a_plan_stored_before_the_field_leaves_the_worker_default(monkeypatch):
    sent = _specs(_plan(_stage(0, "max", "", 1)), monkeypatch)
    assert [s.max_activations for s in sent] == [""]
    assert load_spec_from_pb(sw_pb.LoadStageRequest(spec=sent[0])).max_activations is None


def test_a_worker_started_in_the_other_mode_loads_the_plans(monkeypatch, tmp_path: Path):
    (sent,) = _specs(_plan(_stage(0, "max", "float32", 1)), monkeypatch)
    load = load_spec_from_pb(sw_pb.LoadStageRequest(spec=sent))
    worker = StageRuntime(Backend.MAX, "cpu", 1 << 20, artifact_cache_dir=str(tmp_path),
                          max_activations="int8")  # its own default: int8
    worker._check_spec(load)
    options = worker._backend_options(load)
    assert options is not None and options.block_activations == "float32"  # the graphs compile in it
    assert worker.activations_of(load) == "float32"


def test_a_stage_the_install_runs_on_numpy_gets_no_mode(monkeypatch):
    # The serve-at-once reference route installs a MAX plan on numpy: no mode goes to numpy,
    # which would refuse one (MAX_ACTIVATIONS_BACKEND).
    (sent,) = _specs(_plan(_stage(0, "max", "int8", 1)), monkeypatch, backend=Backend.NUMPY)
    assert sent.backend == BACKEND_TO_PB[Backend.NUMPY] and sent.max_activations == ""
    assert load_spec_from_pb(sw_pb.LoadStageRequest(spec=sent)).max_activations is None


def test_a_mode_on_a_numpy_stage_is_refused(monkeypatch):
    (spec,) = _specs(_plan(_stage(0, "max", "int8", 1)), monkeypatch, backend=Backend.NUMPY)
    spec.max_activations = "int8"  # a numpy stage given a mode: refused, never ignored
    with pytest.raises(InvalidArgument) as refused:
        load_spec_from_pb(sw_pb.LoadStageRequest(spec=spec))
    assert (refused.value.reason, refused.value.field) == ("MAX_ACTIVATIONS_BACKEND", "spec.max_activations")
