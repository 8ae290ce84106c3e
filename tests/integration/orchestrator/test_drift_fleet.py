"""Drift on a real fleet: a stage slowed by a CPU-quota cut leaves its plan's prediction bound and
the route turns "uncalibrated" in GetPlanStatus, the Prometheus gauge and `fornax status`.

The fleet is the local one (planner, artifact builder, two numpy stage-worker processes, the
orchestrator) on the tiny checkpoint. The exploratory plan's predictions come from declared
figures, far from what this host measures, so the bound here is set wide enough to hold the
unslowed stage (the test checks that it does), and the quota cut takes the slowed one past it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import openai
import pytest

from apps.fleet.compose import start_fleet
from apps.fleet.launcher import FleetOptions
from fornax.orchestrator.v1 import orchestrator_pb2 as pb
from fornax.orchestrator.v1 import orchestrator_pb2_grpc as pb_grpc
from libs.security.cli_credentials import cli_channel
from libs.service.channels import open_channel
from libs.service.fleet_state import write_fleet
from tests.integration.orchestrator.harness import tiny_checkpoint
from tests.integration.orchestrator.test_fleet_serving import wait_route_ready

CGROUP_ROOT = Path("/sys/fs/cgroup")
V2 = (CGROUP_ROOT / "cgroup.controllers").exists()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or not (V2 or (CGROUP_ROOT / "cpu" / "cgroup.procs").exists()),
                       reason="slowing a stage takes a cgroup CPU quota (root)"),
]
# The exploratory plan predicts about 1 ms per tiny decode microbatch; this host measures a few
# ms unslowed and tens to hundreds under the quota cut. A bound of 20x holds the first, not the second.
BOUND = 20.0
SLOWED_CORES = 0.02


class CpuQuota:
    """A cgroup (v2, or v1's cpu controller) with a CPU quota, for one process at a time."""

    def __init__(self, name: str) -> None:
        self.root = CGROUP_ROOT if V2 else CGROUP_ROOT / "cpu"
        self.path = self.root / name
        self.path.mkdir()

    def limit(self, cores: float) -> None:
        period = 50_000  # short periods: a throttled worker still answers its health probes in time
        if V2:
            (self.path / "cpu.max").write_text(f"{int(cores * period)} {period}")
        else:
            (self.path / "cpu.cfs_period_us").write_text(str(period))
            (self.path / "cpu.cfs_quota_us").write_text(str(int(cores * period)))

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        for pid in (self.path / "cgroup.procs").read_text().split():
            try:
                (self.root / "cgroup.procs").write_text(pid)
            except OSError:
                pass  # already gone
        self.path.rmdir()


def _plan_status(state_dir: Path, address: str) -> pb.PlanStatus:
    with open_channel(address, cli_channel(state_dir, env={})) as channel:
        return pb_grpc.OrchestratorServiceStub(channel).GetPlanStatus(pb.GetPlanStatusRequest(), timeout=10).current


class _Load:
    """Greedy requests streamed back to back from a thread until stopped: decode microbatches."""

    def __init__(self, api: str) -> None:
        self._client = openai.OpenAI(base_url=api, api_key="none", max_retries=0, timeout=120)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(2)]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._client.completions.create(model="fornax", prompt=[5, 17, 42], max_tokens=24, temperature=0)
            except openai.APIError:
                time.sleep(0.2)  # the test asserts on the route's state, not on each request

    def __enter__(self) -> _Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)


def _wait_for(state_dir: Path, address: str, wanted, timeout_s: float = 90.0) -> pb.PlanStatus:
    deadline = time.monotonic() + timeout_s
    while True:
        status = _plan_status(state_dir, address)
        if wanted(status.calibration):
            return status
        assert time.monotonic() < deadline, f"calibration never reached the wanted state: {status.calibration}"
        time.sleep(0.5)


def _gauges(metrics_address: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(("fornax_orchestrator_route_uncalibrated", "fornax_orchestrator_stage_uncalibrated"))}


def _fornax_status(state_dir: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "apps.cli.main", "status", "--state-dir", str(state_dir)],
                          capture_output=True, text=True, timeout=120)
    return done.stdout


def test_a_stage_slowed_past_the_bound_turns_the_route_uncalibrated(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path / "tiny")
    state_dir = tmp_path / ".fornax"
    options = FleetOptions(state_dir=state_dir, stages=2, backend="numpy", boundary_dtype="fp32",
                           checkpoint=str(checkpoint), startup_timeout_s=180,
                           env={"FORNAX_DRIFT_RELATIVE_BOUND": str(BOUND), "FORNAX_DRIFT_SUSTAIN_ROUNDS": "3"})
    state, launcher = start_fleet(options)
    write_fleet(state_dir, state)
    orchestrator, slowed = state.entry("orchestrator"), state.entry("stage_worker_1")
    quota = CpuQuota(f"fornax-drift-test-{os.getpid()}")
    try:
        wait_route_ready(state.api)
        with _Load(state.api):
            calm = _wait_for(state_dir, orchestrator.grpc, lambda c: c.state == pb.CALIBRATION_STATE_CALIBRATED)
            assert calm.calibration.relative_bound == BOUND
            assert _gauges(orchestrator.metrics)["fornax_orchestrator_route_uncalibrated"] == 0
            assert "calibration: CALIBRATED" in _fornax_status(state_dir)

            quota.limit(SLOWED_CORES)
            quota.add(slowed.pid)
            status = _wait_for(state_dir, orchestrator.grpc,
                               lambda c: c.state == pb.CALIBRATION_STATE_UNCALIBRATED)
            stage = status.calibration.stages[1]
            assert stage.state == pb.CALIBRATION_STATE_UNCALIBRATED
            assert stage.measured_decode_service_s > stage.predicted_decode_service_s * (1 + BOUND)
            assert status.state == pb.ROUTE_STATE_SERVING  # slow, not down
            reason = status.calibration.reason
            assert reason.startswith("uncalibrated (stage 1: plan predicted ") and "stage 0" not in reason
            assert "exploratory plan: predictions from declared figures" in reason
            gauges = _gauges(orchestrator.metrics)
            assert gauges["fornax_orchestrator_route_uncalibrated"] == 1
            assert gauges['fornax_orchestrator_stage_uncalibrated{stage="1"}'] == 1
            assert gauges['fornax_orchestrator_stage_uncalibrated{stage="0"}'] == 0
            assert "calibration: UNCALIBRATED: uncalibrated (stage 1: plan predicted" in _fornax_status(state_dir)

            quota.limit(4.0)  # the quota lifted: back inside the bound, after the recovery rounds
            _wait_for(state_dir, orchestrator.grpc, lambda c: c.state == pb.CALIBRATION_STATE_CALIBRATED)
    finally:
        launcher.stop_all()
        quota.remove()
