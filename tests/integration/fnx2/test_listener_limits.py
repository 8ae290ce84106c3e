"""Limits before trust on a live FNX2 listener: preamble-sized bodies until bound,
handshake and idle timeouts, a connection cap, and peer admission by certificate."""

import asyncio
import ssl
import struct

import pytest

from libs.fnx2.channel.listener import ListenerLimits, PeerPolicy
from libs.fnx2.channel.receiver import Fnx2Receiver, ReceiverConfig, start_server
from libs.fnx2.channel.sender import Fnx2Client, SenderConfig
from libs.fnx2.wire.codec import PRELUDE_BYTES, decode_frame, encode_frame, parse_prelude
from libs.fnx2.wire.control import Ack, AckHello, Control, Credit, ErrorMessage
from libs.fnx2.wire.errors import ErrorCode, RemoteError
from libs.fnx2.wire.messages import Kind, Phase
from tests.integration.fnx2.helpers import (
    BINDING,
    DoublingHandler,
    Seq,
    make_batch,
    new_request,
    stage_state,
)
from tests.integration.fnx2.pki import MiniCa

pytestmark = pytest.mark.timeout(60)
BOMB_BODY_BYTES = 200 * 1024 * 1024


class RawPeer:
    def __init__(self, reader, writer):
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, **kwargs) -> "RawPeer":
        return cls(*await asyncio.open_connection("127.0.0.1", port, **kwargs))

    async def read(self):
        """The next message, or None at end of stream."""
        try:
            head = await self.reader.readexactly(PRELUDE_BYTES)
            body = await self.reader.readexactly(parse_prelude(head).body_bytes)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        return decode_frame(head + body).message

    async def bind(self) -> None:
        hello = await self.read()
        self.writer.write(encode_frame(Ack("hello", hello.control_id, AckHello(BINDING)), 0).to_bytes())
        assert isinstance(await self.read(), Credit)

    def bomb(self, sequence_no: int) -> None:
        """A BATCH prelude announcing a 200 MiB body, and nothing after it."""
        self.writer.write(struct.pack("!4sHHHHIQQII", b"FNX2", 2, 0, Kind.BATCH, 0, 1024,
                                      BOMB_BODY_BYTES - 1024, sequence_no, 0, 0))

    def close(self) -> None:
        self.writer.close()


async def serve(listener: ListenerLimits, policy: PeerPolicy | None = None, limits=None, **config):
    receiver = Fnx2Receiver(ReceiverConfig(BINDING, listener=listener, peer_policy=policy, **config),
                            DoublingHandler(), stage_state(limits))
    server = await start_server(receiver)
    return receiver, server, server.sockets[0].getsockname()[1]


async def test_an_unbound_peer_cannot_make_the_receiver_reserve_a_large_body():
    receiver, server, port = await serve(ListenerLimits())
    peer = await RawPeer.open(port)
    assert isinstance(await peer.read(), Control)  # hello (plaintext, no policy)
    peer.bomb(0)
    error = await peer.read()
    assert isinstance(error, ErrorMessage) and error.code == ErrorCode.FRAME_SIZE
    assert await peer.read() is None  # closed
    assert receiver.largest_body_bytes == 0
    server.close()


async def test_a_bound_peer_is_held_to_its_payload_credit():
    from services.stage_worker.leases.receiver_state import ReceiverLimits

    receiver, server, port = await serve(ListenerLimits(), limits=ReceiverLimits(payload_bytes=1 << 20))
    peer = await RawPeer.open(port)
    await peer.bind()
    peer.bomb(1)
    error = await peer.read()
    assert error.code == ErrorCode.FRAME_SIZE and "admits" in error.message
    assert receiver.largest_body_bytes < (1 << 20) + 256 * 1024
    server.close()


