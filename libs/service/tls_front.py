"""The TLS front of a service's public gRPC port: the one place a stranger is turned away.

gRPC's own TLS refuses a plaintext client, a client without a certificate or one from another
CA inside gRPC core, where the application neither sees nor can audit the refusal (grpc-python
has no handshake-failure hook). So the service's gRPC server listens plaintext on an ephemeral
loopback port, and this front owns the public port:

- a first byte that is not a TLS handshake record: the peer is answered as an HTTP/2 server,
  every call it opens ends `UNAUTHENTICATED` / `PLAINTEXT_REFUSED`, and the refusal is audited;
- a TLS handshake that fails (another CA, an expired or malformed certificate, or no handshake
  within the timeout): audited with its specific reason; the peer sees the TLS alert;
- a completed handshake, with a verified fleet certificate or with none: the front opens a
  loopback connection to the gRPC server, records that connection's source port with the
  peer's verified identity in a `PeerTable`, and copies bytes both ways. The authorization
  interceptor reads the identity from the table by `context.peer()`; a loopback connection the
  front did not open has no identity, and the API key is not honoured on it.

A port names one connection only while nobody else can hold it, and gRPC authorizes a call when
its handler starts, which can be after the connection it came on has closed. So the front binds
each loopback connection's source port explicitly (the kernel then keeps it bound to that socket
until its last descriptor closes, even past the TCP close), keeps a descriptor, and keeps the
table entry for `RETAIN_S` after the connection closed; only then are both let go together. A
lookup of a port the front has let go is refused (`PeerIdentityUnknown`), never guessed.

The server context verifies a certificate when one is presented (CERT_OPTIONAL), so a TLS
client without a certificate reaches the interceptor and is refused there per RPC, with a reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from cryptography import x509

from libs.security.certs import CertificateError, identity_of
from libs.security.handshake import HandshakeRefusal, classify, is_tls_hello
from libs.security.identity import Identity
from libs.security.tls import TlsPaths, key_matches_cert
from libs.service.event_loop import EventLoopKind
from libs.service.plaintext_refusal import PlaintextRefusal

log = structlog.get_logger()

HANDSHAKE_TIMEOUT_S = 10.0
# Connections on one listener, handshaking or not; beyond it a new one is closed at once.
MAX_CONNECTIONS = 4096
# A plaintext peer gets this long to send its HTTP/2 preface and first call.
PLAINTEXT_EXCHANGE_S = 2.0
# The pseudo-RPC named in the audit log for a refusal before any call was made.
HANDSHAKE_RPC = "(tls-handshake)"
# How long a closed connection's source port stays bound to its identity, for calls received on it
# that gRPC has not started yet.
RETAIN_S = 30.0
# Attempts at binding a free loopback source port before the connection is given up.
BIND_ATTEMPTS = 64


class PeerIdentityUnknown(Exception):
    """The call came on a front-opened connection whose identity the front has let go."""


@dataclass(frozen=True)
class PeerAuth:
    """What the front learned about one accepted TLS peer."""

    identity: Identity | None  # None: TLS without a client certificate
    certificate_error: CertificateError | None = None  # a CA-signed certificate with no fleet identity


def _port_of(peer: str) -> int | None:
    """The port in a gRPC peer string, `ipv4:127.0.0.1:5555` or `ipv6:[::1]:5555`."""
    if not peer.startswith(("ipv4:127.0.0.1:", "ipv6:[::1]:")):
        return None
    try:
        return int(peer.rsplit(":", 1)[1])
    except ValueError:
        return None


class PeerTable:
    """Loopback source port of a front-opened connection -> the verified peer behind it.

    A released port is remembered, so that a late call on it is refused rather than taken for a
    connection the front did not open; registering the port again forgets that."""

    def __init__(self) -> None:
        self._by_port: dict[int, PeerAuth] = {}
        self._released: set[int] = set()  # at most one per port number: bounded
        self._lock = threading.Lock()

    def register(self, port: int, auth: PeerAuth) -> None:
        with self._lock:
            self._released.discard(port)
            self._by_port[port] = auth

    def release(self, port: int) -> None:
        with self._lock:
            if self._by_port.pop(port, None) is not None:
                self._released.add(port)

    def lookup(self, grpc_peer: str) -> PeerAuth | None:
        """The peer behind a front-opened connection; None for a connection the front did not
        open; raises PeerIdentityUnknown for one whose identity the front has let go."""
        port = _port_of(grpc_peer)
        if port is None:
            return None
        with self._lock:
            if port in self._released:
                raise PeerIdentityUnknown(f"the identity of the connection from {grpc_peer} was released")
            return self._by_port.get(port)

    def ports(self) -> set[int]:
        """The source ports whose peer the table knows now."""
        with self._lock:
            return set(self._by_port)

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_port)


def bind_loopback_source() -> socket.socket:
    """A TCP socket bound to a free 127.0.0.1 port by number. Bound by number, the port stays
    the socket's until its last descriptor closes, even after its connection closed; bound to 0
    (or by connect) the kernel frees it at the TCP close."""
    for _ in range(BIND_ATTEMPTS):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                continue  # taken between the probe and the bind
            raise
        return sock
    raise OSError(errno.EADDRINUSE, "no free loopback source port")


def peer_auth_of(der: bytes | None) -> PeerAuth:
    if der is None:
        return PeerAuth(None)
    try:
        return PeerAuth(identity_of(x509.load_der_x509_certificate(der)))
    except CertificateError as exc:
        return PeerAuth(None, exc)


class FrontSslContext:
    """The front's server context: this service's certificate, the fleet CA bundle, a client
    certificate verified when presented, ALPN h2. Rebuilt (not amended) when the files change
    or a reload is requested, so a CA dropped from the bundle stops being trusted."""

    def __init__(self, paths: TlsPaths):
        self._paths = paths
        self._digest = ""
        self._forced = False
        self.reloads = 0
        self.context = self._build()
        self._digest = paths.digest()

    def _build(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_OPTIONAL
        context.set_alpn_protocols(["h2"])
        material = self._paths.read()
        context.load_verify_locations(cadata=material.ca_pem.decode())
        context.load_cert_chain(str(self._paths.cert), str(self._paths.key))
        return context

    def request_reload(self) -> None:
        self._forced = True

    def current(self) -> ssl.SSLContext:
        digest = self._paths.digest()
        if digest != self._digest or self._forced:
            try:
                material = self._paths.read()
                if material.key_pem and material.cert_pem and key_matches_cert(material.key_pem, material.cert_pem):
                    self.context, self._digest, self._forced = self._build(), digest, False
                    self.reloads += 1
            except (OSError, ValueError, ssl.SSLError) as exc:
                log.warning("tls_reload_failed", detail=str(exc))  # keep the last good context
        return self.context


RefusalSink = Callable[[HandshakeRefusal, str, str], None]  # (reason, peer address, rpc)


class _Half(asyncio.Protocol):
    """One side of a pumped connection: what it receives is written to the other side."""

    def __init__(self, on_lost: Callable[[], None]):
        self.transport: asyncio.Transport | None = None
        self.other: _Half | None = None
        self._pending: list[bytes] = []
        self._on_lost = on_lost

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.other is None or self.other.transport is None:
            self._pending.append(data)
        else:
            self.other.transport.write(data)

    def attach(self, other: _Half) -> None:
        self.other = other
        assert other.transport is not None
        for data in self._pending:
            other.transport.write(data)
        self._pending.clear()

    def eof_received(self) -> bool:
        return False  # close this side; connection_lost closes the other

    def pause_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.resume_reading()

    def connection_lost(self, exc) -> None:
        self._on_lost()
        if self.other is not None and self.other.transport is not None:
            self.other.transport.close()


class TlsFront:
    def __init__(self, host: str, port: int, upstream_port: int, contexts: FrontSslContext,
                 peers: PeerTable, on_refusal: RefusalSink, *,
                 handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS,
                 loop_kind: EventLoopKind = EventLoopKind.ASYNCIO, retain_s: float = RETAIN_S):
        self._address = (host, port)
        self._upstream_port = upstream_port
        self._contexts = contexts
        self._peers = peers
        self._on_refusal = on_refusal
        self._timeout = handshake_timeout_s
        self._max_connections = max_connections
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._transports: set[asyncio.BaseTransport] = set()
        self._retain_s = retain_s
        # Source port -> (a descriptor holding it, the timer that lets it go once retired).
        self._leases: dict[int, tuple[socket.socket, asyncio.TimerHandle | None]] = {}
        self.port = 0
        # The front runs on its own thread and loop, so a busy service loop does not stall the
        # bytes of every call, and the refusal sink (an fsynced audit append) never blocks it.
        self._loop_kind = loop_kind
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    async def start(self) -> int:
        """Bind and serve on the front's own thread and event loop; the bound port."""
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run_loop, args=(ready,), name="tls-front", daemon=True)
        self._thread.start()
        ready.wait()
        return await self._on_front_loop(self._start())

    def _run_loop(self, ready: threading.Event) -> None:
        loop = self._loop_kind_new()
        asyncio.set_event_loop(loop)
        self._loop = loop
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    def _loop_kind_new(self) -> asyncio.AbstractEventLoop:
        if self._loop_kind is EventLoopKind.UVLOOP:
            import uvloop  # a declared dependency

            return uvloop.new_event_loop()
        return asyncio.new_event_loop()

    async def _on_front_loop(self, coro):
        assert self._loop is not None
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def stop_accepting(self) -> None:
        if self._loop is not None:
            await self._on_front_loop(self._stop_accepting())

    async def close(self) -> None:
        if self._loop is None:
            return
        await self._on_front_loop(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        self._loop = self._thread = None

    async def _start(self) -> int:
        family = socket.AF_INET6 if ":" in self._address[0] else socket.AF_INET
        listener = socket.create_server(self._address, family=family, backlog=1024)
        listener.setblocking(False)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._accepting = asyncio.create_task(self._accept_loop())
        return self.port

    def request_reload(self) -> None:
        self._contexts.request_reload()

    @property
    def active_connections(self) -> int:
        """Connections the front is handling now (handshaking, refusing or pumping)."""
        return len(self._tasks)

    async def _stop_accepting(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
            self._accepting = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    async def _close(self) -> None:
        await self._stop_accepting()
        for task in list(self._tasks):
            task.cancel()
        for transport in list(self._transports):
            transport.close()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for port in list(self._leases):
            self._release(port)

    def _lease(self, auth: PeerAuth) -> tuple[socket.socket, int]:
        """A socket for a new loopback connection, its source port registered as auth's."""
        source = bind_loopback_source()
        port = source.getsockname()[1]
        self._leases[port] = (source.dup(), None)
        # Registered before the first byte reaches the gRPC server, so no call can beat it.
        self._peers.register(port, auth)
        return source, port

    def _retire(self, port: int) -> None:
        """The loopback connection closed on the front's side: end it toward the gRPC server
        (the kept descriptor would otherwise hold it open), and let its identity go RETAIN_S later."""
        lease = self._leases.get(port)
        if lease is None or lease[1] is not None:
            return
        with contextlib.suppress(OSError):
            lease[0].shutdown(socket.SHUT_RDWR)
        timer = asyncio.get_running_loop().call_later(self._retain_s, self._release, port)
        self._leases[port] = (lease[0], timer)

    def _release(self, port: int) -> None:
        """Forget the identity, then free the port: in that order, so that no connection can
        hold the port while the table still names someone for it."""
        reservation, timer = self._leases.pop(port)
        if timer is not None:
            timer.cancel()
        self._peers.release(port)
        with contextlib.suppress(OSError):
            reservation.shutdown(socket.SHUT_RDWR)
        reservation.close()

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._listener is not None
        while True:
            sock, address = await loop.sock_accept(self._listener)
            if len(self._tasks) >= self._max_connections:
                log.warning("front_connection_refused", peer=str(address), detail="connection cap reached")
                sock.close()
                continue
            # asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP, which an
            # accepted socket's is not; without it each small HTTP/2 write waits for an ACK.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = asyncio.create_task(self._handle(sock, f"{address[0]}:{address[1]}"))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _first_byte(self, sock: socket.socket) -> bytes:
        """The peer's first byte, left in the socket; b"" when it closed without sending."""
        loop = asyncio.get_running_loop()
        readable: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(sock.fileno(), wake)
        try:
            await asyncio.wait_for(readable, self._timeout)
        finally:
            loop.remove_reader(sock.fileno())
        try:
            return sock.recv(1, socket.MSG_PEEK)
        except OSError:
            return b""

    async def _handle(self, sock: socket.socket, peer: str) -> None:
        try:
            first = await self._first_byte(sock)
        except TimeoutError:
            self._refuse(HandshakeRefusal.HANDSHAKE_TIMEOUT, peer, HANDSHAKE_RPC)
            sock.close()
            return
        if not first:
            sock.close()  # a TCP probe: connected and left
            return
        if not is_tls_hello(first):
            await self._refuse_plaintext(sock, peer)
            return
        await self._accept_tls(sock, peer)

    def _refuse(self, reason: HandshakeRefusal, peer: str, rpc: str) -> None:
        log.info("connection_refused", peer=peer, reason=reason.value, rpc=rpc)
        self._on_refusal(reason, peer, rpc)

    async def _refuse_plaintext(self, sock: socket.socket, peer: str) -> None:
        refusal = PlaintextRefusal()
        try:
            reader, writer = await asyncio.open_connection(sock=sock)
        except OSError:
            sock.close()
            self._refuse(HandshakeRefusal.PLAINTEXT_REFUSED, peer, HANDSHAKE_RPC)
            return
        try:
            writer.write(refusal.initial_bytes())
            deadline = asyncio.get_running_loop().time() + PLAINTEXT_EXCHANGE_S
            while not refusal.finished and not refusal.paths:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                try:
                    data = await asyncio.wait_for(reader.read(16384), remaining)
                except TimeoutError:
                    break
                writer.write(refusal.receive(data))
                await writer.drain()
            writer.write(refusal.goodbye())
            await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        self._refuse(HandshakeRefusal.PLAINTEXT_REFUSED, peer, refusal.paths[0] if refusal.paths else HANDSHAKE_RPC)

    async def _accept_tls(self, sock: socket.socket, peer: str) -> None:
        loop = asyncio.get_running_loop()
        closed = loop.create_future()
        upstream_closed = loop.create_future()

        def lost() -> None:
            if not closed.done():
                closed.set_result(None)

        def upstream_lost() -> None:
            lost()
            if not upstream_closed.done():
                upstream_closed.set_result(None)

        downstream, upstream = _Half(lost), _Half(upstream_lost)
        try:
            transport, _ = await asyncio.wait_for(
                loop.connect_accepted_socket(lambda: downstream, sock, ssl=self._contexts.current(),
                                             ssl_handshake_timeout=self._timeout),
                self._timeout + 1.0)
        except (ssl.SSLError, OSError, TimeoutError) as exc:
            sock.close()
            self._refuse(classify(exc), peer, HANDSHAKE_RPC)
            return
        ssl_object = transport.get_extra_info("ssl_object")
        auth = peer_auth_of(ssl_object.getpeercert(binary_form=True) if ssl_object else None)
        try:
            up_transport, port = await self._open_upstream(auth, upstream)
        except OSError as exc:
            log.warning("front_upstream_unreachable", peer=peer, detail=str(exc))
            transport.close()
            return
        self._transports.update((transport, up_transport))
        try:
            upstream.attach(downstream)
            downstream.attach(upstream)
            if transport.is_closing() or closed.done():
                up_transport.close()
                transport.close()
            await closed
        finally:
            self._transports.difference_update((transport, up_transport))
            transport.close()
            up_transport.close()
        await upstream_closed  # asyncio wrote what it had buffered and closed its descriptor
        self._retire(port)

    async def _open_upstream(self, auth: PeerAuth, upstream: _Half) -> tuple[asyncio.BaseTransport, int]:
        """The upstream connection from a source port leased for `auth`, and that port; on
        an OSError the lease is released."""
        loop = asyncio.get_running_loop()
        port = 0
        try:
            source, port = self._lease(auth)
            source.setblocking(False)
            source.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                await loop.sock_connect(source, ("127.0.0.1", self._upstream_port))
                up_transport, _ = await loop.create_connection(lambda: upstream, sock=source)
            except BaseException:
                source.close()
                raise
        except OSError:
            if port in self._leases:
                self._release(port)
            raise
        return up_transport, port
