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
