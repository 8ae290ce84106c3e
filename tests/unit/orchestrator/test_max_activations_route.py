"""The orchestrator's side of a MAX stage's block-format activations: background compiles compile
the chosen modes (and count a graph cached only in them), the route records what each stage
reported at load, and /v1/models and `fornax status` show it beside the stage's weights."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from apps.cli.main import main
from apps.fleet import backend_report
from apps.fleet.backend_report import render_board
from fornax.common.v1 import common_pb2
from fornax.stage_worker.v1 import stage_worker_pb2 as pb
from fornax.stage_worker.v1 import stage_worker_pb2_grpc as pb_grpc
from libs.model import compile_job, max_kernels
from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from libs.model.compile_cache import GraphTarget, config_sha256, record_compiled, stage_graphs
from libs.model.config import load_config
from libs.service.errors import FailedPrecondition, InvalidArgument
from libs.service.fleet_state import FleetState
from services.orchestrator.api.openai_response import model_object
from services.orchestrator.coldstart_setup import compile_activations
from services.orchestrator.engine.domain import RouteCard
from services.orchestrator.engine.model_card import served_model
from services.orchestrator.route import background_compile
from services.orchestrator.route.background_compile import BackgroundCompiler, CompileSettings, GraphState
from services.orchestrator.route.direct_load import checkpoint_stage_loads
from services.orchestrator.route.settings import RouteSettings
from services.orchestrator.route.stage_chain import StageLoad, load_route

BUILD = "max test-build"
RANGES = ((0, 2), (2, 4))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_checkpoint(CheckpointRequest("tiny", tmp_path_factory.mktemp("acts") / "tiny", seed=0)).out_dir


def _mark(cache: Path, checkpoint: Path, mode: str) -> None:
    cfg = load_config(checkpoint)
    for stage, (a, b) in enumerate(RANGES):
        for name in stage_graphs(cfg, a, b, stage == 0, stage == len(RANGES) - 1):
            record_compiled(cache, GraphTarget(name, BUILD, "cpu", "float32", config_sha256(cfg), (), mode), 1.0)


def test_graphs_count_as_cached_only_in_the_modes_the_stages_run(checkpoint, tmp_path):
    float32 = CompileSettings(str(checkpoint), tmp_path / "cache", BUILD, activations=("float32",))
    _mark(float32.cache_dir, checkpoint, "int8")  # a warm cache for the other mode
    assert BackgroundCompiler(CompileSettings(str(checkpoint), float32.cache_dir, BUILD), RANGES).all_cached()
    assert {g.state for g in BackgroundCompiler(float32, RANGES).graphs.values()} == {GraphState.QUEUED}
    _mark(float32.cache_dir, checkpoint, "float32")
    assert BackgroundCompiler(float32, RANGES).all_cached()


def test_the_compile_job_is_told_the_modes(checkpoint, tmp_path, monkeypatch):
    seen: list[tuple[str, ...]] = []

    class Done:
        returncode = 0

        async def communicate(self):
            return json.dumps({"state": "done", "seconds": 1.0}).encode(), b""

    async def spawn(*argv, **kwargs):
        seen.append(argv)
        return Done()

    monkeypatch.setattr(background_compile.asyncio, "create_subprocess_exec", spawn)
    settings = CompileSettings(str(checkpoint), tmp_path / "cache", BUILD, activations=("float32", "int8"))
    assert asyncio.run(BackgroundCompiler(settings, RANGES).run())
    assert seen and all(argv[argv.index("--activations") + 1] == "float32,int8" for argv in seen)
    sent = seen[0][seen[0].index("--activations") + 1]
    args = compile_job._parser().parse_args(["--checkpoint", "c", "--graph", "embed", "--cache-dir", "d",
                                             "--activations", sent])
    assert args.activations == ("float32", "int8")


def test_the_compile_job_refuses_an_unknown_mode_and_defaults_to_int8():
    base = ["--checkpoint", "c", "--graph", "embed", "--cache-dir", "d"]
    assert compile_job._parser().parse_args(base).activations == ("int8",)
    with pytest.raises(SystemExit):
        compile_job._parser().parse_args([*base, "--activations", "fp16"])


def _cfg(workers: tuple[str, ...], references: tuple[str, ...], modes: tuple[str, ...]):
    return SimpleNamespace(route=RouteSettings(stage_workers=workers, reference_stage_workers=references,
                                               worker_max_activations=modes))


def test_the_orchestrator_compiles_the_switching_stages_modes():
    assert compile_activations(_cfg(("a", "b"), ("ra", "rb"), ())) == ("int8",)
    assert compile_activations(_cfg(("a", "b"), ("ra", "rb"), ("float32", "float32"))) == ("float32",)
    assert compile_activations(_cfg(("a", "b"), ("ra", "rb"), ("float32", "int8"))) == ("float32", "int8")
    # b is a numpy host serving as its own reference: nothing of it is compiled
    assert compile_activations(_cfg(("a", "b"), ("ra", "b"), ("float32", "int8"))) == ("float32",)
    with pytest.raises(FailedPrecondition) as err:
        compile_activations(_cfg(("a", "b"), ("ra", "rb"), ("float32",)))
    assert err.value.reason == "MAX_ACTIVATIONS_MISMATCH"


def test_the_setting_refuses_an_unknown_mode():
    assert RouteSettings.from_env({"FORNAX_WORKER_MAX_ACTIVATIONS": "int8,float32"}).worker_max_activations == (
        "int8", "float32")
    with pytest.raises(InvalidArgument) as err:
        RouteSettings.from_env({"FORNAX_WORKER_MAX_ACTIVATIONS": "int8,fp16"})
    assert err.value.reason == "MAX_ACTIVATIONS_UNSUPPORTED"


class _Worker(pb_grpc.StageWorkerServiceServicer):
    def __init__(self, mode: str):
        self.mode = mode

    async def UnloadStage(self, request, context):
        return pb.UnloadStageResponse()

    async def LoadStage(self, request, context):
        return pb.LoadStageResponse(manifest_hash=f"m{request.spec.stage_index}", data_plane_address="x:1",
                                    max_activations=self.mode)


async def _load_two(modes: tuple[str, str]):
    servers, loads = [], []
    for index, mode in enumerate(modes):
        server = grpc.aio.server()
        pb_grpc.add_StageWorkerServiceServicer_to_server(_Worker(mode), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        loads.append(StageLoad(f"127.0.0.1:{port}", pb.StageSpec(
            stage_index=index, stage_count=2, plan=common_pb2.PlanBinding(plan_generation_id="g"))))
    try:
        return await load_route(loads, load_timeout_s=10)
    finally:
        for server in servers:
            await server.stop(None)


def test_the_route_records_what_each_stage_reported_at_load():
    plan = asyncio.run(_load_two(("float32", "")))
    assert [s.max_activations for s in plan.stages] == ["float32", ""]


def test_models_and_status_show_each_stages_mode_beside_its_weights(checkpoint):
    card = RouteCard(backend="mixed", stage_weights=("q4_k_m", "fp32"), stage_max_activations=("float32", ""))
    served = served_model(load_config(checkpoint), [(0, 2), (2, 4)], "tiny")
    execution = model_object(served.__class__(**{**served.__dict__, "card": card}), None)["fornax"]["execution"]
    assert execution["stage_max_activations"] == ["float32", ""]
    lines = render_board({"stage_weights": execution["stage_weights"],
                          "stage_max_activations": execution["stage_max_activations"]})
    assert lines[0] == ("weights: stage 0 q4_k_m (max activations float32), stage 1 fp32 "
                        "(each stage's verified manifest)")


def test_status_reads_each_stages_mode_from_the_models_listing(monkeypatch):
    listing = {"data": [{"fornax": {"execution": {"stage_weights": ["fp32"], "stage_max_activations": ["int8"]}}}]}

    class Reply:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self):
            return json.dumps(listing).encode()

    monkeypatch.setattr(backend_report.urllib.request, "urlopen", lambda *a, **k: Reply())
    board = backend_report.fetch_board(FleetState(services=(), api="http://127.0.0.1:1/v1"))
    assert board is not None and board["stage_max_activations"] == ["int8"]
    assert render_board(board)[0].startswith("weights: stage 0 fp32 (max activations int8)")


def test_max_warmup_compiles_the_graphs_of_the_chosen_mode(checkpoint, tmp_path, monkeypatch, capsys):
    used = []

    def warm(cfg, options, on_graph, variants):
        used.append(options)
        return {"embed": 0.0}

    monkeypatch.setattr(max_kernels, "warm_compile_cache", warm)
    monkeypatch.setattr(max_kernels, "max_build", lambda: BUILD)
    argv = ["max", "warmup", "--checkpoint", str(checkpoint), "--cache-dir", str(tmp_path / "c"), "--json"]
    assert main([*argv, "--max-activations", "float32"]) == 0
    assert json.loads(capsys.readouterr().out)["max_activations"] == "float32"
    assert main(argv) == 0
    assert [o.block_activations for o in used] == ["float32", "int8"]


def test_a_direct_load_sets_the_mode_on_its_max_stages_only():
    loads = checkpoint_stage_loads(["a:1", "b:1"], "/ck", [(0, 2), (2, 4)], backends=["max", "numpy"],
                                   max_activations="float32")
    assert [load.spec.max_activations for load in loads] == ["float32", ""]
    plain = checkpoint_stage_loads(["a:1"], "/ck", [(0, 4)], backends=["max"])
    assert plain[0].spec.max_activations == ""  # the worker's own
