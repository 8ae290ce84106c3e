"""The background compile process: idle priority, pinned, leaves a cache marker, and says
why when it fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from libs.model.compile_cache import GraphName, GraphTarget, config_sha256, is_cached
from libs.model.config import load_config


def _job(*args: str) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "libs.model.compile_job", *args],
                          capture_output=True, text=True, timeout=1200)
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


def test_a_bad_checkpoint_fails_with_a_reason(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    code, result = _job("--checkpoint", str(tmp_path), "--graph", "embed", "--cache-dir", str(tmp_path / "c"),
                        "--priority", "idle")
    assert code == 1 and result["state"] == "failed"
    assert "ConfigError" in result["error"] and "not valid JSON" in result["error"]
    assert result["policy"] == "SCHED_IDLE"


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_compiles_one_graph_at_idle_priority_and_marks_it(tmp_path):
    pytest.importorskip("max")
    from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
    from libs.model.max_kernels import default_cache_dir, max_build

    checkpoint = write_checkpoint(CheckpointRequest("tiny", tmp_path / "tiny")).out_dir
    cache_dir = default_cache_dir(os.environ)  # shared with the suite: a warm cache makes this a hit
    cpu = min(os.sched_getaffinity(0))
    code, result = _job("--checkpoint", str(checkpoint), "--graph", "embed", "--cache-dir", str(cache_dir),
                        "--cpus", str(cpu))
    assert code == 0, result
    assert result["state"] == "done" and result["seconds"] > 0
    assert result["policy"] == "nice 19" and result["cpus"] == [cpu]
    target = GraphTarget(GraphName.EMBED, max_build(), "cpu", "float32", config_sha256(load_config(checkpoint)))
    assert result["key"] == target.key and is_cached(cache_dir, target)
