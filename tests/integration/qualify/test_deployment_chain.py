"""The deployment chain on one state directory: `fornax profile`, then `fornax up --mode
deployment` refused for want of a calibration, then `fornax qualify` whose calibration fails
(an explicit tolerance of 0) and a deployment refused for it, then `fornax qualify` with an
explicitly wide tolerance, recorded in the calibration, and a deployment that installs the
profile-based plan and serves.

The wide tolerance is given on the command line because a shared CI box's load moves the
measured bottleneck far from a profile taken minutes earlier; the gate's bound itself is checked
by the first qualification. Needs root and namespaces (CI is root); skipped elsewhere.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from libs.profiles.schema import GATE, SERVING_WINDOW, Calibration, calibration_from_json
from libs.service.fleet_state import read_fleet
from services.evidence_registry.blobs import DiskBlobStore
from services.evidence_registry.domain import EvidenceClass, ListQuery, RecordType
from services.evidence_registry.sqlite_store import SqliteRecordStore
from tests.integration.orchestrator.harness import tiny_checkpoint

pytestmark = [
    pytest.mark.integration, pytest.mark.timeout(900),
    pytest.mark.skipif(os.geteuid() != 0 or not Path("/proc/self/ns/time").exists(),
                       reason="netns fleets with skewed clocks need root, network and time namespaces"),
]
FLEET = Path(__file__).with_name("two-numpy-hosts.yaml")
REPO = Path(__file__).resolve().parents[3]


def _fornax(tmp_path: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "libs" / "api")])}
    return subprocess.run([sys.executable, "-m", "apps.cli.main", *args, "--state-dir", str(tmp_path / ".fornax")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout, env=env)


def _calibrations(state_dir: Path) -> list[Calibration]:
    registry = state_dir / "hosts" / "alpha" / "evidence_registry"
    store = SqliteRecordStore(registry / "registry.db")
    try:
        records = store.list(ListQuery(evidence_class=EvidenceClass.PHYSICAL)).records
    finally:
        store.close()
    blobs = DiskBlobStore(registry / "blobs")
    return [calibration_from_json(blobs.read(r.blob.sha256_hex)) for r in records
            if r.content.type is RecordType.CALIBRATION]


def _complete(state) -> str:
    async def main() -> str:
        client = openai.AsyncOpenAI(base_url=state.api, api_key="none", max_retries=0, timeout=120,
                                    http_client=openai.DefaultAsyncHttpxClient(verify=state.api_ssl_context()))
        reply = await client.completions.create(model="fornax", prompt=[5, 17, 42], max_tokens=4, temperature=0)
        return reply.choices[0].text

    return asyncio.run(main())


def test_deployment_needs_profiles_and_a_passing_calibration_of_the_same_route(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path / "tiny")
    common = ("--fleet", str(FLEET), "--checkpoint", str(checkpoint))
    profile = _fornax(tmp_path, "profile", *common, "--runs", "2", "--prefill-lengths", "16,128",
                      "--decode-batches", "1,8", "--min-run-ms", "100", "--window-runs", "1")
    assert profile.returncode == 0, profile.stderr[-4000:]
    # The profile ended with a serving window on its own plan: stored, fed back, never a gate.
    assert "PHYSICAL serving window on route" in profile.stdout, profile.stdout[-4000:]
    [window] = _calibrations(tmp_path / ".fornax")
    assert window.purpose == SERVING_WINDOW and not window.failures and window.stages
    assert all(s.measured_terms["compute"].median > 0 for s in window.stages)

    refused = _fornax(tmp_path, "up", *common, "--mode", "deployment")
    assert refused.returncode != 0
    assert "MISSING_CALIBRATION" in refused.stderr and "alpha:numpy" in refused.stderr, refused.stderr[-4000:]
    assert read_fleet(tmp_path / ".fornax") is None

    failing = _fornax(tmp_path, "qualify", *common, "--runs", "1", "--tolerance", "0", "--out", "strict")
    assert failing.returncode == 1, failing.stdout + failing.stderr[-4000:]
    assert "qualification gate FAILED" in failing.stdout and "(tolerance 0%)" in failing.stdout
    refused = _fornax(tmp_path, "up", *common, "--mode", "deployment")
    assert refused.returncode != 0 and "CALIBRATION_FAILED" in refused.stderr, refused.stderr[-4000:]

    passing = _fornax(tmp_path, "qualify", *common, "--runs", "1", "--tolerance", "10", "--out", "wide")
    assert passing.returncode == 0, passing.stdout + passing.stderr[-4000:]
    assert "qualification gate PASSED" in passing.stdout and "(tolerance 1000%)" in passing.stdout
    calibrations = sorted((c for c in _calibrations(tmp_path / ".fornax") if c.purpose == GATE),
                          key=lambda c: c.measured_unix_ns)
    assert [(c.passed, c.tolerance) for c in calibrations] == [(False, 0.0), (True, 10.0)]
    assert len({c.route_key for c in calibrations}) == 1 and calibrations[1].evidence_ids
    # ... and the gate's plan rested on the window: it names the window's record among its evidence.
    assert any(r.startswith("calibration-") for r in calibrations[1].evidence_ids)
    # The plan came from profiles: its predictions were evaluated at the rows each stage measured.
    assert all(c.rows_basis == "measured rows" and all(s.rows >= 1 for s in c.stages) for c in calibrations)

    up = _fornax(tmp_path, "up", *common, "--mode", "deployment")
    try:
        assert up.returncode == 0, up.stderr[-4000:]
        state = read_fleet(tmp_path / ".fornax")
        assert state is not None and _complete(state)
    finally:
        down = _fornax(tmp_path, "down")
    assert down.returncode == 0, down.stderr[-2000:]
