"""`fornax up --backend max` adds numpy reference workers on each stage's CPU share, and the
orchestrator is told them and the shares; `fornax status` renders what the route runs."""

from __future__ import annotations

from pathlib import Path

from apps.fleet.backend_report import render_board
from apps.fleet.launcher import FleetOptions
from apps.fleet.reference import orchestrator_reference_env, reference_name, reference_workers, wants_reference_workers
from libs.service.fleet_state import ServiceEntry


def _options(**kw) -> FleetOptions:
    return FleetOptions(state_dir=Path("/tmp/x"), stages=2, checkpoint="/ckpt", **kw)


def test_only_a_max_fleet_with_a_checkpoint_gets_reference_workers():
    assert wants_reference_workers(_options(backend="max"))
    assert not wants_reference_workers(_options(backend="numpy"))
    assert not wants_reference_workers(_options(backend="max", serve_while_compiling=False))
    assert not wants_reference_workers(_options(backend="max", plan_mode="deployment"))  # never qualified
    assert not wants_reference_workers(FleetOptions(state_dir=Path("/tmp/x"), backend="max"))


def test_reference_workers_share_their_stage_cpus_and_reach_the_orchestrator():
    options, shares = _options(backend="max"), [(0,), (1, 2)]
    workers = reference_workers(options, shares)
    assert [w.name for w in workers] == ["stage_worker_0_reference", "stage_worker_1_reference"]
    assert [w.env["FORNAX_CPU_AFFINITY"] for w in workers] == ["0", "1,2"]
    assert {w.env["FORNAX_BACKEND"] for w in workers} == {"numpy"}
    entries = {reference_name(i): ServiceEntry(reference_name(i), "stage_worker", f"127.0.0.1:{9 + i}",
                                               "127.0.0.1:1", 1, "log") for i in range(2)}
    env = orchestrator_reference_env(options, entries, shares)
    assert env == {"FORNAX_STAGE_CPU_SETS": "0;1,2", "FORNAX_REFERENCE_STAGE_WORKERS": "127.0.0.1:9,127.0.0.1:10"}


def test_status_says_loudly_when_the_route_is_not_on_the_requested_backend():
    board = {"requested_backend": "max", "running_backend": "numpy", "phase": "compile_failed",
             "failure": "MAX compile of the final graph failed: boom",
             "stages": [{"index": 0, "backend": "numpy", "graphs": {"embed": "done", "final": "failed"}}],
             "graphs": [{"graph": "embed", "compile_seconds": 3.25}, {"graph": "final", "compile_seconds": None}]}
    lines = render_board(board)
    assert lines[0] == "backend: running numpy, requested max (compile_failed)"
    assert lines[1] == "  NOT ON MAX: MAX compile of the final graph failed: boom"
    assert "stage 0: numpy; max graphs: embed done, final failed" in lines[2]
    assert lines[3].startswith("  compiled embed in 3.2 s (physical")
    assert render_board(None) == ["backend: no route is serving yet"]


def test_status_names_each_stages_weight_policy():
    lines = render_board({"stage_weights": ["q4_k_m", "bf16"]})
    assert lines == ["weights: stage 0 q4_k_m, stage 1 bf16 (each stage's verified manifest)"]


def test_status_shows_each_stages_build_time_conversions():
    lines = render_board({"stage_weights": ["gguf", "gguf"],
                          "stage_conversions": [[], ["4 tensors F32 wanted fp32, held fp32 (e.g. x: composed)"]]})
    assert lines[1] == "  stage 1 converted at build: 4 tensors F32 wanted fp32, held fp32 (e.g. x: composed)"
    assert len(lines) == 2


def test_status_says_which_backend_runs_and_why_with_both_figures():
    from services.orchestrator.route.backend_choice import DEFAULT_ROWS, decide
    from tests.unit.orchestrator.test_backend_choice import TINY_MAX, TINY_NUMPY, stage

    choice = decide("max", (stage(0, TINY_NUMPY, TINY_MAX),), DEFAULT_ROWS)
    board = {"requested_backend": "max", "running_backend": "numpy", "phase": "serving_reference_measured_faster",
             "failure": "", "stages": [], "graphs": [], "choice": choice.snapshot()}
    lines = render_board(board)
    assert lines[0] == "backend: running numpy, requested max (serving_reference_measured_faster)"
    assert lines[1] == f"  backend choice (measured): {choice.reason}"
    assert lines[2] == ("  stage 0 layers 0-3 decode step: 1 row numpy 1.233 ms, max 7.124 ms (0.17x); "
                        "8 rows numpy 2.317 ms, max 13.192 ms (0.18x) (physical: median of runs on box-a, AMD EPYC, "
                        "cpuset 0-1, numpy 2.4.6, max 26.7.0, StageWorkerService/CompareDecodeStep)")


def test_the_switch_policy_and_rows_reach_the_orchestrator():
    from apps.fleet.compose import orchestrator_options_env

    env = orchestrator_options_env(_options(backend="max", max_switch="always", max_switch_rows="1,4"))
    assert (env["FORNAX_MAX_SWITCH"], env["FORNAX_MAX_SWITCH_ROWS"]) == ("always", "1,4")


def test_a_fleet_file_route_says_each_stage_runs_its_hosts_backend_not_none():
    from services.orchestrator.route.coldstart import UpgradePhase

    board = {"requested_backend": None, "running_backend": None, "phase": UpgradePhase.SERVING_REQUESTED_BACKEND.value,
             "failure": "", "stages": [], "graphs": []}
    assert render_board(board)[0] == "backend: each stage runs its own host's backend (serving_requested_backend)"
    installing = {**board, "phase": UpgradePhase.INSTALLING.value}
    assert render_board(installing)[0] == "backend: running none, requested each host's own backend (installing)"
    compiling = {**board, "running_backend": "numpy",
                 "phase": UpgradePhase.SERVING_REFERENCE_WHILE_COMPILING.value}
    assert render_board(compiling)[0] == ("backend: running numpy, requested each host's own backend "
                                          "(serving_reference_while_compiling)")
    failed = {**compiling, "phase": UpgradePhase.COMPILE_FAILED.value, "failure": "boom"}
    assert render_board(failed)[1] == "  NOT ON EACH HOST'S OWN BACKEND: boom"
