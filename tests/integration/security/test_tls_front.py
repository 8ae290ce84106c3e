"""A real stage-worker process behind its TLS front: every stranger is refused with its own
reason, and every refusal is in the audit log."""

from __future__ import annotations

import datetime as dt
import json
import socket
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fornax.stage_worker.v1 import stage_worker_pb2 as pb
from fornax.stage_worker.v1 import stage_worker_pb2_grpc as pb_grpc
from libs.security.audit import read_entries, verify_file
from libs.security.certs import CertKeyPair, issue
from libs.security.identity import stage_identity
from libs.service.channels import ClientCredentials
from libs.service.interceptors import reason_of
from tests.integration.security.pki import OPERATOR, FleetPki, now
from tests.support.procs import ServiceProc

UNLOAD = "/fornax.stage_worker.v1.StageWorkerService/UnloadStage"
GET_HEALTH = "/fornax.stage_worker.v1.StageWorkerService/GetHealth"
HANDSHAKE = "(tls-handshake)"


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    root = tmp_path_factory.mktemp("front")
    pki = FleetPki(root)
    paths = pki.paths(stage_identity(0))
    proc = ServiceProc("services.stage_worker", root, env={
        "FORNAX_INSECURE": "", "FORNAX_TLS_CA": str(paths.ca), "FORNAX_TLS_CERT": str(paths.cert),
        "FORNAX_TLS_KEY": str(paths.key), "FORNAX_AUDIT_LOG": str(root / "audit.jsonl"),
        "FORNAX_HEALTH_PORT": "0", "FORNAX_HANDSHAKE_TIMEOUT_S": "1"})
    try:
        deadline = time.monotonic() + 60
        while not proc.ready_file.exists():
            assert proc.process.poll() is None, proc.log_file.read_text()
            assert time.monotonic() < deadline, "no ready file"
            time.sleep(0.05)
        proc.ports = json.loads(proc.ready_file.read_text())
        yield proc, pki, root
    finally:
        proc.stop()


def _address(proc) -> str:
    return f"127.0.0.1:{proc.ports['grpc']}"


def _refusal(channel: grpc.Channel, method=UNLOAD) -> tuple[grpc.StatusCode, str | None]:
    stub = pb_grpc.StageWorkerServiceStub(channel)
    call = stub.UnloadStage if method == UNLOAD else stub.GetHealth
    request = pb.UnloadStageRequest(request_id="r") if method == UNLOAD else pb.GetHealthRequest()
    with pytest.raises(grpc.RpcError) as caught:
        call(request, timeout=10)
    return caught.value.code(), reason_of(caught.value)


def _audited(root, result: str) -> list:
    deadline = time.monotonic() + 10
    while True:
        found = [e.event for e in read_entries(root / "audit.jsonl") if e.event.result == result]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_plaintext_client_gets_unauthenticated_plaintext_refused_and_is_audited(worker):
    proc, _, root = worker
    with grpc.insecure_channel(_address(proc)) as channel:
        assert _refusal(channel) == (grpc.StatusCode.UNAUTHENTICATED, "PLAINTEXT_REFUSED")
    [event] = _audited(root, "UNAUTHENTICATED:PLAINTEXT_REFUSED")
    assert (event.caller, event.rpc) == ("anonymous", UNLOAD)


def test_tls_client_without_certificate_is_refused_per_rpc_and_audited(worker):
    proc, pki, root = worker
    credentials = grpc.ssl_channel_credentials(pki.store.ca_cert.read_bytes())
    with grpc.secure_channel(_address(proc), credentials) as channel:
        assert _refusal(channel) == (grpc.StatusCode.UNAUTHENTICATED, "CLIENT_CERTIFICATE_REQUIRED")
        # Health stays open on the TLS port too.
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    [event] = _audited(root, "UNAUTHENTICATED:CLIENT_CERTIFICATE_REQUIRED")
    assert (event.caller, event.rpc) == ("anonymous", UNLOAD)


def test_certificate_from_another_ca_fails_the_handshake_and_is_audited_as_unknown_ca(worker):
    proc, pki, root = worker
    with grpc.secure_channel(_address(proc), pki.creds(OPERATOR, foreign=True).channel_credentials()) as channel:
        code, _ = _refusal(channel)
    assert code is grpc.StatusCode.UNAVAILABLE
    events = _audited(root, "UNAUTHENTICATED:UNKNOWN_CA")
    assert events and {e.rpc for e in events} == {HANDSHAKE}


def test_expired_certificate_is_audited_as_expired(worker):
    proc, pki, root = worker
    ca = CertKeyPair(pki.store.ca_cert.read_bytes(), pki.store.ca_key.read_bytes())
    old = issue(ca, OPERATOR, now() - dt.timedelta(days=120), validity=dt.timedelta(days=30))
    credentials = ClientCredentials(pki.store.ca_cert.read_bytes(), old.cert_pem, old.key_pem)
    with grpc.secure_channel(_address(proc), credentials.channel_credentials()) as channel:
        code, _ = _refusal(channel)
    assert code is grpc.StatusCode.UNAVAILABLE
    assert _audited(root, "UNAUTHENTICATED:CERTIFICATE_EXPIRED")


def test_a_peer_that_never_finishes_its_handshake_is_cut_off_and_audited(worker):
    proc, _, root = worker
    with socket.create_connection(("127.0.0.1", proc.ports["grpc"]), timeout=10) as sock:
        sock.sendall(b"\x16\x03\x01")  # the start of a ClientHello, then silence
        started = time.monotonic()
        assert sock.recv(1024) == b""  # the front closes it
        waited = time.monotonic() - started
    assert 0.5 < waited < 8
    assert _audited(root, "UNAUTHENTICATED:HANDSHAKE_TIMEOUT")


def test_fleet_certificate_is_admitted_and_the_inner_port_grants_no_identity(worker):
    proc, pki, _ = worker
    with grpc.secure_channel(_address(proc), pki.creds(OPERATOR).channel_credentials()) as channel:
        health = pb_grpc.StageWorkerServiceStub(channel).GetHealth(pb.GetHealthRequest(), timeout=10)
    assert health.state == pb.STAGE_STATE_UNLOADED
    # The gRPC server behind the front, reached directly on loopback: nobody is anyone there.
    with grpc.insecure_channel(f"127.0.0.1:{proc.ports['grpc_inner']}") as channel:
        assert _refusal(channel, GET_HEALTH) == (grpc.StatusCode.UNAUTHENTICATED, "CLIENT_CERTIFICATE_REQUIRED")


def test_the_audit_chain_of_all_those_refusals_verifies(worker):
    _, _, root = worker
    assert verify_file(root / "audit.jsonl").ok
