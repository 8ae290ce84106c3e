"""A call received through the TLS front keeps the identity of the connection it came on, for
as long as gRPC takes to handle it, even once that connection is gone; and no other connection
can ever be taken for it.

Real sockets throughout: a raw TLS + HTTP/2 client sends one complete unary call and closes at
once; an interceptor ahead of authorization holds the call until the front has torn the
connection down, so the identity lookup deterministically happens after the close.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import ssl
from collections.abc import Callable

import grpc
import h2.config
import h2.connection
import pytest

from fornax.stage_worker.v1 import stage_worker_pb2 as pb
from fornax.stage_worker.v1 import stage_worker_pb2_grpc as pb_grpc
from libs.security.audit import AuditLog, read_entries
from libs.security.authz import ORCHESTRATOR
from libs.security.identity import stage_identity
from libs.security.tls import TlsPaths
from libs.service.authz_interceptor import AuthzInterceptor
from libs.service.interceptors import ErrorInterceptor
from libs.service.tls_front import FrontSslContext, PeerTable, TlsFront
from tests.integration.security.pki import OPERATOR, FleetPki

pytestmark = pytest.mark.integration

SERVICE = "fornax.stage_worker.v1.StageWorkerService"
UNLOAD = f"/{SERVICE}/UnloadStage"
WAIT_S = 10.0


class _HoldFirstCall(grpc.aio.ServerInterceptor):
    """Holds the first unary call, its request received, before authorization until `release`.

    gRPC cancels the handler when the call's connection drops; the hold outlasts that, as a
    handler started late by a busy event loop does: authorization runs after the close."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.arrived = asyncio.Event()
        self._held = False

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner = handler.unary_unary

        async def held(request, context):
            if not self._held:
                self._held = True
                self.arrived.set()
                while not self.release.is_set():
                    with contextlib.suppress(asyncio.CancelledError):
                        await self.release.wait()
            return await inner(request, context)

        return handler._replace(unary_unary=held)


