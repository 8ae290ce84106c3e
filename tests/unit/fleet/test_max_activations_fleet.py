"""`fornax up --max-activations` and a fleet file's per-host `max_activations:` reach the MAX stage
workers (FORNAX_MAX_ACTIVATIONS) and the orchestrator's background compile
(FORNAX_WORKER_MAX_ACTIVATIONS); numpy hosts and reference workers never get one, and a value
that cannot apply is refused before anything starts."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from apps.cli import fleet as fleet_cli
from apps.cli.main import main
from apps.fleet import compose
from apps.fleet.launcher import FleetOptions
from apps.fleet.netns_compose import _orchestrator_env, worker_process
from apps.fleet.netns_plan import CgroupVersion, make_plan
from apps.fleet.spec import FleetFileError, parse_fleet_spec
from services.orchestrator.route.settings import RouteSettings

HOST = {"cpu_cores": 1, "memory_limit": "1GiB", "link": {"rate": "1Gbit/s"}}


def _raw(a: dict, b: dict) -> dict:
    return {"version": 1, "control_host": "a",
            "hosts": [{"name": "a", "backend": "max", **HOST, **a}, {"name": "b", "backend": "numpy", **HOST, **b}]}


def test_a_max_host_takes_its_own_activations():
    a, b = parse_fleet_spec(_raw({"max_activations": "float32"}, {}), "0" * 64).hosts
    assert (a.max_activations, b.max_activations) == ("float32", None)


def test_a_numpy_host_with_max_activations_is_refused():
    with pytest.raises(FleetFileError, match=r"hosts\[1\]\.max_activations.*MAX_ACTIVATIONS_BACKEND"):
        parse_fleet_spec(_raw({}, {"max_activations": "int8"}), "0" * 64)


def test_an_unknown_mode_fails_the_schema():
    with pytest.raises(FleetFileError, match="max_activations"):
        parse_fleet_spec(_raw({"max_activations": "fp16"}, {}), "0" * 64)


def _plan(raw: dict):
    spec = parse_fleet_spec(raw, "0" * 64)
    return spec, make_plan(spec, "abcdef", CgroupVersion.V1, (0, 1)).hosts


@pytest.mark.parametrize(("host_key", "flag", "expected"), [
    ({"max_activations": "float32"}, "", "float32"),
    ({"max_activations": "int8"}, "float32", "int8"),  # the file's host wins over the flag
    ({}, "float32", "float32"),
    ({}, "", None),  # neither: the worker's own default
])
def test_the_max_host_worker_env_carries_its_mode(tmp_path, host_key, flag, expected):
    _, (max_host, numpy_host) = _plan(_raw(host_key, {}))
    options = FleetOptions(state_dir=tmp_path, max_activations=flag)
    assert worker_process(options, max_host, 0).env.get("FORNAX_MAX_ACTIVATIONS") == expected
    assert "FORNAX_MAX_ACTIVATIONS" not in worker_process(options, numpy_host, 1).env
    assert "FORNAX_MAX_ACTIVATIONS" not in worker_process(options, max_host, 0, reference=True).env


def test_the_orchestrator_compiles_each_hosts_mode(tmp_path):
    spec, hosts = _plan(_raw({"max_activations": "float32"}, {}))
    entries = {name: SimpleNamespace(grpc=f"{name}:1") for name in ("planner", "evidence_registry", "artifact_builder")}
    env = _orchestrator_env(FleetOptions(state_dir=tmp_path), spec, entries, ["w0:1", "w1:1"], hosts[0])
    assert RouteSettings.from_env(env).worker_max_activations == ("float32", "int8")


def test_a_local_fleet_gives_every_max_worker_the_mode_and_no_reference_worker(tmp_path):
    options = FleetOptions(state_dir=tmp_path, stages=2, backend="max", max_activations="float32",
                           checkpoint=str(tmp_path / "model"))  # with a checkpoint: numpy reference workers too
    spawned = compose._spawn_middle(SimpleNamespace(spawn=lambda spec: spec), options, "r:1", [(0,), (1,)])
    workers = {s.name: s.env.get("FORNAX_MAX_ACTIVATIONS") for s in spawned if s.kind == "stage_worker"}
    assert workers == {"stage_worker_0": "float32", "stage_worker_1": "float32",
                       "stage_worker_0_reference": None, "stage_worker_1_reference": None}
    entries = {name: SimpleNamespace(grpc=f"{name}:1")
               for name in ("planner", "evidence_registry", "artifact_builder", "stage_worker_0", "stage_worker_1")}
    env = compose._orchestrator_env(options, entries)
    assert RouteSettings.from_env(env).worker_max_activations == ("float32", "float32")
    unset = compose._orchestrator_env(FleetOptions(state_dir=tmp_path, backend="max"), entries)
    assert RouteSettings.from_env(unset).worker_max_activations == ()  # the workers' default, int8


def _up_args(tmp_path: Path, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    fleet_cli.register(parser.add_subparsers(dest="command"), None)
    return parser.parse_args(["up", "--state-dir", str(tmp_path / ".fornax"), *argv])


def test_up_takes_the_flag_for_max_stages_only(tmp_path):
    numpy_args = _up_args(tmp_path, ["--max-activations", "float32"])
    assert (fleet_cli._validate_up(numpy_args) or "").startswith("MAX_ACTIVATIONS_BACKEND")
    args = _up_args(tmp_path, ["--backend", "max", "--max-activations", "float32"])
    assert fleet_cli._validate_up(args) is None
    assert fleet_cli._options(args).max_activations == "float32"
    assert fleet_cli._options(_up_args(tmp_path, [])).max_activations == ""
    argv = fleet_cli._up_argv(args)  # the detached keeper starts the same fleet
    assert argv[argv.index("--max-activations") + 1] == "float32"


def test_up_refuses_the_flag_on_a_fleet_file_without_a_max_host(tmp_path, capsys):
    path = tmp_path / "f.yaml"
    raw = _raw({}, {})
    raw["hosts"][0]["backend"] = "numpy"
    path.write_text(yaml.safe_dump(raw))
    code = main(["up", "--fleet", str(path), "--max-activations", "float32", "--state-dir", str(tmp_path / ".f")])
    assert code == 2 and "MAX_ACTIVATIONS_BACKEND" in capsys.readouterr().err


def test_the_compile_wait_counts_the_graphs_of_the_mode_the_max_hosts_run(tmp_path, monkeypatch):
    from apps.fleet.fleet_reference_inputs import _uncompiled_graphs
    from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
    from libs.model.compile_cache import GraphTarget, config_sha256, record_compiled, stage_graphs
    from libs.model.config import load_config
    from libs.model.max_kernels import max_build

    checkpoint = str(write_checkpoint(CheckpointRequest("tiny", tmp_path / "tiny")).out_dir)
    monkeypatch.setenv("FORNAX_COMPILE_CACHE_DIR", str(tmp_path / "cache"))
    cfg = load_config(checkpoint)
    ranges = [(0, 2), (2, cfg.num_hidden_layers)]
    needs = [stage_graphs(cfg, a, b, i == 0, i == 1) for i, (a, b) in enumerate(ranges)]
    for name in {n for stage in needs for n in stage}:  # a cache warm for int8 only
        record_compiled(tmp_path / "cache", GraphTarget(name, max_build(), "cpu", "float32", config_sha256(cfg)), 1.0)
    assert _uncompiled_graphs(checkpoint, ranges, None, ("int8",)) == [0, 0]
    assert _uncompiled_graphs(checkpoint, ranges, None, ("float32",)) == [len(n) for n in needs]
