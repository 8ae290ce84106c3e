"""The TLS front's pure parts: refusal reasons, the plaintext HTTP/2 answer, the peer table."""

from __future__ import annotations

import base64
import errno
import socket
import ssl

import h2.config
import h2.connection
import h2.events
import pytest
from google.rpc import error_details_pb2, status_pb2

from libs.security.handshake import HandshakeRefusal, classify, is_tls_hello
from libs.security.identity import Identity, Role
from libs.service.plaintext_refusal import PlaintextRefusal
from libs.service.tls_front import PeerAuth, PeerIdentityUnknown, PeerTable, bind_loopback_source


def _verify_error(code: int) -> ssl.SSLCertVerificationError:
    error = ssl.SSLCertVerificationError(1, "certificate verify failed")
    error.verify_code = code
    return error


def test_refusal_reasons_follow_the_openssl_verify_code():
    assert classify(_verify_error(20)) is HandshakeRefusal.UNKNOWN_CA
    assert classify(_verify_error(19)) is HandshakeRefusal.UNKNOWN_CA
    assert classify(_verify_error(10)) is HandshakeRefusal.CERTIFICATE_EXPIRED
    assert classify(_verify_error(7)) is HandshakeRefusal.BAD_CERTIFICATE  # signature failure
    assert classify(TimeoutError()) is HandshakeRefusal.HANDSHAKE_TIMEOUT
    assert classify(ConnectionAbortedError("SSL handshake is taking longer than 1 seconds")) \
        is HandshakeRefusal.HANDSHAKE_TIMEOUT
    assert classify(ConnectionResetError()) is HandshakeRefusal.HANDSHAKE_FAILED


def test_only_a_handshake_record_counts_as_tls():
    assert is_tls_hello(b"\x16")
    assert not is_tls_hello(b"P")  # "PRI * HTTP/2.0", a plaintext gRPC client
    assert not is_tls_hello(b"")


def _client_call(path: str) -> tuple[h2.connection.H2Connection, bytes]:
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":path", path),
                            (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")])
    return client, client.data_to_send()


def test_every_plaintext_call_ends_unauthenticated_with_the_reason():
    refusal = PlaintextRefusal()
    client, request = _client_call("/svc/Method")
    client.receive_data(refusal.initial_bytes())
    events = client.receive_data(refusal.receive(request))
    [response] = [e for e in events if isinstance(e, h2.events.ResponseReceived)]
    headers = {k.decode(): v.decode() for k, v in response.headers}
    assert headers["grpc-status"] == "16"
    assert headers["fornax-reason"] == "PLAINTEXT_REFUSED"
    status = status_pb2.Status.FromString(base64.b64decode(headers["grpc-status-details-bin"] + "=="))
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    assert (status.code, info.reason) == (16, "PLAINTEXT_REFUSED")
    assert any(isinstance(e, h2.events.StreamEnded) for e in events)
    assert refusal.paths == ["/svc/Method"]


def test_a_peer_that_does_not_speak_http2_is_dropped():
    refusal = PlaintextRefusal()
    refusal.receive(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert refusal.finished and refusal.paths == []


def test_peer_table_answers_only_for_registered_loopback_ports():
    table = PeerTable()
    operator = PeerAuth(Identity(Role.OPERATOR, "admin"))
    table.register(40000, operator)
    assert table.lookup("ipv4:127.0.0.1:40000") == operator
    assert table.lookup("ipv4:127.0.0.1:40001") is None
    assert table.lookup("ipv4:10.0.0.1:40000") is None  # not a connection the front opened
    table.release(40000)
    assert len(table) == 0
    # A port the front let go is never taken for a connection it did not open, nor guessed.
    with pytest.raises(PeerIdentityUnknown):
        table.lookup("ipv4:127.0.0.1:40000")
    table.register(40000, operator)  # a new front connection on that port
    assert table.lookup("ipv4:127.0.0.1:40000") == operator


def test_a_loopback_source_port_bound_by_number_stays_held_after_its_connection_closes():
    with socket.create_server(("127.0.0.1", 0)) as server:
        source = bind_loopback_source()
        port = source.getsockname()[1]
        keeper = source.dup()
        source.connect(server.getsockname())
        accepted, _ = server.accept()
        keeper.shutdown(socket.SHUT_RDWR)
        source.close()
        accepted.close()
        with socket.socket() as squatter, pytest.raises(OSError) as caught:
            squatter.bind(("127.0.0.1", port))
        assert caught.value.errno == errno.EADDRINUSE
        keeper.close()
