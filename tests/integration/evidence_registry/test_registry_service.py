"""The evidence registry as a real process: every RPC over gRPC, restarts, shared-database writers."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from fornax.evidence_registry.v1 import evidence_registry_pb2 as pb
from fornax.evidence_registry.v1 import evidence_registry_pb2_grpc as pb_grpc
from libs.security.audit import read_entries, verify_file
from libs.security.identity import Identity, Role
from libs.security.store import CertStore
from services.evidence_registry.blobs import sha256_hex
from services.evidence_registry.client import (
    EvidenceUnresolved,
    RegistryCallFailed,
    RegistryClient,
    require_resolved,
)
from services.evidence_registry.config import DEFAULT_MAX_BLOB_BYTES
from services.evidence_registry.domain import (
    EvidenceClass,
    Expectation,
    RecordStatus,
    RecordType,
    ResolutionReason,
    ValidityWindow,
)
from services.evidence_registry.signatures import sign_content
from tests.integration.evidence_registry.harness import MEASURING_HOST, evidence_pki, signed, start_registry
from tests.unit.evidence_registry.factories import PHYSICAL_PROVENANCE, T0, content, physical

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    root = tmp_path_factory.mktemp("registry")
    proc, address = start_registry(root / "data", root / "run")
    with RegistryClient(address) as client:
        yield client, root / "data"
    assert proc.stop() == 0


def failure(call) -> RegistryCallFailed:
    with pytest.raises(RegistryCallFailed) as err:
        call()
    return err.value


def test_put_get_list_over_grpc(service):
    client, data = service
    measured = signed(data, physical(), b"tokens_per_s=17.0")
    record = client.put_record(measured, b"tokens_per_s=17.0")
    assert record.blob.sha256_hex == sha256_hex(b"tokens_per_s=17.0")
    assert record.content.provenance == measured.provenance
    assert record.content.provenance.measured_by == "spiffe://fornax/host/bench-host"
    assert record.created_unix_ns > 0
    fetched, blob = client.get_record(record.record_id, include_blob=True)
    assert (fetched, blob) == (record, b"tokens_per_s=17.0")
    assert client.put_record(measured, b"tokens_per_s=17.0") == record
    listed = list(client.iter_records(evidence_class=EvidenceClass.PHYSICAL, page_size=1))
    assert record in listed
    assert all(r.content.evidence_class is EvidenceClass.PHYSICAL for r in listed)


def test_the_largest_default_blob_travels_both_ways(service):
    # Far above gRPC's 4 MiB default: clients and server share one message limit.
    client, _ = service
    blob = bytes(range(256)) * (DEFAULT_MAX_BLOB_BYTES // 256)
    record = client.put_record(content(), blob)
    assert client.get_record(record.record_id, include_blob=True)[1] == blob


def test_put_is_idempotent_on_request_id(service):
    client, _ = service
    first = client.put_record(content(), b"req-a", request_id="integration-req-a")
    assert client.put_record(content(), b"req-a", request_id="integration-req-a") == first
    error = failure(lambda: client.put_record(content(), b"req-b", request_id="integration-req-a"))
    assert (error.code, error.reason) == (grpc.StatusCode.ALREADY_EXISTS, "REQUEST_ID_REUSED")


def test_physical_record_without_provenance_is_invalid_argument(service):
    client, _ = service
    provenance = dataclasses.replace(PHYSICAL_PROVENANCE, backend_build="")
    error = failure(lambda: client.put_record(physical(provenance=provenance), b"x"))
    assert error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert (error.field, error.reason) == ("record.provenance.backend_build", "MISSING_PROVENANCE")


@pytest.mark.parametrize("request_message,field,reason", [
    (pb.PutRecordRequest(record=pb.Record(type=pb.RECORD_TYPE_MODEL), blob=b"x"),
     "record.evidence_class", "UNSPECIFIED_ENUM"),
    (pb.PutRecordRequest(record=pb.Record(type=99, evidence_class=1), blob=b"x"), "record.type", "UNKNOWN_ENUM"),
    (pb.PutRecordRequest(record=pb.Record(type=1, evidence_class=1)), "blob", "EMPTY_BLOB"),
    (pb.ResolveRecordsRequest(expectations=[pb.RecordExpectation(record_id="a")]),
     "expectations[0].expected_type", "UNSPECIFIED_ENUM"),
    (pb.ListRecordsRequest(page_token="not-a-token"), "page_token", "INVALID_PAGE_TOKEN"),
    (pb.RevokeRecordRequest(record_id="a"), "reason", "MISSING_FIELD"),
])
def test_bad_input_is_invalid_argument_naming_the_field(service, request_message, field, reason):
    client, _ = service
    rpc = {pb.PutRecordRequest: "PutRecord", pb.ResolveRecordsRequest: "ResolveRecords",
           pb.ListRecordsRequest: "ListRecords", pb.RevokeRecordRequest: "RevokeRecord"}[type(request_message)]
    with grpc.insecure_channel(client.address) as channel:
        stub = pb_grpc.EvidenceRegistryServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            getattr(stub, rpc)(request_message, timeout=10)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details()
    wrapped = RegistryCallFailed(rpc, err.value)
    assert (wrapped.field, wrapped.reason) == (field, reason)


def test_every_resolution_failure_reason_over_grpc(service):
    client, data = service
    good = client.put_record(content(validity=ValidityWindow(T0, T0 + 1000)), b"good")
    revoked = client.put_record(content(), b"revoked")
    client.revoke_record(revoked.record_id, "superseded by a new run")
    tampered = client.put_record(content(), b"honest bytes")
    (data / "blobs" / tampered.blob.sha256_hex[:2] / tampered.blob.sha256_hex).write_bytes(b"forged bytes")
    expectations = [
        Expectation(good.record_id, RecordType.MEASUREMENT, good.blob.sha256_hex),
        Expectation("no-such-record", RecordType.MEASUREMENT),
        Expectation(revoked.record_id, RecordType.MEASUREMENT),
        Expectation(good.record_id, RecordType.CAPABILITY),
        Expectation(good.record_id, RecordType.MEASUREMENT, "0" * 64),
        Expectation(tampered.record_id, RecordType.MEASUREMENT),
    ]
    outcome = client.resolve_records(expectations, at_unix_ns=T0 + 10)
    assert [r.reason for r in outcome.resolutions] == [
        None, ResolutionReason.NOT_FOUND, ResolutionReason.REVOKED, ResolutionReason.WRONG_TYPE,
        ResolutionReason.HASH_MISMATCH, ResolutionReason.BLOB_MISMATCH]
    late = client.resolve_records(expectations[:1], at_unix_ns=T0 + 1000).resolutions[0]
    early = client.resolve_records(expectations[:1], at_unix_ns=T0 - 1).resolutions[0]
    assert (late.reason, early.reason) == (ResolutionReason.EXPIRED, ResolutionReason.NOT_YET_VALID)
    damaged = failure(lambda: client.get_record(tampered.record_id, include_blob=True))
    assert (damaged.code, damaged.reason) == (grpc.StatusCode.DATA_LOSS, "BLOB_MISMATCH")
    with pytest.raises(EvidenceUnresolved) as err:
        require_resolved(outcome)
    assert revoked.record_id in str(err.value) and "BLOB_MISMATCH" in str(err.value)


def test_revoke_and_missing_record(service):
    client, _ = service
    record = client.put_record(content(type=RecordType.ROUTE), b"route a->b")
    revoked = client.revoke_record(record.record_id, "link replaced")
    assert revoked.status is RecordStatus.REVOKED
    assert client.get_record(record.record_id)[0].revocation_reason == "link replaced"
    error = failure(lambda: client.get_record("never-stored"))
    assert (error.code, error.reason) == (grpc.StatusCode.NOT_FOUND, "RECORD_NOT_FOUND")


def test_records_survive_a_restart_and_two_processes_share_one_database(tmp_path):
    data = tmp_path / "data"
    proc, address = start_registry(data, tmp_path / "first")
    with RegistryClient(address) as client:
        calibration = signed(data, physical(type=RecordType.CALIBRATION), b"calibration")
        kept = client.put_record(calibration, b"calibration", request_id="restart-req")
        gone = client.put_record(content(), b"to revoke")
        client.revoke_record(gone.record_id, "bad run")
    assert proc.stop() == 0

    first, first_addr = start_registry(data, tmp_path / "second")
    second, second_addr = start_registry(data, tmp_path / "third")
    try:
        with RegistryClient(first_addr) as a, RegistryClient(second_addr) as b:
            assert a.get_record(kept.record_id)[0] == kept
            assert a.put_record(calibration, b"calibration", request_id="restart-req") == kept
            outcome = b.resolve_records([Expectation(kept.record_id, RecordType.CALIBRATION),
                                         Expectation(gone.record_id, RecordType.MEASUREMENT)])
            assert [r.reason for r in outcome.resolutions] == [None, ResolutionReason.REVOKED]

            def put_many(args):
                client, index = args
                return [client.put_record(content(), f"{index}-{n}".encode()).record_id for n in range(10)]

            with ThreadPoolExecutor(max_workers=6) as pool:
                made = [rid for ids in pool.map(put_many, [(a if i % 2 else b, i) for i in range(6)]) for rid in ids]
            assert len(set(made)) == 60
            stored = {r.record_id for r in a.iter_records(page_size=25)}
            assert set(made) <= stored and kept.record_id in stored
            assert b.resolve_records([Expectation(rid, RecordType.MEASUREMENT) for rid in made]).all_ok
        # `b` talks to the second process, which answered the REVOKED resolution above.
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{second.ports['metrics']}/metrics", timeout=10).read()
        assert b'fornax_evidence_resolutions_total{reason="REVOKED"} 1.0' in metrics
    finally:
        assert first.stop() == 0
        assert second.stop() == 0
    events = [json.loads(line).get("event") for line in first.log_lines() + second.log_lines()]
    assert "record_put" in events and "records_unresolved" in events


def test_cli_round_trip(service, tmp_path, capsys):
    import json

    from apps.cli.main import main

    client, _ = service
    blob = tmp_path / "figure.json"
    blob.write_bytes(b'{"tokens_per_s": 12.5}')
    common = ["--registry", client.address, "--json"]
    assert main(["evidence", "put", *common, "--type", "route", "--class", "reference", "--blob", str(blob),
                 "--record-id", "cli-route-a-b"]) == 0
    put_out = json.loads(capsys.readouterr().out)
    assert put_out[0]["record_id"] == "cli-route-a-b"
    assert put_out[0]["blob_sha256"] == "sha256:" + sha256_hex(blob.read_bytes())
    assert main(["evidence", "resolve", *common, "--type", "route", "cli-route-a-b"]) == 0
    assert json.loads(capsys.readouterr().out)["all_ok"] is True
    assert main(["evidence", "revoke", *common, "cli-route-a-b", "--reason", "rerouted"]) == 0
    capsys.readouterr()
    assert main(["evidence", "resolve", *common, "--type", "route", "cli-route-a-b"]) == 1
    assert json.loads(capsys.readouterr().out)["resolutions"][0]["reason"] == "REVOKED"
    assert main(["evidence", "list", *common, "--type", "route", "--status", "revoked"]) == 0
    assert "cli-route-a-b" in {r["record_id"] for r in json.loads(capsys.readouterr().out)}
    # A physical record without provenance is refused with the field named.
    assert main(["evidence", "put", *common, "--type", "measurement", "--class", "physical",
                 "--blob", str(blob)]) == 2
    assert "record.provenance.hardware" in capsys.readouterr().err
    out_file = tmp_path / "copy.json"
    assert main(["evidence", "get", "--registry", client.address, "cli-route-a-b", "--blob-out", str(out_file)]) == 0
    assert out_file.read_bytes() == blob.read_bytes()


def test_async_client_and_plain_value_expectations(service):
    import asyncio

    from services.evidence_registry.client import AsyncRegistryClient, expectation, resolve_records_async

    client, _ = service

    async def scenario():
        async with AsyncRegistryClient(client.address) as registry:
            record = await registry.put_record(content(type=RecordType.MODEL), b"model facts")
            fetched, _ = await registry.get_record(record.record_id)
        outcome = await resolve_records_async(client.address, [
            expectation(record.record_id, "model", record.blob.digest),
            expectation(record.record_id, "route")])
        return record, fetched, outcome

    record, fetched, outcome = asyncio.run(scenario())
    assert fetched == record
    assert [r.reason_code for r in outcome.resolutions] == ["", "WRONG_TYPE"]


def test_unreachable_registry_is_unavailable_not_a_hang():
    import socket

    from libs.service.channels import ChannelConfig, RetryPolicy
    from services.evidence_registry.client import ClientOptions, expectation

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
    retry = RetryPolicy(max_attempts=2, initial_backoff_s=0.01)
    with RegistryClient(address, ClientOptions(timeout_s=2.0, channel=ChannelConfig(retry=retry))) as client:
        error = failure(lambda: client.resolve_records([expectation("a", "model")]))
    assert (error.code, error.reason) == (grpc.StatusCode.UNAVAILABLE, "REGISTRY_UNAVAILABLE")


def _forgeries(data, blob: bytes):
    now = dt.datetime.now(dt.UTC)
    genuine = signed(data, physical(), blob)
    edited = dataclasses.replace(genuine, provenance=dataclasses.replace(genuine.provenance, hardware="8x H100"))
    renamed = dataclasses.replace(genuine, provenance=dataclasses.replace(
        genuine.provenance, measured_by="spiffe://fornax/host/another-host"))
    stranger = CertStore(data.parent / "stranger-pki")
    stranger.init(now)
    foreign = stranger.ensure(MEASURING_HOST, now).read()
    foreign_signed = sign_content(physical(), sha256_hex(blob), MEASURING_HOST, foreign.cert_pem, foreign.key_pem)
    operator = Identity(Role.OPERATOR, "admin")
    own = evidence_pki(data).ensure(operator, now).read()
    by_operator = sign_content(physical(), sha256_hex(blob), operator, own.cert_pem, own.key_pem)
    return {
        "UNSIGNED_PHYSICAL_RECORD": physical(),
        "EVIDENCE_SIGNATURE_INVALID": edited,
        "EVIDENCE_SIGNER_MISMATCH": renamed,
        "EVIDENCE_UNTRUSTED_CERTIFICATE": foreign_signed,
        "EVIDENCE_SIGNER_ROLE_NOT_ALLOWED": by_operator,
    }


def test_forged_physical_records_are_refused_and_audited(tmp_path):
    data, run = tmp_path / "data", tmp_path / "run"
    proc, address = start_registry(data, run)
    blob = b"tokens_per_s=99.0"
    try:
        with RegistryClient(address) as client:
            refused = {}
            for expected, forged in _forgeries(data, blob).items():
                error = failure(lambda forged=forged: client.put_record(forged, blob))
                refused[expected] = (error.code, error.reason)
            assert list(client.iter_records(evidence_class=EvidenceClass.PHYSICAL)) == []
    finally:
        proc.stop()
    assert refused == {reason: (grpc.StatusCode.PERMISSION_DENIED, reason) for reason in refused}
    audit = run / "audit" / "fornax-evidence-registry.jsonl"
    assert verify_file(audit).ok
    results = [entry.event.result for entry in read_entries(audit)]
    assert results == [f"PERMISSION_DENIED:{reason}" for reason in refused]


def test_cli_signs_on_put_and_verify_rechecks_the_signature(tmp_path, capsys):
    from apps.cli.main import main

    data, run = tmp_path / "data", tmp_path / "run"
    pki = evidence_pki(data)
    pki.ensure(Identity(Role.HOST, "gpu-box"), dt.datetime.now(dt.UTC))
    blob = tmp_path / "m.json"
    blob.write_bytes(b'{"decode_tokens_per_s": 31.0}')
    proc, address = start_registry(data, run)
    common = ["--registry", address, "--state-dir", str(pki.root.parent), "--json"]
    physical_args = ["--type", "capability", "--class", "physical", "--blob", str(blob), "--hardware", "1x H200",
                     "--backend-build", "max 26.7", "--model-snapshot", "sha256:" + "cd" * 32,
                     "--command", "fornax bench"]
    try:
        assert main(["evidence", "put", *common, *physical_args]) == 2
        assert "UNSIGNED_PHYSICAL_RECORD" in capsys.readouterr().err
        assert main(["evidence", "put", *common, *physical_args, "--sign-as", "host/gpu-box"]) == 0
        put_out = json.loads(capsys.readouterr().out)[0]
        assert put_out["provenance"]["measured_by"] == "spiffe://fornax/host/gpu-box"
        assert main(["evidence", "verify", *common, put_out["record_id"]]) == 0
        assert json.loads(capsys.readouterr().out)[0]["detail"] == "signed by spiffe://fornax/host/gpu-box"
        stranger = CertStore(tmp_path / "other")
        stranger.init(dt.datetime.now(dt.UTC))
        assert main(["evidence", "verify", *common, "--ca", str(stranger.ca_cert), put_out["record_id"]]) == 1
        assert json.loads(capsys.readouterr().out)[0]["reason"] == "EVIDENCE_UNTRUSTED_CERTIFICATE"
    finally:
        proc.stop()
