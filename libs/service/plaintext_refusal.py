"""Answer a plaintext gRPC client on a TLS port: one HTTP/2 exchange ending every stream it
opens with a trailers-only response `grpc-status 16 UNAUTHENTICATED` and reason
PLAINTEXT_REFUSED, the same reason encoding as every other Fornax error (a google.rpc.ErrorInfo
status detail and `fornax-reason` trailing metadata).

Sans-I/O: feed it the bytes the peer sent, send back what it returns. The h2 library does the
HTTP/2 framing and HPACK.
"""

from __future__ import annotations

import base64
import urllib.parse

import h2.config
import h2.connection
import h2.events
import h2.exceptions
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from libs.security.handshake import HandshakeRefusal
from libs.service.errors import ERROR_DOMAIN, REASON_METADATA_KEY

UNAUTHENTICATED = 16
MESSAGE = "this port serves TLS with a fleet client certificate; plaintext is refused"


def _status_details(reason: str) -> str:
    info = error_details_pb2.ErrorInfo(reason=reason, domain=ERROR_DOMAIN)
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=UNAUTHENTICATED, message=MESSAGE, details=[detail])
    return base64.b64encode(status.SerializeToString()).decode().rstrip("=")


def refusal_headers(reason: str = HandshakeRefusal.PLAINTEXT_REFUSED.value) -> list[tuple[str, str]]:
    return [
        (":status", "200"),
        ("content-type", "application/grpc"),
        ("grpc-status", str(UNAUTHENTICATED)),
        ("grpc-message", urllib.parse.quote(MESSAGE, safe=" ")),
        ("grpc-status-details-bin", _status_details(reason)),
        (REASON_METADATA_KEY, reason),
    ]


class PlaintextRefusal:
    """One plaintext connection's HTTP/2 server side, refusing every call."""

    def __init__(self) -> None:
        self._conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        self._conn.initiate_connection()
        # The methods the peer tried to call, in order (for the audit log).
        self.paths: list[str] = []
        # True once the peer is not speaking HTTP/2, or closed: stop reading.
        self.finished = False

    def initial_bytes(self) -> bytes:
        return self._conn.data_to_send()

    def receive(self, data: bytes) -> bytes:
        """What to send back after the peer sent data."""
        if not data:
            self.finished = True
            return b""
        try:
            events = self._conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            self.finished = True  # not HTTP/2 at all (an HTTP/1 request, a port scan)
            return self._conn.data_to_send()
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                path = next((v for k, v in event.headers or () if k in (":path", b":path")), "")
                self.paths.append(path.decode(errors="replace") if isinstance(path, bytes) else str(path))
                self._conn.send_headers(event.stream_id, refusal_headers(), end_stream=True)
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.finished = True
        return self._conn.data_to_send()

    def goodbye(self) -> bytes:
        self._conn.close_connection()
        return self._conn.data_to_send()
