"""`fornax up --mode deployment` before any profile or qualification: refused, naming what is missing."""

from __future__ import annotations

import pytest

from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from libs.service.fleet_state import fleet_path
from tests.integration.fleet.test_fleet_serving import _fornax

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_up_in_deployment_mode_without_profiles_fails_closed_and_names_them(tmp_path):
    checkpoint = write_checkpoint(CheckpointRequest("tiny", tmp_path / "model", seed=5)).out_dir
    up = _fornax("up", "--checkpoint", str(checkpoint), "--stages", "2", "--backend", "numpy", "--mode",
                 "deployment", cwd=tmp_path, timeout=300)
    try:
        assert up.returncode == 2, up.stderr
        assert "the route did not come up: MISSING_PROFILE" in up.stderr
        assert "host stage_worker_0" in up.stderr and "host stage_worker_1" in up.stderr
        assert "MISSING_CALIBRATION route sha256:" in up.stderr
        assert "`fornax qualify`" in up.stderr
        assert not fleet_path(tmp_path / ".fornax").exists()  # nothing left serving
    finally:
        _fornax("down", cwd=tmp_path, timeout=120)


def test_replan_on_a_running_fleet_compares_with_the_installed_route(tmp_path):
    checkpoint = write_checkpoint(CheckpointRequest("tiny", tmp_path / "model", seed=5)).out_dir
    up = _fornax("up", "--checkpoint", str(checkpoint), "--stages", "2", "--backend", "numpy", cwd=tmp_path,
                 timeout=300)
    try:
        assert up.returncode == 0, up.stderr
        replan = _fornax("plan", "--checkpoint", str(checkpoint), "--replan", "--boundary-dtype", "bf16",
                         cwd=tmp_path, timeout=120)
        assert replan.returncode == 0, replan.stderr
        out = replan.stdout
        # No profile in the registry yet: every term is a declared figure, and says so.
        assert "declared, exploratory" in out and "physical (" not in out
        assert "stage 0 on stage_worker_0@stage_worker_0" in out
        assert out.count("  compute ") == 2 and "(prediction)" in out
        assert "replan: " in out
        refused = _fornax("plan", "--checkpoint", str(checkpoint), "--explain", "--mode", "deployment",
                          cwd=tmp_path, timeout=120)
        assert refused.returncode == 2 and "error MISSING_PROFILE" in refused.stderr
    finally:
        _fornax("down", cwd=tmp_path, timeout=120)
