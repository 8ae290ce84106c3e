"""The shipped two-unlike-hosts fleet: a 1.5-core MAX host and a half-core numpy host in one
route over a 1 Gbit/s fabric. It serves at once: a numpy reference worker inside the MAX host
(its namespace and cgroup) serves alpha's stage while MAX graphs compile, then the route moves
to the MAX worker (`--max-switch always`). With fp32 boundaries, greedy text through the openai
client equals transformers' greedy generate before and after the move; `fornax down` leaves
nothing.

Cold MAX compiles take minutes on a small CPU host, so this is the one netns test that runs
MAX. Its compile cache is a copy of the default one (MAX's compiled objects reused, the default
cache never written) and its checkpoint a `tiny` whose dense MLP width no other test uses: one
graph kind (dense_layer) compiles cold, about a minute, and the others are cache hits.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from apps.fleet.netns import leftovers, read_record
from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from libs.model.presets import PRESETS
from libs.service.fleet_state import read_fleet
from tests.integration.fleet.test_netns_fleet import (  # noqa: F401  (fixtures)
    _capabilities,
    _cgroup_of,
    _greedy_through_openai,
    _pid_namespace,
    reference,
)
from tests.integration.fleet.test_netns_fleet import pytestmark as netns_marks

pytest.importorskip("max")
pytestmark = [*netns_marks, pytest.mark.slow, pytest.mark.timeout(3600)]
FLEET = Path(__file__).resolve().parents[3] / "fleets" / "two-unlike-hosts.yaml"
COLD_PRESET = "tiny-cold-dense"  # tiny with a dense MLP width of its own: its dense_layer graph is unseen
SETTLED = ("serving_requested_backend", "serving_reference_measured_faster", "compile_failed", "switch_failed",
           "install_failed", "measure_failed")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(PRESETS, COLD_PRESET, {**PRESETS["tiny"], "intermediate_size": 96})
        return write_checkpoint(CheckpointRequest(COLD_PRESET, tmp_path_factory.mktemp("cold") / "ckpt")).out_dir


def _cache_copy(path: Path) -> Path:
    from libs.model.max_kernels import default_cache_dir

    source = default_cache_dir(os.environ)
    if source.is_dir():
        shutil.copytree(source, path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _fornax(*args: str, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apps.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **env})


def _board(state) -> dict:
    with urllib.request.urlopen(f"{state.api}/models", timeout=30, context=state.api_ssl_context()) as response:
        return json.load(response)["data"][0]["fornax_backend"]


def _stage_state(address: str, state_dir: Path) -> str:
    from fornax.stage_worker.v1 import stage_worker_pb2 as pb
    from fornax.stage_worker.v1 import stage_worker_pb2_grpc as pb_grpc
    from libs.security.cli_credentials import cli_channel
    from libs.service.channels import open_channel

    with open_channel(address, cli_channel(state_dir, env={})) as channel:
        reply = pb_grpc.StageWorkerServiceStub(channel).GetHealth(pb.GetHealthRequest(), timeout=30)
    return pb.StageState.Name(reply.state).removeprefix("STAGE_STATE_")


def test_the_max_host_serves_at_once_on_numpy_then_moves_to_max_with_transformers_text(
        tmp_path, checkpoint, reference):  # noqa: F811
    env = {"FORNAX_COMPILE_CACHE_DIR": str(_cache_copy(tmp_path / "max-cache"))}
    up = _fornax("up", "--fleet", str(FLEET), "--checkpoint", str(checkpoint), "--max-switch", "always",
                 cwd=tmp_path, env=env, timeout=1800)
    state_dir = tmp_path / ".fornax"
    record = read_record(state_dir)
    try:
        assert up.returncode == 0, up.stderr
        assert "cold start: alpha: serves at once on a numpy reference worker inside the host" in up.stderr
        assert ("backend: running numpy, requested each host's own backend (serving_reference_while_compiling)"
                in up.stderr)
        state = read_fleet(state_dir)
        main, spare = state.entry("stage_worker_0"), state.entry("stage_worker_0_reference")
        assert _pid_namespace(spare.pid) == _pid_namespace(main.pid) and _cgroup_of(spare.pid, "memory") == \
            _cgroup_of(main.pid, "memory") and _cgroup_of(spare.pid, "cpu").endswith("/alpha")
        assert "stage_worker_1_reference" not in {s.name for s in state.services}  # beta runs numpy itself
        served_on_numpy = _greedy_through_openai(state)
        while_serving = _board(state)  # read after the completions returned
        board = while_serving
        deadline = time.monotonic() + 1200
        while board["phase"] not in SETTLED and time.monotonic() < deadline:
            time.sleep(2)
            board = _board(state)
        served_on_max = _greedy_through_openai(state)
        backends = [_capabilities(state.entry(f"stage_worker_{i}").grpc, state_dir).backend_build.split()[0]
                    for i in range(2)]
        states = {name: _stage_state(state.entry(name).grpc, state_dir)
                  for name in ("stage_worker_0", "stage_worker_0_reference", "stage_worker_1")}
    finally:
        down = _fornax("down", cwd=tmp_path, env=env, timeout=120)
    # The completions were served before the MAX graphs finished compiling...
    assert while_serving["phase"] == "serving_reference_while_compiling", while_serving
    assert any(g["state"] != "done" for g in while_serving["graphs"]), while_serving
    assert served_on_numpy == reference
    # ...and afterwards the route runs alpha's MAX worker, with the same text.
    assert (board["phase"], board["choice"]["policy"]) == ("serving_requested_backend", "always"), board
    assert {g["graph"]: g["state"] for g in board["graphs"]}["dense_layer"] == "done"
    assert "final" not in {g["graph"] for g in board["graphs"]}  # beta's stage runs numpy: nothing to compile
    assert served_on_max == reference
    assert backends == ["max", "numpy"]
    assert states == {"stage_worker_0": "READY", "stage_worker_0_reference": "UNLOADED", "stage_worker_1": "READY"}
    assert down.returncode == 0, down.stderr
    assert record is not None and leftovers(record) == []
