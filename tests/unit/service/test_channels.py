"""The client channel factory against a real server built by the shared bootstrap."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from libs.service.channels import (
    MAX_MESSAGE_BYTES,
    ChannelConfig,
    ClientCredentials,
    RetryPolicy,
    open_aio_channel,
    open_channel,
    rpc_errors_as,
    service_config,
)
from libs.service.config import ServerConfig
from libs.service.errors import InvalidArgument, ResourceExhausted, Unavailable
from libs.service.server import ServiceSpec, build_server

SERVICE = "fornax.test.v1.ProbeService"
FAST_RETRY = ChannelConfig(retry=RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05), traced=True)


class Probe:
    """Each method fails with the queued errors first, then answers; it counts every call."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.failures: list[Exception] = []
        self.never = asyncio.Event()

    def handler(self) -> grpc.GenericRpcHandler:
        def method(name: str):
            async def call(request: bytes, context) -> bytes:
                self.calls[name] = self.calls.get(name, 0) + 1
                if name == "Hang":
                    await self.never.wait()
                if self.failures:
                    raise self.failures.pop(0)
                return request

            return grpc.unary_unary_rpc_method_handler(call)

        return grpc.method_handlers_generic_handler(
            SERVICE, {name: method(name) for name in ("Read", "Write", "Echo", "Hang")})


async def _serve(probe: Probe):
    spec = ServiceSpec((SERVICE,), lambda server: server.add_generic_rpc_handlers((probe.handler(),)))
    running = await build_server(ServerConfig("test", insecure=True), spec)
    return running, f"127.0.0.1:{running.port}"


def _scenario(body):
    async def run():
        probe = Probe()
        running, address = await _serve(probe)
        try:
            return await body(probe, address)
        finally:
            await running.server.stop(None)

    return asyncio.run(run())


def test_idempotent_rpc_is_retried_through_unavailable_until_it_succeeds():
    async def body(probe, address):
        probe.failures = [Unavailable("warming"), Unavailable("still warming")]
        async with open_aio_channel(address, FAST_RETRY, idempotent=(f"{SERVICE}/Read",)) as channel:
            reply = await channel.unary_unary(f"/{SERVICE}/Read")(b"ping", timeout=10)
        return reply, probe.calls["Read"]

    assert _scenario(body) == (b"ping", 3)


def test_blocking_channel_retries_resource_exhausted_the_same_way():
    async def body(probe, address):
        probe.failures = [ResourceExhausted("queue full"), Unavailable("restarting")]

        def call() -> bytes:
            with open_channel(address, FAST_RETRY, idempotent=(SERVICE,)) as channel:
                return channel.unary_unary(f"/{SERVICE}/Read")(b"ping", timeout=10)

        return await asyncio.to_thread(call), probe.calls["Read"]

    assert _scenario(body) == (b"ping", 3)


@pytest.mark.parametrize("rpc,error,code", [
    ("Write", Unavailable("down"), grpc.StatusCode.UNAVAILABLE),  # not named idempotent
    ("Read", InvalidArgument("bad"), grpc.StatusCode.INVALID_ARGUMENT),  # not a retryable code
])
def test_other_rpcs_and_codes_fail_on_the_first_attempt(rpc, error, code):
    async def body(probe, address):
        probe.failures = [error, Unavailable("second")]
        async with open_aio_channel(address, FAST_RETRY, idempotent=(f"{SERVICE}/Read",)) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await channel.unary_unary(f"/{SERVICE}/{rpc}")(b"x", timeout=10)
        return caught.value.code(), probe.calls[rpc]

    assert _scenario(body) == (code, 1)


def test_retries_stop_after_max_attempts():
    async def body(probe, address):
        probe.failures = [Unavailable(str(i)) for i in range(5)]
        config = ChannelConfig(retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.01))
        async with open_aio_channel(address, config, idempotent=(SERVICE,)) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await channel.unary_unary(f"/{SERVICE}/Read")(b"x", timeout=10)
        return caught.value.code(), probe.calls["Read"]

    assert _scenario(body) == (grpc.StatusCode.UNAVAILABLE, 2)


