"""`fornax up --checkpoint`: the launcher installs a route and serves it over HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest

from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from libs.service.fleet_state import read_fleet

pytestmark = pytest.mark.integration


def _fornax(*args: str, cwd, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apps.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def test_up_with_a_checkpoint_serves_completions_until_down(tmp_path):
    checkpoint = write_checkpoint(CheckpointRequest("tiny", tmp_path / "model", seed=5)).out_dir
    up = _fornax("up", "--checkpoint", str(checkpoint), "--stages", "2", "--backend", "numpy", cwd=tmp_path)
    try:
        assert up.returncode == 0, up.stderr
        assert "warming the route" in up.stderr and "curl -N" in up.stdout
        state = read_fleet(tmp_path / ".fornax")
        assert state.api and state.api.startswith("http://127.0.0.1:")
        body = json.dumps({"model": "fornax", "prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0}).encode()
        request = urllib.request.Request(f"{state.api}/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            reply = json.load(response)
        assert reply["usage"]["prompt_tokens"] == 3
        assert 1 <= reply["usage"]["completion_tokens"] <= 4
        with urllib.request.urlopen(f"{state.api}/models", timeout=30) as response:
            board = json.load(response)["data"][0]["fornax_backend"]
        assert (board["running_backend"], board["phase"]) == ("numpy", "serving_requested_backend")
        status = _fornax("status", cwd=tmp_path, timeout=60)
        assert "backend: running numpy, requested numpy" in status.stdout, status.stdout
        assert "reference" not in status.stdout  # numpy fleets need no reference workers
    finally:
        down = _fornax("down", cwd=tmp_path, timeout=120)
    assert down.returncode == 0, down.stderr


def test_up_refuses_a_directory_without_a_config(tmp_path):
    up = _fornax("up", "--checkpoint", str(tmp_path), cwd=tmp_path, timeout=60)
    assert up.returncode == 2
    assert "config.json" in up.stderr
