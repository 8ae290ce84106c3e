"""Builds the planner image with buildah and runs it with podman; grpcurl sees it serving.

Opt-in with FORNAX_IMAGE_TESTS=1 (needs root, buildah, podman, debootstrap; `runc` where crun
cannot run containers on the host's cgroup layout). Outside that it is skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[3]
ENABLED = os.environ.get("FORNAX_IMAGE_TESTS") == "1"
BUILD_TIMEOUT_S = 900
READY_TIMEOUT_S = 60
USER_ID = 10001

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(not ENABLED, reason="image tests run with FORNAX_IMAGE_TESTS=1"),
]


def _version() -> str:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]


def _tool(name: str) -> str:
    path = shutil.which(name) or (str(Path(sys.executable).parent / name) if name == "grpcurl" else None)
    if not path or not Path(path).exists():
        pytest.fail(f"{name} is required when FORNAX_IMAGE_TESTS=1")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _runtime_args() -> list[str]:
    # crun refuses hosts with a hybrid cgroup v1/v2 layout; runc copes with it.
    runtime = os.environ.get("FORNAX_PODMAN_RUNTIME") or ("runc" if shutil.which("runc") else "")
    # Container rlimits above the caller's are refused without CAP_SYS_RESOURCE; stay below.
    args = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]
    return (["--runtime", runtime] if runtime else []) + args


@pytest.fixture(scope="module")
def planner_image() -> str:
    for tool in ("buildah", "podman", "debootstrap", "unshare"):
        _tool(tool)
    env = dict(os.environ, PY=sys.executable)
    done = subprocess.run(["bash", "scripts/images/build.sh", "planner"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return f"localhost/fornax-planner:{_version()}"


@pytest.fixture
def planner_container(planner_image):
    podman = _tool("podman")
    grpc_port, metrics_port = _free_port(), _free_port()
    cmd = [podman, "run", "--detach", *_runtime_args(), "--network", "host", "--read-only",
           "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
           "-e", f"FORNAX_GRPC_PORT={grpc_port}", "-e", f"FORNAX_METRICS_PORT={metrics_port}",
           "-e", "FORNAX_HOST=127.0.0.1",
           # TLS is on by default and needs mounted certificates; this smoke test checks the
           # image itself, so it opts into plaintext explicitly (the service warns about it).
           "-e", "FORNAX_INSECURE=1", planner_image]
    started = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert started.returncode == 0, started.stderr
    container_id = started.stdout.strip()
    try:
        yield container_id, grpc_port
    finally:
        subprocess.run([podman, "rm", "--force", "--time", "10", container_id], capture_output=True,
                       timeout=60, check=False)


def _wait_serving(port: int) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=READY_TIMEOUT_S, wait_for_ready=True)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def _grpcurl(port: int, *args: str) -> str:
    done = subprocess.run([_tool("grpcurl"), "-plaintext", "-max-time", "10", f"127.0.0.1:{port}", *args],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_planner_image_serves_health_and_reflection(planner_container):
    container_id, port = planner_container
    _wait_serving(port)
    health = json.loads(_grpcurl(port, "grpc.health.v1.Health/Check"))
    assert health == {"status": "SERVING"}
    services = set(_grpcurl(port, "list").split())
    assert {"fornax.planner.v1.PlannerService", "grpc.health.v1.Health"} <= services
    logs = subprocess.run([_tool("podman"), "logs", container_id], capture_output=True, text=True,
                          timeout=30, check=False)
    assert '"insecure_plaintext"' in logs.stdout + logs.stderr  # plaintext is never silent


def test_planner_image_runs_as_the_service_user_and_stops_cleanly(planner_container):
    podman = _tool("podman")
    container_id, port = planner_container
    _wait_serving(port)
    top = subprocess.run([podman, "top", container_id, "huser"], capture_output=True, text=True,
                         timeout=30, check=False)
    assert top.returncode == 0, top.stderr
    assert {line.strip() for line in top.stdout.splitlines()[1:]} == {str(USER_ID)}
    stopped = subprocess.run([podman, "stop", "--time", "20", container_id], capture_output=True,
                             text=True, timeout=60, check=False)
    assert stopped.returncode == 0, stopped.stderr
    state = subprocess.run([podman, "inspect", "--format", "{{.State.ExitCode}}", container_id],
                           capture_output=True, text=True, timeout=30, check=False)
    # SIGTERM drains and exits 0; a kill after the grace period would show 137.
    assert state.stdout.strip() == "0"
