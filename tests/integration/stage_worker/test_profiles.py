"""Stage workers as real mTLS processes profile themselves and their link; the signed profiles go
into a real registry, come back, and verify against the fleet CA."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import time

import grpc
import pytest

from apps.fleet.health import check_health
from fornax.common.v1 import common_pb2
from fornax.stage_worker.v1 import stage_worker_pb2 as pb
from fornax.stage_worker.v1 import stage_worker_pb2_grpc as pb_grpc
from libs.fnx2.channel.sender import SenderConfig
from libs.fnx2.wire.errors import ErrorCode, Fnx2Error
from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from libs.profiles.link import probe_binding
from libs.profiles.schema import link_profile_from_json, stage_profile_from_json
from libs.security.fnx2_tls import Fnx2Tls
from libs.security.identity import stage_identity
from libs.service.interceptors import reason_of
from services.evidence_registry.client import ClientOptions, RegistryClient
from services.evidence_registry.convert import content_from_proto
from services.evidence_registry.signatures import verify_content
from services.planner.model import describe_checkpoint
from services.planner.profile_source import fetch_profile_records
from services.planner.profiles import book_from_records
from tests.integration.security.pki import OPERATOR, FleetPki
from tests.support.procs import ServiceProc

pytestmark = pytest.mark.integration
SMALL_GRID = {"prefill_lengths": [4, 8], "decode_batches": [1, 2], "decode_contexts": [8, 4], "runs": 2,
              "min_run_ms": 5}


def _serving(proc: ServiceProc, creds, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while not proc.ready_file.exists():
        if proc.process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"no ready file: {proc.log_file.read_text()}")
        time.sleep(0.05)
    import json

    address = f"127.0.0.1:{json.loads(proc.ready_file.read_text())['grpc']}"
    while check_health(address, credentials=creds) != "SERVING":
        if time.monotonic() > deadline:
            raise TimeoutError(f"{address} not SERVING")
        time.sleep(0.1)
    return address


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("profiles")
    pki = FleetPki(root / "pki")
    checkpoint = write_checkpoint(CheckpointRequest("tiny", root / "ckpt", seed=5)).out_dir
    registry_dir = root / "registry"
    registry_dir.mkdir()
    registry = ServiceProc("services.evidence_registry", registry_dir, env={
        "FORNAX_REGISTRY_DB": str(registry_dir / "registry.db"), "FORNAX_REGISTRY_BLOB_DIR": str(registry_dir / "b"),
        "FORNAX_EVIDENCE_CA": str(pki.store.ca_cert)})
    procs = [registry]
    try:
        registry_address = registry.wait_serving()
        workers = []
        for i in range(2):
            paths = pki.paths(stage_identity(i))
            (root / f"w{i}").mkdir()
            procs.append(ServiceProc("services.stage_worker", root / f"w{i}", env={
                "FORNAX_INSECURE": "", "FORNAX_TLS_CA": str(paths.ca), "FORNAX_TLS_CERT": str(paths.cert),
                "FORNAX_TLS_KEY": str(paths.key), "FORNAX_STAGE_INDEX": str(i), "FORNAX_BACKEND": "numpy",
                "FORNAX_READ_ROOTS": str(root)}))
        creds = pki.creds(OPERATOR)
        workers = [_serving(p, creds) for p in procs[1:]]
        yield pki, checkpoint, registry_address, workers
    finally:
        for proc in procs:
            proc.stop()


def _stub(pki: FleetPki, address: str):
    return pb_grpc.StageWorkerServiceStub(grpc.secure_channel(address, pki.creds(OPERATOR).channel_credentials()))


def _stage_request(checkpoint, **overrides) -> pb.ProfileStageRequest:
    fields = {"request_id": "p1", "checkpoint_dir": str(checkpoint), "host": "alpha",
              "model_snapshot": describe_checkpoint(checkpoint).model_snapshot, "command": "pytest profile",
              **SMALL_GRID, **overrides}
    request = pb.ProfileStageRequest(**fields)
    request.layer_ranges.extend([common_pb2.LayerRange(layer_start=0, layer_end_exclusive=2),
                                 common_pb2.LayerRange(layer_start=3, layer_end_exclusive=4)])
    return request


def _stored_and_verified(pki: FleetPki, registry: str, reply) -> tuple[object, bytes]:
    with RegistryClient(registry, ClientOptions()) as client:
        stored = client.put_record(content_from_proto(reply.record), reply.profile_json)
        record, blob = client.get_record(stored.record_id, include_blob=True)
    assert blob == reply.profile_json
    signer = verify_content(record.content, hashlib.sha256(blob).hexdigest(), pki.store.ca_cert.read_bytes(),
                            dt.datetime.now(dt.UTC))
    return record, signer


def test_a_worker_profiles_its_layer_kinds_and_the_signed_record_round_trips(fleet):
    pki, checkpoint, registry, workers = fleet
    reply = _stub(pki, workers[0]).ProfileStage(_stage_request(checkpoint), timeout=300)
    record, signer = _stored_and_verified(pki, registry, reply)
    assert signer.uri == "spiffe://fornax/stage/stage-0"
    profile = stage_profile_from_json(reply.profile_json)
    assert [k.kind for k in profile.kinds] == ["dense", "moe", "embed", "head"]
    for kind in profile.kinds:
        assert sorted(kind.prefill_s_per_token) == [4, 8] and sorted(kind.decode_s_per_microbatch) == [1, 2]
        figures = [*kind.prefill_s_per_token.values(), *kind.decode_s_per_microbatch.values()]
        assert all(f.runs == 2 and 0 < f.low <= f.median <= f.high for f in figures)
    # Decode at every past of the context grid; the plain figures stand at the largest.
    for kind in (profile.kind("dense"), profile.kind("moe")):
        assert kind and sorted(kind.decode_s_by_context) == [4, 8]
        assert kind.decode_s_by_context[8] == kind.decode_s_per_microbatch
        assert all(sorted(t) == [1, 2] and all(f.runs == 2 for f in t.values())
                   for t in kind.decode_s_by_context.values())
    assert profile.decode_contexts == (4, 8)
    # The served step overhead: one figure per decode batch and past, over both profiled ranges' runs.
    assert sorted(profile.step_s_by_context) == [4, 8] and profile.step_s_by_context[8] == profile.step_s_per_microbatch
    assert sorted(profile.step_s_per_microbatch) == [1, 2]
    assert all(f.runs >= 2 and f.low <= f.median <= f.high for f in profile.step_s_per_microbatch.values())
    dense, moe = profile.kind("dense"), profile.kind("moe")
    assert dense and moe and moe.resident_bytes > dense.resident_bytes > 0 and dense.kv_bytes_per_token == 4 * (32 + 16)
    assert profile.host.host == "alpha" and profile.host.cpu_model and profile.backend_build.startswith("numpy ")
    assert profile.context_tokens == 8 and profile.command == "pytest profile"
    content = record.content
    labels = dict(content.labels)
    assert (content.type.value, content.evidence_class.value) == ("measurement", "physical")
    assert labels["profile"] == "stage" and labels["host"] == "alpha" and labels["backend"] == "numpy"
    assert content.subject == "stage-profile:alpha"
    assert content.provenance.model_snapshot == profile.model_snapshot and content.provenance.shapes
    assert content.provenance.layer_range is not None and content.provenance.layer_range.layer_start == 0
    book = book_from_records(fetch_profile_records(registry))
    assert book.stage_record("alpha").profile == profile and book.stage_record("alpha").record_id == record.record_id
    assert book.stage_problem("alpha", profile.model_snapshot, "numpy", time.time_ns()) is None


def test_a_profile_request_that_does_not_fit_is_refused_with_its_reason(fleet):
    pki, checkpoint, _, workers = fleet
    stub = _stub(pki, workers[0])
    cases = [(_stage_request(checkpoint, host=""), grpc.StatusCode.INVALID_ARGUMENT, "MISSING_FIELD"),
             (_stage_request(checkpoint, model_snapshot="sha256:" + "1" * 64), grpc.StatusCode.FAILED_PRECONDITION,
              "MODEL_SNAPSHOT_MISMATCH"),
             (_stage_request(checkpoint, decode_batches=[0]), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_GRID"),
             (_stage_request(checkpoint, decode_contexts=[0, 8]), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_GRID"),
             (_stage_request(checkpoint, decode_contexts=list(range(1, 10))), grpc.StatusCode.INVALID_ARGUMENT,
              "INVALID_GRID"),
             (_stage_request(checkpoint, min_run_ms=60_000), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_GRID")]
    for request, code, reason in cases:
        with pytest.raises(grpc.RpcError) as caught:
            stub.ProfileStage(request, timeout=60)
        assert (caught.value.code(), reason_of(caught.value)) == (code, reason)


def test_a_link_is_profiled_over_tls_fnx2_and_the_probe_admits_only_the_named_peer(fleet):
    pki, _, registry, workers = fleet
    sender, receiver = _stub(pki, workers[0]), _stub(pki, workers[1])
    probe = receiver.OpenLinkProbe(pb.OpenLinkProbeRequest(request_id="o1", peer_identity=stage_identity(0).uri))
    assert probe.identity == stage_identity(1).uri

    async def intruder() -> Fnx2Error:
        tls = Fnx2Tls(pki.paths(stage_identity(7)))
        host, _, port = probe.address.rpartition(":")
        with pytest.raises(Fnx2Error) as caught:
            client = await tls.connect(host, int(port), SenderConfig(probe_binding(probe.probe_id)), probe.identity)
            await client.close()
        return caught.value

    assert asyncio.run(intruder()).code is ErrorCode.PEER_REFUSED
    reply = sender.ProfileLink(pb.ProfileLinkRequest(
        request_id="l1", probe_address=probe.address, probe_id=probe.probe_id, probe_identity=probe.identity,
        from_host="alpha", to_host="beta", runs=2, rtt_iters=3, command="pytest link"), timeout=120)
    record, signer = _stored_and_verified(pki, registry, reply)
    assert signer.uri == stage_identity(0).uri
    link = link_profile_from_json(reply.profile_json)
    assert (link.from_host, link.to_host, link.transport) == ("alpha", "beta", "fnx2+tls")
    assert link.rtt_32kib_s.runs == 2 and link.rtt_32kib_s.median > 0
    assert link.throughput_bytes_per_s.runs == 2 and link.throughput_bytes_per_s.median > 1e6
    assert dict(record.content.labels) == {"profile": "link", "from_host": "alpha", "to_host": "beta"}
    assert record.content.subject == "link-profile:alpha->beta"
    book = book_from_records(fetch_profile_records(registry))
    assert book.link_record("alpha", "beta").profile == link
    assert book.link_problem("alpha", "beta", time.time_ns()) is None


def test_a_probe_refuses_a_probe_id_that_is_not_its_own_shape(fleet):
    pki, _, _, workers = fleet
    with pytest.raises(grpc.RpcError) as caught:
        _stub(pki, workers[0]).ProfileLink(pb.ProfileLinkRequest(
            request_id="l2", probe_address="127.0.0.1:9", probe_id="not-a-uuid", probe_identity=stage_identity(1).uri,
            from_host="alpha", to_host="beta"), timeout=30)
    assert (caught.value.code(), reason_of(caught.value)) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PROBE")



def test_a_probe_listener_is_gone_after_its_ttl(fleet):
    pki, _, _, workers = fleet
    probe = _stub(pki, workers[1]).OpenLinkProbe(
        pb.OpenLinkProbeRequest(request_id="o2", peer_identity=stage_identity(0).uri, ttl_s=1))
    host, _, port = probe.address.rpartition(":")
    time.sleep(2.0)

    async def dial() -> None:
        tls = Fnx2Tls(pki.paths(stage_identity(0)))
        await tls.connect(host, int(port), SenderConfig(probe_binding(probe.probe_id)), probe.identity)

    with pytest.raises(OSError):
        asyncio.run(dial())
    with pytest.raises(grpc.RpcError) as caught:
        _stub(pki, workers[1]).OpenLinkProbe(pb.OpenLinkProbeRequest(request_id="o3", peer_identity="someone"))
    assert (caught.value.code(), reason_of(caught.value)) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PEER_IDENTITY")