class _Fleet:
    """A gRPC server behind a TLS front, as build_server wires them, with a recording handler."""

    def __init__(self, pki: FleetPki, audit_path, **front_options) -> None:
        self.pki = pki
        self.peers = PeerTable()
        self.hold = _HoldFirstCall()
        self.audit = AuditLog(audit_path)
        self.handled: list[tuple[str, str]] = []  # (rpc, context.peer())
        self._front_options = front_options
        self.server: grpc.aio.Server | None = None
        self.front: TlsFront | None = None

    def _handlers(self) -> grpc.GenericRpcHandler:
        async def unload(request, context):
            self.handled.append(("UnloadStage", context.peer()))
            return pb.UnloadStageResponse()

        async def health(request, context):
            self.handled.append(("GetHealth", context.peer()))
            return pb.GetHealthResponse()

        return grpc.method_handlers_generic_handler(SERVICE, {
            "UnloadStage": grpc.unary_unary_rpc_method_handler(
                unload, pb.UnloadStageRequest.FromString, pb.UnloadStageResponse.SerializeToString),
            "GetHealth": grpc.unary_unary_rpc_method_handler(
                health, pb.GetHealthRequest.FromString, pb.GetHealthResponse.SerializeToString),
        })

    async def __aenter__(self) -> _Fleet:
        self.server = grpc.aio.server(interceptors=[
            self.hold, ErrorInterceptor("stage_worker"),
            AuthzInterceptor("stage_worker", self.audit, peers=self.peers)])
        self.server.add_generic_rpc_handlers((self._handlers(),))
        inner = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        self.front = TlsFront("127.0.0.1", 0, inner, FrontSslContext(self.pki.paths(stage_identity(0))),
                              self.peers, lambda *_: None, **self._front_options)
        await self.front.start()
        return self

    async def __aexit__(self, *_) -> None:
        assert self.front is not None and self.server is not None
        self.hold.release.set()
        await self.front.close()
        await self.server.stop(None)

    @property
    def port(self) -> int:
        assert self.front is not None
        return self.front.port

    def audited(self, rpc: str) -> list:
        return [e.event for e in read_entries(self.audit.path) if e.event.rpc == rpc]


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def _send_unload(port: int, paths: TlsPaths) -> ssl.SSLSocket:
    """One complete UnloadStage call over TLS with paths' certificate; the open connection."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(paths.ca))
    context.check_hostname = False  # the stage certificate names a fleet identity, not this host
    context.load_cert_chain(str(paths.cert), str(paths.key))
    context.set_alpn_protocols(["h2"])
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    stream = conn.get_next_available_stream_id()
    conn.send_headers(stream, [(":method", "POST"), (":scheme", "https"), (":path", UNLOAD),
                               (":authority", "localhost"), ("content-type", "application/grpc"),
                               ("te", "trailers")])
    message = pb.UnloadStageRequest(request_id="in-flight").SerializeToString()
    conn.send_data(stream, b"\x00" + len(message).to_bytes(4, "big") + message, end_stream=True)
    tls = context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=WAIT_S))
    tls.sendall(conn.data_to_send())
    return tls


def _port_of(grpc_peer: str) -> int:
    return int(grpc_peer.rsplit(":", 1)[1])


async def _call_then_close(fleet: _Fleet, identity) -> int:
    """Send one UnloadStage as identity; once gRPC holds the call, its request received, close
    the connection and wait for the front to drop it. The call's source port on the inner
    connection, or 0 when the front no longer knows it."""
    before = fleet.peers.ports()
    tls = await asyncio.to_thread(_send_unload, fleet.port, fleet.pki.paths(identity))
    try:
        await asyncio.wait_for(fleet.hold.arrived.wait(), WAIT_S)
        new = fleet.peers.ports() - before
    finally:
        tls.close()
    assert fleet.front is not None
    await _until(lambda: fleet.front.active_connections == 0, "the front to drop the connection")
    return new.pop() if new else 0


def test_a_call_whose_connection_closed_keeps_the_callers_identity(tmp_path):
    async def body():
        async with _Fleet(FleetPki(tmp_path), tmp_path / "audit.jsonl") as fleet:
            await _call_then_close(fleet, ORCHESTRATOR)
            fleet.hold.release.set()
            await _until(lambda: fleet.audited(UNLOAD), "the call's audit entry")
            [event] = fleet.audited(UNLOAD)
            assert (event.caller, event.result) == (str(ORCHESTRATOR), "OK")
            assert [rpc for rpc, _ in fleet.handled] == ["UnloadStage"]

    asyncio.run(body())


def test_no_other_connection_can_take_the_port_of_a_call_in_flight(tmp_path):
    async def body():
        pki = FleetPki(tmp_path)
        async with _Fleet(pki, tmp_path / "audit.jsonl") as fleet:
            port = await _call_then_close(fleet, ORCHESTRATOR)
            assert port, "the in-flight call's source port is still bound to its identity"
            # Nobody, front or not, can open a connection from that port while the call may
            # still look its identity up.
            with socket.socket() as squatter, pytest.raises(OSError) as caught:
                squatter.bind(("127.0.0.1", port))
            assert caught.value.errno == errno.EADDRINUSE
            # Another identity connects and calls meanwhile, on a port of its own.
            async with pki.channel(f"127.0.0.1:{fleet.port}", OPERATOR) as channel:
                await pb_grpc.StageWorkerServiceStub(channel).GetHealth(pb.GetHealthRequest(), timeout=WAIT_S)
            fleet.hold.release.set()
            await _until(lambda: fleet.audited(UNLOAD), "the call's audit entry")
            [event] = fleet.audited(UNLOAD)
            assert (event.caller, event.result) == (str(ORCHESTRATOR), "OK")
            ports = {rpc: _port_of(peer) for rpc, peer in fleet.handled}
            assert ports["UnloadStage"] == port != ports["GetHealth"]

    asyncio.run(body())


def test_a_call_outliving_its_identity_is_refused_peer_identity_unknown_not_anonymous(tmp_path):
    async def body():
        async with _Fleet(FleetPki(tmp_path), tmp_path / "audit.jsonl", retain_s=0.0) as fleet:
            port = await _call_then_close(fleet, ORCHESTRATOR)
            await _until(lambda: port not in fleet.peers.ports(), "the identity to be released")
            fleet.hold.release.set()
            await _until(lambda: fleet.audited(UNLOAD), "the call's audit entry")
            [event] = fleet.audited(UNLOAD)
            assert (event.caller, event.result) == ("anonymous", "UNAUTHENTICATED:PEER_IDENTITY_UNKNOWN")
            assert fleet.handled == []

    asyncio.run(body())