def test_a_call_without_a_timeout_gets_the_default_deadline():
    async def body(probe, address):
        config = ChannelConfig(default_deadline_s=0.2)
        async with open_aio_channel(address, config) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as aio_error:
                await channel.unary_unary(f"/{SERVICE}/Hang")(b"x")

        def blocking() -> grpc.RpcError:
            with open_channel(address, config) as channel, pytest.raises(grpc.RpcError) as caught:
                channel.unary_unary(f"/{SERVICE}/Hang")(b"x")
            return caught.value

        return aio_error.value.code(), (await asyncio.to_thread(blocking)).code()

    assert _scenario(body) == (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_messages_up_to_the_shared_limit_pass_both_ways_and_larger_ones_are_refused():
    big = bytes(40 << 20)  # above gRPC's 4 MiB default, below the shared limit

    async def body(probe, address):
        async with open_aio_channel(address) as channel:
            echo = channel.unary_unary(f"/{SERVICE}/Echo")
            reply = await echo(big, timeout=30)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await echo(bytes(MAX_MESSAGE_BYTES + 1), timeout=30)
        return len(reply), caught.value.code(), probe.calls["Echo"]

    assert _scenario(body) == (len(big), grpc.StatusCode.RESOURCE_EXHAUSTED, 1)


def test_rpc_errors_become_the_clients_own_error():
    class CallFailed(Exception):
        def __init__(self, error: grpc.RpcError) -> None:
            super().__init__(error.details())
            self.code = error.code()

    async def body(probe, address):
        probe.failures = [InvalidArgument("top_k must be >= 0")]
        async with open_aio_channel(address) as channel:
            with pytest.raises(CallFailed) as caught, rpc_errors_as(CallFailed):
                await channel.unary_unary(f"/{SERVICE}/Read")(b"x")
        return caught.value.code, str(caught.value)

    code, message = _scenario(body)
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "top_k must be >= 0" in message


def test_service_config_names_only_the_idempotent_rpcs():
    config = json.loads(service_config((SERVICE, "other.v1.Svc/Get"), RetryPolicy(max_attempts=4)))
    (method,) = config["methodConfig"]
    assert method["name"] == [{"service": SERVICE}, {"service": "other.v1.Svc", "method": "Get"}]
    assert method["retryPolicy"]["maxAttempts"] == 4
    assert method["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE", "RESOURCE_EXHAUSTED"]
    assert json.loads(service_config((), RetryPolicy())) == {"methodConfig": []}


def test_client_certificate_needs_its_key():
    with pytest.raises(ValueError, match="private key"):
        ClientCredentials(ca_pem=b"ca", cert_pem=b"cert")


def _issue(name: str, issuer=None):
    """A key and certificate for `name`, signed by `issuer` (key, cert), or self-signed as a CA."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    issuer_key, issuer_cert = issuer or (key, None)
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(subject)
               .issuer_name(issuer_cert.subject if issuer_cert else subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=1))
               .not_valid_after(now + datetime.timedelta(hours=1))
               .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True))
    if issuer is not None:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
    cert = builder.sign(issuer_key, hashes.SHA256())
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return key, cert, key_pem, cert.public_bytes(serialization.Encoding.PEM)


def test_client_credentials_carry_mutual_tls_to_a_server_that_requires_it():
    ca_key, ca_cert, _, ca_pem = _issue("fornax-test-ca")
    _, _, server_key, server_cert = _issue("stage-worker.fornax.test", (ca_key, ca_cert))
    _, _, client_key, client_cert = _issue("orchestrator.fornax.test", (ca_key, ca_cert))

    async def run():
        probe = Probe()
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((probe.handler(),))
        credentials = grpc.ssl_server_credentials([(server_key, server_cert)], ca_pem, require_client_auth=True)
        address = f"127.0.0.1:{server.add_secure_port('127.0.0.1:0', credentials)}"
        await server.start()
        try:
            mutual = ClientCredentials(ca_pem, client_cert, client_key, "stage-worker.fornax.test")
            async with open_aio_channel(address, ChannelConfig(credentials=mutual)) as channel:
                reply = await channel.unary_unary(f"/{SERVICE}/Echo")(b"secret", timeout=10)
            anonymous = ClientCredentials(ca_pem, server_name_override="stage-worker.fornax.test")
            async with open_aio_channel(address, ChannelConfig(credentials=anonymous)) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await channel.unary_unary(f"/{SERVICE}/Echo")(b"secret", timeout=10)
            return reply, refused.value.code(), probe.calls["Echo"]
        finally:
            await server.stop(None)

    assert asyncio.run(run()) == (b"secret", grpc.StatusCode.UNAVAILABLE, 1)
