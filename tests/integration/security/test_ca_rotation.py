"""Rotating the fleet CA under a live stage-worker process: `fornax certs rotate-ca`, reissue,
reload, `fornax certs retire-ca`; no restart, and the old CA's certificates stop working only
when it is retired."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import grpc

from fornax.stage_worker.v1 import stage_worker_pb2 as pb
from fornax.stage_worker.v1 import stage_worker_pb2_grpc as pb_grpc
from libs.security.audit import read_entries
from libs.security.identity import stage_identity
from libs.service.channels import ClientCredentials
from tests.integration.security.pki import OPERATOR, FleetPki, now
from tests.support.procs import ServiceProc


def _fornax(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "apps.cli.main", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ})
    assert done.returncode == 0, done.stderr
    return done.stdout


def _health(address: str, credentials: ClientCredentials) -> str:
    with grpc.secure_channel(address, credentials.channel_credentials()) as channel:
        try:
            pb_grpc.StageWorkerServiceStub(channel).GetHealth(pb.GetHealthRequest(), timeout=10)
        except grpc.RpcError as exc:
            return exc.code().name
    return "OK"


def _reload(proc: ServiceProc) -> None:
    os.kill(proc.process.pid, signal.SIGHUP)
    time.sleep(0.5)  # the front rebuilds its context at the next handshake; SIGHUP forces it


def test_rotate_reissue_reload_retire_without_restart(tmp_path):
    pki = FleetPki(tmp_path)
    state_dir = str(tmp_path / "fleet")
    paths = pki.paths(stage_identity(0))
    old_operator = pki.creds(OPERATOR)
    proc = ServiceProc("services.stage_worker", tmp_path, env={
        "FORNAX_INSECURE": "", "FORNAX_TLS_CA": str(paths.ca), "FORNAX_TLS_CERT": str(paths.cert),
        "FORNAX_TLS_KEY": str(paths.key), "FORNAX_AUDIT_LOG": str(tmp_path / "audit.jsonl")})
    try:
        deadline = time.monotonic() + 60
        while not proc.ready_file.exists():
            assert proc.process.poll() is None and time.monotonic() < deadline, proc.log_file.read_text()
            time.sleep(0.05)
        address = f"127.0.0.1:{json.loads(proc.ready_file.read_text())['grpc']}"
        assert _health(address, old_operator) == "OK"

        assert "trusts the old and the new CA" in _fornax("certs", "rotate-ca", "--state-dir", state_dir)
        pki.store.rotate(pki.store.identities(), now())  # `fornax certs rotate`: every leaf, the stage's too
        _reload(proc)
        new_operator = pki.creds(OPERATOR)
        assert new_operator.cert_pem != old_operator.cert_pem
        # Transition: the old CA's certificate still works next to the new one.
        old_during = ClientCredentials(new_operator.ca_pem, old_operator.cert_pem, old_operator.key_pem)
        assert _health(address, new_operator) == "OK"
        assert _health(address, old_during) == "OK"

        assert "trusts the new fleet CA only" in _fornax("certs", "retire-ca", "--state-dir", state_dir)
        _reload(proc)
        new_operator = pki.creds(OPERATOR)
        assert _health(address, new_operator) == "OK"
        old_after = ClientCredentials(new_operator.ca_pem, old_operator.cert_pem, old_operator.key_pem)
        assert _health(address, old_after) == "UNAVAILABLE"
        assert proc.process.poll() is None  # never restarted
    finally:
        proc.stop()
    results = [e.event.result for e in read_entries(tmp_path / "audit.jsonl")]
    assert "UNAUTHENTICATED:UNKNOWN_CA" in results
