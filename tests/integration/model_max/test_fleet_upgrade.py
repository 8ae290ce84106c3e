"""`fornax up --backend max` with graphs missing from the cache: real processes serve on the
numpy reference workers at once, compile in the background, and move the route to the MAX
workers under a trickle of requests, losing none and changing no token (`--max-switch always`).
By default the move happens only when each stage's worker measured MAX's decode step at least as
fast as numpy's on its host; the choice and both figures show in /v1/models and `fornax status`.

The tiny config's cache markers are removed first; MAX's own cache (the default dir, shared
with the rest of the suite) stays, so each background compile is a cache hit when warm.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

pytest.importorskip("max")

from apps.bench.coldstart import Trickle  # noqa: E402
from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint  # noqa: E402
from libs.model.compile_cache import GraphName, GraphTarget, config_sha256, marker_path  # noqa: E402
from libs.model.config import load_config  # noqa: E402
from libs.model.max_kernels import default_cache_dir, max_build  # noqa: E402
from libs.service.fleet_state import read_fleet  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(2400)]
SETTLED = ("serving_requested_backend", "serving_reference_measured_faster", "compile_failed", "switch_failed",
           "install_failed", "measure_failed")


def _fornax(*args: str, cwd, timeout: float = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apps.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, check=False)


def _listing(api: str) -> dict:
    with urllib.request.urlopen(f"{api}/models", timeout=30) as response:
        return json.load(response)["data"][0]


def _board(api: str) -> dict:
    return _listing(api)["fornax_backend"]


def _cold_up(tmp_path, *extra: str):
    checkpoint = write_checkpoint(CheckpointRequest("tiny", tmp_path / "model", seed=3)).out_dir
    config_hash = config_sha256(load_config(checkpoint))
    for name in GraphName:
        marker_path(default_cache_dir(os.environ),
                    GraphTarget(name, max_build(), "cpu", "float32", config_hash)).unlink(missing_ok=True)
    # Plaintext on purpose: the test reads each worker's stage state over gRPC itself.
    return _fornax("up", "--checkpoint", str(checkpoint), "--stages", "2", "--backend", "max",
                   "--boundary-dtype", "fp32", "--insecure", *extra, cwd=tmp_path)


def test_up_serves_on_numpy_then_switches_to_max_losing_nothing(tmp_path):
    up = _cold_up(tmp_path, "--max-switch", "always")
    try:
        assert up.returncode == 0, up.stderr
        assert "backend: running numpy, requested max" in up.stderr
        api = read_fleet(tmp_path / ".fornax").api
        trickle = Trickle(api.removesuffix("/v1"), max_tokens=6)
        sender = threading.Thread(target=trickle.run, args=(time.monotonic(), 0.5), daemon=True)
        sender.start()
        board = _board(api)
        while board["phase"] not in SETTLED:
            time.sleep(1)
            board = _board(api)
        time.sleep(2)  # a few requests on the MAX route too
        trickle.stop.set()
        sender.join()
        status = _fornax("status", cwd=tmp_path, timeout=60)
        states = _stage_states(read_fleet(tmp_path / ".fornax"))
    finally:
        down = _fornax("down", cwd=tmp_path, timeout=120)
    assert (board["phase"], board["running_backend"]) == ("serving_requested_backend", "max"), board
    assert board["choice"]["policy"] == "always" and "without measuring" in board["choice"]["reason"]
    assert all(g["state"] == "done" and g["compile_seconds"] > 0 for g in board["graphs"]), board
    assert "backend: running max, requested max" in status.stdout
    outcomes = trickle.outcomes
    assert len(outcomes) >= 4 and all(ok for *_, ok in outcomes), outcomes
    assert len({text for _, _, text, _ in outcomes}) == 1, outcomes  # greedy, fp32: same tokens
    assert states == {"stage_worker_0": "READY", "stage_worker_1": "READY",
                      "stage_worker_0_reference": "UNLOADED", "stage_worker_1_reference": "UNLOADED"}
    assert down.returncode == 0, down.stderr


def _stage_states(state) -> dict[str, str]:
    """Each stage worker's stage state: the reference workers gave theirs back after the switch."""
    from fornax.stage_worker.v1 import stage_worker_pb2 as pb
    from fornax.stage_worker.v1 import stage_worker_pb2_grpc as pb_grpc
    from libs.service.channels import open_channel

    states = {}
    for service in state.services:
        if service.kind == "stage_worker":
            with open_channel(service.grpc) as channel:
                reply = pb_grpc.StageWorkerServiceStub(channel).GetHealth(pb.GetHealthRequest(), timeout=30)
            states[service.name] = pb.StageState.Name(reply.state).removeprefix("STAGE_STATE_")
    return states


def test_up_switches_to_max_only_where_measured_faster_and_says_so(tmp_path):
    up = _cold_up(tmp_path)
    try:
        assert up.returncode == 0, up.stderr
        api = read_fleet(tmp_path / ".fornax").api
        board = _board(api)
        while board["phase"] not in SETTLED:
            time.sleep(1)
            board = _board(api)
        listing = _listing(api)
        status = _fornax("status", cwd=tmp_path, timeout=60)
        states = _stage_states(read_fleet(tmp_path / ".fornax"))
    finally:
        down = _fornax("down", cwd=tmp_path, timeout=120)
    choice = board["choice"]
    assert choice is not None and choice["policy"] == "measured" and choice["candidate"] == "max", board
    assert choice["rows"] == [1, 8] and [s["index"] for s in choice["stages"]] == [0, 1]
    medians = [(f["max_ms_per_step"], f["numpy_ms_per_step"]) for s in choice["stages"] for f in s["figures"]]
    assert len(medians) == 4 and all(m > 0 and n > 0 for m, n in medians)
    for s in choice["stages"]:  # measured on the stage's own host, by its worker, both builds named
        assert s["evidence_class"] == "physical" and s["measured_on"]["cpu_model"]
        assert s["measured_on"]["command"] == "StageWorkerService/CompareDecodeStep"
        assert set(s["measured_on"]["builds"]) == {"numpy", "max"}
        assert all(f["runs"] == {"numpy": 5, "max": 5} for f in s["figures"])
    # the rule, applied to the figures the board shows
    max_wins = all(m <= n for m, n in medians)
    expected = ("serving_requested_backend", "max") if max_wins else ("serving_reference_measured_faster", "numpy")
    assert (board["phase"], board["running_backend"], choice["backend"]) == (*expected, expected[1]), choice
    execution = listing["fornax"]["execution"]
    assert execution["backend"] == expected[1]
    assert execution["backend_choice"] == {"backend": expected[1], "policy": "measured", "reason": choice["reason"]}
    assert f"backend: running {expected[1]}, requested max ({expected[0]})" in status.stdout
    assert f"backend choice (measured): {choice['reason']}" in status.stdout
    assert "stage 1 layers" in status.stdout and "(physical: median of runs on" in status.stdout
    serving = "stage_worker_{}" if max_wins else "stage_worker_{}_reference"
    assert all(states[serving.format(i)] == "READY" for i in range(2)), states
    assert down.returncode == 0, down.stderr
