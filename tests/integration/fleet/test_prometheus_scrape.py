"""Debian's real Prometheus scrapes a local fleet, and a rate comes back through its HTTP API."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from fornax.stage_worker.v1 import stage_worker_pb2, stage_worker_pb2_grpc
from libs.service.fleet_state import read_fleet
from tests.support.fleet_tls import operator_channel

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _query(base: str, promql: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]["result"]


def _wait_for(base: str, promql: str, accept, timeout_s: float = 60.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    result: list[dict] = []
    while time.monotonic() < deadline:
        try:
            result = _query(base, promql)
        except OSError:
            result = []
        if accept(result):
            return result
        time.sleep(0.5)
    raise AssertionError(f"{promql} never satisfied the check; last result {result}")


@pytest.fixture
def fleet(tmp_path):
    up = subprocess.run([sys.executable, "-m", "apps.cli.main", "up", "--stages", "1"], cwd=tmp_path,
                        capture_output=True, text=True, timeout=240)
    assert up.returncode == 0, up.stderr
    yield read_fleet(tmp_path / ".fornax")
    subprocess.run([sys.executable, "-m", "apps.cli.main", "down"], cwd=tmp_path, capture_output=True, timeout=120)


def test_prometheus_scrapes_every_service_and_computes_a_rate(fleet, tmp_path):
    binary = shutil.which("prometheus")
    assert binary, "Debian's prometheus package is required (`make test` installs it through scripts/system_deps.sh)"
    port = _free_port()
    config = tmp_path / "prometheus.yml"
    targets = [s.metrics for s in fleet.services]
    config.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "fornax", "static_configs": [{"targets": targets}]}],
    }))
    prom = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb"),
    )
    base = f"http://127.0.0.1:{port}"
    try:
        up = _wait_for(base, "up", lambda r: len(r) == len(targets) and all(x["value"][1] == "1" for x in r))
        assert {x["metric"]["instance"] for x in up} == set(targets)
        worker = fleet.entry("stage_worker_0").grpc
        with operator_channel(tmp_path / ".fornax", worker) as channel:
            stub = stage_worker_pb2_grpc.StageWorkerServiceStub(channel)
            for _ in range(40):
                stub.GetHealth(stage_worker_pb2.GetHealthRequest(), timeout=5)
                time.sleep(0.1)
        promql = 'sum(rate(fornax_grpc_server_handling_seconds_count{method="GetHealth"}[30s]))'
        rate = _wait_for(base, promql, lambda r: bool(r) and float(r[0]["value"][1]) > 0)
        assert float(rate[0]["value"][1]) > 0
    finally:
        prom.terminate()
        prom.wait(timeout=30)
    assert "error" not in Path(tmp_path / "prometheus.log").read_text().lower().split("level=")[-1][:10]
