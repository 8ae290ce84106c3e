"""compact_meta on live loopback channels: negotiated both ways, plain peers keep JSON,
and a malformed compact header is answered with one ERROR while the channel stays aligned."""

import asyncio
import struct

import pytest

from apps.fnx2.fuzz import frame
from libs.fnx2.channel.receiver import Fnx2Receiver, ReceiverConfig, start_server
from libs.fnx2.channel.sender import SenderConfig
from libs.fnx2.wire import codec, compact
from libs.fnx2.wire.codec import PRELUDE_BYTES, decode_frame, encode_frame, parse_prelude
from libs.fnx2.wire.control import EXT_COMPACT_META, Ack, AckHello, Control, Credit, ErrorMessage
from libs.fnx2.wire.messages import Phase, Result, SequenceStatus
from tests.integration.fnx2.helpers import BINDING, DoublingHandler, Seq, loopback, make_batch, new_request, stage_state

pytestmark = pytest.mark.timeout(60)


class CountingCodec:
    """Counts compact BATCH, RESULT and CREDIT decodes on both ends of a channel."""

    def __init__(self, monkeypatch) -> None:
        self.batches = self.results = self.credits = 0
        decode_batch, decode_result = compact.decode_batch, compact.decode_result
        decode_credit = compact.decode_credit

        def credit(*args):
            self.credits += 1
            return decode_credit(*args)

        def batch(*args):
            self.batches += 1
            return decode_batch(*args)

        def result(*args):
            self.results += 1
            return decode_result(*args)

        monkeypatch.setattr(codec.compact, "decode_batch", batch)
        monkeypatch.setattr(codec.compact, "decode_result", result)
        monkeypatch.setattr(codec.compact, "decode_credit", credit)


async def test_both_ends_negotiate_and_use_the_compact_form(monkeypatch):
    counts = CountingCodec(monkeypatch)
    async with loopback(DoublingHandler()) as (client, _):
        assert EXT_COMPACT_META in client.extensions
        request = new_request()
        first = await client.submit(make_batch(Phase.PREFILL, [Seq(request, 3), Seq(new_request(), 2)]))
        step = await client.submit(make_batch(Phase.DECODE, [Seq(request, 1, 1, 3, 1)]))
        assert [r.status for r in first.results] == [SequenceStatus.OK] * 2
        assert step.results[0].kv_epoch_after == 2 and step.tensor.descriptor.rows == 1
    assert (counts.batches, counts.results) == (2, 2)
    # the CREDIT after the extensions ACK and the one after each RESULT
    assert counts.credits == 3


@pytest.mark.parametrize("side", ["receiver", "sender"])
async def test_a_peer_without_the_extension_keeps_canonical_json(monkeypatch, side):
    counts = CountingCodec(monkeypatch)
    others = frozenset({"multi_inflight", "timings"})
    kwargs = ({"receiver_config": ReceiverConfig(BINDING, extensions=others)} if side == "receiver"
              else {"sender_config": SenderConfig(BINDING, offer_extensions=others)})
    async with loopback(DoublingHandler(), **kwargs) as (client, _):
        assert client.extensions == others
        result = await client.submit(make_batch(Phase.PREFILL, [Seq(new_request(), 2)]))
        assert result.results[0].status is SequenceStatus.OK
    assert (counts.batches, counts.results, counts.credits) == (0, 0, 0)


class RawPeer:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.next_out = reader, writer, 0

    def send(self, data: bytes) -> None:
        self.writer.write(data)
        self.next_out += 1

    async def read(self):
        head = await self.reader.readexactly(PRELUDE_BYTES)
        body = await self.reader.readexactly(parse_prelude(head).body_bytes)
        return decode_frame(head + body).message

    async def answer(self):
        while isinstance(message := await self.read(), Credit):
            pass
        return message


async def test_a_malformed_compact_header_gets_one_error_and_the_channel_stays_aligned():
    receiver = Fnx2Receiver(ReceiverConfig(BINDING), DoublingHandler(), stage_state())
    server = await start_server(receiver)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
    peer = RawPeer(reader, writer)
    try:
        hello = await peer.read()
        peer.send(encode_frame(Ack("hello", hello.control_id, AckHello(BINDING)), 0).to_bytes())
        assert isinstance(await peer.read(), Credit)
        offer = Control("extensions", "eeeeeeee-eeee-4eee-8eee-eeeeeeeeeeee", BINDING,
                        extensions=(EXT_COMPACT_META,))
        peer.send(encode_frame(offer, peer.next_out).to_bytes())
        assert isinstance(await peer.answer(), Ack)
        good = encode_frame(make_batch(Phase.PREFILL, [Seq(new_request(), 2)]), peer.next_out,
                            compact_meta=True)
        metadata = bytearray(good.header[PRELUDE_BYTES:])
        struct.pack_into("<B", metadata, 5, 7)  # phase 7 does not exist
        peer.send(frame(1, bytes(metadata), bytes(good.payload), peer.next_out))
        error = await peer.answer()
        assert isinstance(error, ErrorMessage) and error.code == "COMPACT_METADATA"
        fine = make_batch(Phase.PREFILL, [Seq(new_request(), 2)])
        peer.send(encode_frame(fine, peer.next_out, compact_meta=True).to_bytes())
        result = await peer.answer()
        assert isinstance(result, Result) and result.results[0].status is SequenceStatus.OK
        assert receiver.unexpected_errors == 0
    finally:
        writer.close()
        server.close()
        await receiver.close()
