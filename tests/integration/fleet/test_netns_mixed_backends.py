"""The shipped two-unlike-hosts fleet: a 1.5-core MAX host and a half-core numpy host in one
route over a 1 Gbit/s fabric. With fp32 boundaries, greedy text through the openai client
equals transformers' greedy generate; `fornax down` leaves nothing.

Cold MAX compiles take many minutes on a small CPU host (the compile cache makes later runs
quick), so this is the one netns test that runs MAX; the others use numpy on every host.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.fleet.netns import leftovers, read_record
from libs.service.fleet_state import read_fleet
from tests.integration.fleet.test_netns_fleet import (  # noqa: F401  (fixtures)
    _capabilities,
    _fornax,
    _greedy_through_openai,
    checkpoint,
    reference,
)
from tests.integration.fleet.test_netns_fleet import pytestmark as netns_marks

pytest.importorskip("max")
pytestmark = [*netns_marks, pytest.mark.slow, pytest.mark.timeout(3600)]
FLEET = Path(__file__).resolve().parents[3] / "fleets" / "two-unlike-hosts.yaml"


def test_a_max_stage_and_a_numpy_stage_serve_transformers_greedy_text(tmp_path, checkpoint, reference):  # noqa: F811
    up = _fornax("up", "--fleet", str(FLEET), "--checkpoint", str(checkpoint), cwd=tmp_path, timeout=3400)
    record = read_record(tmp_path / ".fornax")
    try:
        assert up.returncode == 0, up.stderr
        state = read_fleet(tmp_path / ".fornax")
        backends = [_capabilities(state.entry(f"stage_worker_{i}").grpc, tmp_path / ".fornax").backend_build.split()[0]
                    for i in range(2)]
        assert backends == ["max", "numpy"]
        assert _greedy_through_openai(state) == reference
    finally:
        down = _fornax("down", cwd=tmp_path, timeout=120)
    assert down.returncode == 0, down.stderr
    assert record is not None and leftovers(record) == []
