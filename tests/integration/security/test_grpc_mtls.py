"""A stage worker serving mTLS: who gets in, who is refused with which code, what is audited."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import ssl

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fornax.stage_worker.v1 import stage_worker_pb2 as pb
from fornax.stage_worker.v1 import stage_worker_pb2_grpc as pb_grpc
from libs.security.audit import AuditLog, verify_file
from libs.security.certs import fingerprint
from libs.security.identity import Identity, Role, stage_identity
from libs.service.interceptors import reason_of
from libs.service.server import InsecureNotChosen, build_server
from services.stage_worker.config import StageWorkerConfig
from services.stage_worker.server import make_spec
from tests.integration.security.pki import CLIENT, OPERATOR, FleetPki, now

UNLOAD = "/fornax.stage_worker.v1.StageWorkerService/UnloadStage"


@pytest.fixture
def pki(tmp_path):
    return FleetPki(tmp_path)


async def _serve(pki: FleetPki, tmp_path, **server_overrides):
    cfg = StageWorkerConfig.from_env([], {})
    server = dataclasses.replace(cfg.server, tls=pki.paths(stage_identity(0)),
                                 audit_log=str(tmp_path / "audit.jsonl"), **server_overrides)
    cfg = dataclasses.replace(cfg, server=server)
    spec = await make_spec(cfg)
    return await build_server(cfg.server, spec), spec


async def _stop(running, spec):
    await running.stop(0)  # the TLS front, the gRPC server and the health port
    await spec.on_stop()


async def _unload(channel) -> grpc.RpcError | pb.UnloadStageResponse:
    try:
        return await pb_grpc.StageWorkerServiceStub(channel).UnloadStage(
            pb.UnloadStageRequest(request_id="r1"), timeout=5)
    except grpc.RpcError as exc:
        return exc


def _audit(tmp_path) -> list:
    return AuditLog(tmp_path / "audit.jsonl").entries()


def test_handshake_refusals_get_their_reason_and_are_audited(pki, tmp_path):
    async def body():
        running, spec = await _serve(pki, tmp_path)
        address = f"127.0.0.1:{running.port}"
        outcomes = {}
        try:
            channels = {
                "plaintext": grpc.aio.insecure_channel(address),
                "no client certificate": pki.channel(address, None),
                "foreign CA": pki.channel(address, OPERATOR, foreign=True),
            }
            for label, channel in channels.items():
                async with channel:
                    error = await _unload(channel)
                assert isinstance(error, grpc.RpcError), label
                outcomes[label] = (error.code(), reason_of(error))
        finally:
            await _stop(running, spec)
        return outcomes

    outcomes = asyncio.run(body())
    assert outcomes == {
        "plaintext": (grpc.StatusCode.UNAUTHENTICATED, "PLAINTEXT_REFUSED"),
        "no client certificate": (grpc.StatusCode.UNAUTHENTICATED, "CLIENT_CERTIFICATE_REQUIRED"),
        # The TLS handshake itself fails: the client only sees the connection refused.
        "foreign CA": (grpc.StatusCode.UNAVAILABLE, None),
    }
    results = {(e.event.rpc, e.event.result) for e in _audit(tmp_path)}
    assert results == {(UNLOAD, "UNAUTHENTICATED:PLAINTEXT_REFUSED"),
                       (UNLOAD, "UNAUTHENTICATED:CLIENT_CERTIFICATE_REQUIRED"),
                       ("(tls-handshake)", "UNAUTHENTICATED:UNKNOWN_CA")}
    assert verify_file(tmp_path / "audit.jsonl").ok


def test_client_role_cannot_unload_and_the_refusal_is_audited(pki, tmp_path):
    async def body():
        running, spec = await _serve(pki, tmp_path)
        try:
            async with pki.channel(f"127.0.0.1:{running.port}", CLIENT) as channel:
                error = await _unload(channel)
        finally:
            await _stop(running, spec)
        assert error.code() is grpc.StatusCode.PERMISSION_DENIED
        assert reason_of(error) == "ROLE_NOT_ALLOWED"
        [entry] = _audit(tmp_path)
        assert (entry.event.caller, entry.event.rpc) == ("client/app", UNLOAD)
        assert entry.event.result == "PERMISSION_DENIED:ROLE_NOT_ALLOWED"
        assert verify_file(tmp_path / "audit.jsonl").ok

    asyncio.run(body())


def test_operator_unload_runs_and_is_audited(pki, tmp_path):
    async def body():
        running, spec = await _serve(pki, tmp_path)
        try:
            async with pki.channel(f"127.0.0.1:{running.port}", OPERATOR) as channel:
                response = await _unload(channel)
                health = await pb_grpc.StageWorkerServiceStub(channel).GetHealth(pb.GetHealthRequest(), timeout=5)
        finally:
            await _stop(running, spec)
        assert isinstance(response, pb.UnloadStageResponse), response
        assert response.state == health.state == pb.STAGE_STATE_UNLOADED
        [entry] = _audit(tmp_path)
        assert (entry.event.caller, entry.event.result) == ("operator/admin", "OK")

    asyncio.run(body())


def test_health_is_open_on_its_plaintext_port_and_to_any_fleet_identity(pki, tmp_path):
    async def body():
        running, spec = await _serve(pki, tmp_path, health_port=0)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.health_port}") as channel:
                plain = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            async with pki.channel(f"127.0.0.1:{running.port}", Identity(Role.STAGE, "stage-7")) as channel:
                mtls = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.health_port}") as channel:
                with pytest.raises(grpc.RpcError) as caught:
                    await pb_grpc.StageWorkerServiceStub(channel).UnloadStage(pb.UnloadStageRequest(), timeout=5)
        finally:
            await _stop(running, spec)
        assert plain.status == mtls.status == health_pb2.HealthCheckResponse.SERVING
        assert caught.value.code() is grpc.StatusCode.UNIMPLEMENTED
        assert _audit(tmp_path) == []

    asyncio.run(body())


def _served_fingerprint(pki: FleetPki, port: int) -> str:
    creds = pki.paths(OPERATOR)
    context = ssl.create_default_context(cafile=str(creds.ca))
    context.load_cert_chain(str(creds.cert), str(creds.key))
    context.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port)) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as tls:
        der = tls.getpeercert(binary_form=True)
    return fingerprint(ssl.DER_cert_to_PEM_cert(der).encode())


def test_rotated_certificate_is_served_to_new_connections_without_restart(pki, tmp_path):
    async def body():
        running, spec = await _serve(pki, tmp_path)
        try:
            before = await asyncio.to_thread(_served_fingerprint, pki, running.port)
            async with pki.channel(f"127.0.0.1:{running.port}", OPERATOR) as channel:
                stub = pb_grpc.StageWorkerServiceStub(channel)
                await stub.GetHealth(pb.GetHealthRequest(), timeout=5)
                pki.store.rotate([stage_identity(0)], now())
                after = await asyncio.to_thread(_served_fingerprint, pki, running.port)
                # The connection opened before the rotation keeps working.
                await stub.GetHealth(pb.GetHealthRequest(), timeout=5)
        finally:
            await _stop(running, spec)
        assert before != after == fingerprint(pki.paths(stage_identity(0)).cert.read_bytes())

    asyncio.run(body())


def test_a_server_without_tls_or_an_explicit_insecure_choice_does_not_start(tmp_path):
    async def body():
        cfg = StageWorkerConfig.from_env([], {})
        spec = await make_spec(cfg)
        try:
            with pytest.raises(InsecureNotChosen):
                await build_server(cfg.server, spec)
        finally:
            await spec.on_stop()

    asyncio.run(body())


def test_operator_load_outside_the_read_roots_is_refused_and_audited(pki, tmp_path):
    from fornax.common.v1 import common_pb2

    spec = pb.StageSpec(
        stage_index=0, stage_count=1, backend=common_pb2.BACKEND_NUMPY, boundary_dtype=common_pb2.ELEMENT_TYPE_FP32,
        device="cpu", output_mode=pb.OUTPUT_MODE_SAMPLED_TOKENS, artifact_dir="/etc",
        plan=common_pb2.PlanBinding(plan_id="p", plan_hash="h", plan_generation_id="g"))
    spec.layer_range.layer_start, spec.layer_range.layer_end_exclusive = 0, 1

    async def body():
        running, server_spec = await _serve(pki, tmp_path)
        try:
            async with pki.channel(f"127.0.0.1:{running.port}", OPERATOR) as channel:
                with pytest.raises(grpc.RpcError) as caught:
                    await pb_grpc.StageWorkerServiceStub(channel).LoadStage(
                        pb.LoadStageRequest(request_id="l1", spec=spec), timeout=5)
        finally:
            await _stop(running, server_spec)
        return caught.value

    error = asyncio.run(body())
    assert (error.code(), reason_of(error)) == (grpc.StatusCode.PERMISSION_DENIED, "PATH_OUTSIDE_ROOTS")
    [entry] = _audit(tmp_path)
    assert (entry.event.caller, entry.event.result) == ("operator/admin", "PERMISSION_DENIED:PATH_OUTSIDE_ROOTS")


def test_a_tls_stage_reports_its_identity_and_needs_its_data_plane_peers_named(pki, tmp_path):
    from fornax.common.v1 import common_pb2

    spec = pb.StageSpec(
        stage_index=0, stage_count=2, backend=common_pb2.BACKEND_NUMPY, boundary_dtype=common_pb2.ELEMENT_TYPE_FP32,
        device="cpu", output_mode=pb.OUTPUT_MODE_SAMPLED_TOKENS, artifact_dir=str(tmp_path / "artifact"),
        next_hop_address="127.0.0.1:9", next_hop_manifest_hash="sha256:" + "0" * 64,
        plan=common_pb2.PlanBinding(plan_id="p", plan_hash="h", plan_generation_id="g"))
    spec.layer_range.layer_start, spec.layer_range.layer_end_exclusive = 0, 1

    async def body():
        cfg = StageWorkerConfig.from_env([], {"FORNAX_READ_ROOTS": str(tmp_path)})
        cfg = dataclasses.replace(cfg, server=dataclasses.replace(
            cfg.server, tls=pki.paths(stage_identity(0)), audit_log=str(tmp_path / "audit.jsonl")))
        server_spec = await make_spec(cfg)
        running = await build_server(cfg.server, server_spec)
        try:
            async with pki.channel(f"127.0.0.1:{running.port}", OPERATOR) as channel:
                stub = pb_grpc.StageWorkerServiceStub(channel)
                capabilities = await stub.GetCapabilities(pb.GetCapabilitiesRequest(), timeout=5)
                refused = {}
                for field, value in (("spec.previous_hop_identity", None),
                                     ("spec.next_hop_identity", "spiffe://fornax/service/orchestrator")):
                    if value:
                        spec.previous_hop_identity = value
                    with pytest.raises(grpc.RpcError) as caught:
                        await stub.LoadStage(pb.LoadStageRequest(request_id=field, spec=spec), timeout=5)
                    refused[field] = (caught.value.code(), reason_of(caught.value))
        finally:
            await _stop(running, server_spec)
        return capabilities, refused

    capabilities, refused = asyncio.run(body())
    assert capabilities.identity == "spiffe://fornax/stage/stage-0"
    assert refused == dict.fromkeys(refused, (grpc.StatusCode.INVALID_ARGUMENT, "MISSING_PEER_IDENTITY"))


def test_generate_needs_the_client_role_or_the_api_key(pki, tmp_path):
    from fornax.orchestrator.v1 import orchestrator_pb2 as orch_pb
    from fornax.orchestrator.v1 import orchestrator_pb2_grpc as orch_grpc
    from services.orchestrator.config import OrchestratorConfig
    from services.orchestrator.server import make_spec as orchestrator_spec

    async def body():
        cfg = OrchestratorConfig.from_env([], {"FORNAX_API_KEY": "s3cret"})
        cfg = dataclasses.replace(cfg, server=dataclasses.replace(
            cfg.server, tls=pki.paths(Identity(Role.SERVICE, "orchestrator")), audit_log=str(tmp_path / "audit.jsonl")))
        spec = await orchestrator_spec(cfg)
        running = await build_server(cfg.server, spec)
        request = orch_pb.GenerateRequest(text="hi")
        outcomes = {}
        try:
            for label, who, key in (("planner", Identity(Role.SERVICE, "planner"), None),
                                    ("planner+key", Identity(Role.SERVICE, "planner"), "s3cret"),
                                    ("planner+wrong-key", Identity(Role.SERVICE, "planner"), "guess"),
                                    ("client", CLIENT, None)):
                metadata = (("authorization", f"Bearer {key}"),) if key else ()
                async with pki.channel(f"127.0.0.1:{running.port}", who) as channel:
                    try:
                        async for _ in orch_grpc.OrchestratorServiceStub(channel).Generate(
                                request, metadata=metadata, timeout=5):
                            pass
                        outcomes[label] = "OK"
                    except grpc.RpcError as exc:
                        outcomes[label] = reason_of(exc) or exc.code().name
        finally:
            await _stop(running, spec)
        return outcomes

    outcomes = asyncio.run(body())
    assert outcomes["planner"] == outcomes["planner+wrong-key"] == "ROLE_NOT_ALLOWED"
    # Admitted: what stops them now is that no route is installed, not authorization.
    assert outcomes["planner+key"] == outcomes["client"] != "ROLE_NOT_ALLOWED"
