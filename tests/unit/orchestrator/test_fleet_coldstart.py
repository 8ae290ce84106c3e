"""Serve-at-once on a fleet file: a numpy host's own worker is its stage's reference, so only the
MAX stages compile, are measured, and give a reference worker back after the switch."""

from __future__ import annotations

import asyncio

import pytest

from libs.common.kinds import Backend, DType
from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from services.orchestrator import coldstart_setup
from services.orchestrator.config import OrchestratorConfig
from services.orchestrator.route.backend_choice import StageStepTimes
from services.orchestrator.route.background_compile import BackgroundCompiler, CompileSettings
from services.orchestrator.route.lifecycle import InstallRequest, RouteState, RouteStatus, StageInfo

# alpha (MAX) has a reference worker of its own; beta (numpy) is its own reference.
FLEET_ENV = {"FORNAX_STAGE_WORKERS": "alpha:1,beta:2", "FORNAX_REFERENCE_STAGE_WORKERS": "alpha:3,beta:2",
             "FORNAX_BACKEND": "worker", "FORNAX_WORKER_WEIGHTS": "fp32,fp32"}


def _cfg(**extra: str) -> OrchestratorConfig:
    return OrchestratorConfig.from_env([], {**FLEET_ENV, **extra})


def test_only_stages_whose_reference_is_another_worker_switch():
    assert coldstart_setup.switching_stages(_cfg()) == (0,)
    local = OrchestratorConfig.from_env([], {"FORNAX_STAGE_WORKERS": "a:1,b:2",
                                             "FORNAX_REFERENCE_STAGE_WORKERS": "c:3,d:4"})
    assert coldstart_setup.switching_stages(local) == (0, 1)


def test_a_fleet_route_switches_to_max():
    request = InstallRequest("/ckpt", 2, None, DType.FP32)
    assert coldstart_setup.switch_candidate(request) == "max"
    assert coldstart_setup.switch_candidate(InstallRequest("/ckpt", 2, Backend.MAX, DType.FP32)) == "max"


def test_only_max_stages_compile_graphs(tmp_path):
    checkpoint = write_checkpoint(CheckpointRequest("tiny", tmp_path / "tiny")).out_dir
    settings = CompileSettings(str(checkpoint), tmp_path / "cache", "max test-build")
    every = BackgroundCompiler(settings, ((0, 2), (2, 4)))
    fleet = BackgroundCompiler(settings, ((0, 2), (2, 4)), compiled_stages=(0,))
    assert "final" in {g.value for g in every.graphs}
    assert {g.value for g in fleet.graphs} == {"embed", "dense_layer", "moe_layer", "expert"}
    assert fleet.stage_graph_states(1) == {}


def test_the_measured_switch_times_the_max_stages_only(monkeypatch):
    compared: list[str] = []

    async def compare(cfg, address, stage, checkpoint, rows):
        compared.append(address)
        samples = {b: dict.fromkeys(rows, (0.001 if b == "max" else 0.002,)) for b in ("numpy", "max")}
        return StageStepTimes(stage.index, stage.layer_start, stage.layer_end, "alpha", "cpu", 1.5, "0", "c", 32,
                              {"numpy": "numpy", "max": "max"}, samples)

    monkeypatch.setattr(coldstart_setup, "_compare_on", compare)
    serving = RouteStatus(RouteState.SERVING, None, (StageInfo(0, "alpha:3", 0, 2, "m0"),
                                                     StageInfo(1, "beta:2", 2, 4, "m1")), 0, None)
    chooser = coldstart_setup.chooser(_cfg())
    choice = asyncio.run(chooser.choose(InstallRequest("/ckpt", 2, None, DType.FP32), serving))
    assert compared == ["alpha:1"]
    assert (choice.backend, choice.candidate, [s.stage for s in choice.stages]) == ("max", "max", [0])


def test_a_packed_fleet_is_not_measured():
    from libs.service.errors import FailedPrecondition

    serving = RouteStatus(RouteState.SERVING, None, (), 0, None)
    chooser = coldstart_setup.chooser(_cfg(FORNAX_WORKER_WEIGHTS="q4_k_m,fp32"))
    with pytest.raises(FailedPrecondition) as info:
        asyncio.run(chooser.choose(InstallRequest("/ckpt", 2, None, DType.FP32), serving))
    assert info.value.reason == "SWITCH_NOT_MEASURABLE" and "q4_k_m" in info.value.message


def test_after_the_switch_only_separate_reference_workers_unload(monkeypatch):
    unloaded: list[str] = []

    class Stub:
        def __init__(self, channel):
            self.address = channel

        async def UnloadStage(self, request, timeout):  # noqa: N802  (the gRPC method's name)
            unloaded.append(self.address)

    class Channel:
        def __init__(self, address, config):
            self.address = address

        async def __aenter__(self):
            return self.address

        async def __aexit__(self, *exc):
            return False

    import libs.service.channels as channels
    from fornax.stage_worker.v1 import stage_worker_pb2_grpc

    monkeypatch.setattr(stage_worker_pb2_grpc, "StageWorkerServiceStub", Stub)
    monkeypatch.setattr(channels, "open_aio_channel", Channel)
    unload = coldstart_setup.unload_reference(_cfg())
    assert unload is not None
    asyncio.run(unload())
    assert unloaded == ["alpha:3"]  # beta's worker serves the MAX route's generation: it stays loaded
