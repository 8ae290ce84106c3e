"""stageWorker.maxActivations: FORNAX_MAX_ACTIVATIONS of the max pools' stage workers (int8 by
default, a pool may set its own); a numpy pool gets none and may not set float32."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.unit.helm.conftest import run_helm_template
from tests.unit.helm.test_chart_render import FULL, env_values
from tests.unit.helm.tools import CHART_DIR

POOLS = CHART_DIR / "examples" / "gpu-and-cpu-pools.yaml"


def _workers(helm: str, files: list[Path], extra: list[str] | None = None) -> dict[str, dict[str, str]]:
    """StatefulSet name -> its stage-worker container's environment."""
    run = run_helm_template(helm, files, extra)
    assert run.returncode == 0, run.stderr
    sets = [d for d in yaml.safe_load_all(run.stdout) if d and d["kind"] == "StatefulSet"]
    return {s["metadata"]["name"]: env_values(s["spec"]["template"]["spec"]["containers"][0]) for s in sets}


def _pools(tmp_path: Path, gpu: dict, cpu: dict) -> Path:
    values = yaml.safe_load(POOLS.read_text())
    first, second = values["stageWorker"]["pools"]
    first.update(gpu)
    second.update(cpu)
    path = tmp_path / "pools.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def test_a_max_pool_runs_int8_by_default_and_a_numpy_pool_has_no_mode(helm):
    workers = _workers(helm, [POOLS])
    assert workers[f"{FULL}-stage-worker-gpu"]["FORNAX_MAX_ACTIVATIONS"] == "int8"
    assert "FORNAX_MAX_ACTIVATIONS" not in workers[f"{FULL}-stage-worker-cpu"]
    default = _workers(helm, [])  # one numpy pool
    assert "FORNAX_MAX_ACTIVATIONS" not in default[f"{FULL}-stage-worker"]


def test_the_value_and_a_pools_own_reach_the_max_workers(helm, tmp_path):
    single = _workers(helm, [], ["--set", "stageWorker.backend=max", "--set", "stageWorker.maxActivations=float32"])
    assert single[f"{FULL}-stage-worker"]["FORNAX_MAX_ACTIVATIONS"] == "float32"
    # Every pool inherits the chart-wide value; a numpy pool leaves it out rather than refusing it.
    inherited = _workers(helm, [POOLS], ["--set", "stageWorker.maxActivations=float32"])
    assert inherited[f"{FULL}-stage-worker-gpu"]["FORNAX_MAX_ACTIVATIONS"] == "float32"
    assert "FORNAX_MAX_ACTIVATIONS" not in inherited[f"{FULL}-stage-worker-cpu"]
    own = _workers(helm, [_pools(tmp_path, {"maxActivations": "float32"}, {})])
    assert own[f"{FULL}-stage-worker-gpu"]["FORNAX_MAX_ACTIVATIONS"] == "float32"


def test_float32_on_a_numpy_pool_and_an_unknown_mode_are_refused(helm, tmp_path):
    numpy_pool = run_helm_template(helm, [_pools(tmp_path, {}, {"maxActivations": "float32"})])
    assert numpy_pool.returncode != 0 and "MAX_ACTIVATIONS_BACKEND" in numpy_pool.stderr
    assert 'pool "cpu"' in numpy_pool.stderr
    numpy_chart = run_helm_template(helm, [], ["--set", "stageWorker.maxActivations=float32"])
    assert numpy_chart.returncode != 0 and "MAX_ACTIVATIONS_BACKEND" in numpy_chart.stderr
    unknown = run_helm_template(helm, [], ["--set", "stageWorker.backend=max",
                                           "--set", "stageWorker.maxActivations=fp16"])
    assert unknown.returncode != 0 and "stageWorker.maxActivations" in unknown.stderr
    bad_pool = run_helm_template(helm, [_pools(tmp_path, {"maxActivations": "int4"}, {})])
    assert bad_pool.returncode != 0 and "maxActivations" in bad_pool.stderr