async def test_handshake_and_idle_timeouts_close_silent_peers_with_their_codes():
    _, server, port = await serve(ListenerLimits(handshake_timeout_s=0.2, idle_timeout_s=0.3))
    silent = await RawPeer.open(port)
    assert isinstance(await silent.read(), Control)
    assert (await silent.read()).code == ErrorCode.HANDSHAKE_TIMEOUT
    assert await silent.read() is None
    bound = await RawPeer.open(port)
    await bound.bind()
    assert (await bound.read()).code == ErrorCode.IDLE_TIMEOUT
    assert await bound.read() is None
    server.close()


async def test_connections_beyond_the_cap_are_refused():
    receiver, server, port = await serve(ListenerLimits(max_connections=2))
    first, second = await RawPeer.open(port), await RawPeer.open(port)
    assert isinstance(await first.read(), Control) and isinstance(await second.read(), Control)
    third = await RawPeer.open(port)
    assert (await third.read()).code == ErrorCode.CONNECTION_LIMIT
    assert await third.read() is None
    first.close()
    await asyncio.wait_for(_until(lambda: receiver.connections == 1), 10)
    fourth = await RawPeer.open(port)
    assert isinstance(await fourth.read(), Control)  # a freed slot is usable again
    server.close()


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.01)


async def test_only_allowed_certificate_identities_get_the_hello(tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "ca").mkdir()
    ca = MiniCa(tmp_path / "ca")
    stranger_ca = MiniCa(tmp_path / "other", "other-ca")
    policy = PeerPolicy(ca.server_context(), allowed_peer_identities=frozenset({"stage-0"}))
    _, server, port = await serve(ListenerLimits(handshake_timeout_s=5), policy)

    allowed = await Fnx2Client.connect("127.0.0.1", port, SenderConfig(BINDING),
                                       ssl=ca.client_context("stage-0"), server_hostname="localhost")
    result = await allowed.submit(make_batch(Phase.PREFILL, [Seq(new_request(), 2)]))
    assert result.results[0].kv_epoch_after == 1
    await allowed.close()

    with pytest.raises(RemoteError) as info:  # right CA, wrong identity: refused before the hello
        await Fnx2Client.connect("127.0.0.1", port, SenderConfig(BINDING),
                                 ssl=ca.client_context("stage-9"), server_hostname="localhost")
    assert info.value.code is ErrorCode.PEER_REFUSED

    intruder = await RawPeer.open(port, ssl=ca.client_context("intruder"), server_hostname="localhost")
    refusal = await intruder.read()  # the first and only frame names no plan
    assert isinstance(refusal, ErrorMessage) and refusal.code == ErrorCode.PEER_REFUSED
    assert await intruder.read() is None

    with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
        stranger = await RawPeer.open(port, ssl=stranger_ca.client_context("stage-0", server_ca=ca),
                                      server_hostname="localhost")
        await stranger.reader.readexactly(1)  # TLS 1.3 reports the refused certificate here
    server.close()


def test_a_peer_policy_needs_required_client_certificates(tmp_path):
    ca = MiniCa(tmp_path)
    context = ca.server_context()
    context.verify_mode = ssl.CERT_OPTIONAL
    with pytest.raises(ValueError):
        PeerPolicy(context, allowed_peer_identities=frozenset({"stage-0"}))


async def test_the_stream_path_admits_like_the_fast_path():
    from libs.fnx2.channel.receiver import serve_channel
    from services.stage_worker.leases.receiver_state import ReceiverLimits

    config = ReceiverConfig(BINDING, listener=ListenerLimits(max_connections=1))
    receiver = Fnx2Receiver(config, DoublingHandler(), stage_state(ReceiverLimits(payload_bytes=1 << 20)))
    server = await asyncio.start_server(lambda r, w: serve_channel(r, w, receiver), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    first = await RawPeer.open(port)
    await first.bind()
    second = await RawPeer.open(port)
    assert (await second.read()).code == ErrorCode.CONNECTION_LIMIT
    assert await second.read() is None
    first.bomb(1)  # the stream path bounds bodies by credit too
    assert (await first.read()).code == ErrorCode.FRAME_SIZE
    server.close()
