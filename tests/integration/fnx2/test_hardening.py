"""Malformed frames on a live channel, a sender that never waits on a failed batch, its own
code for a lost connection, and leases that expire with no message."""

import asyncio
import dataclasses

import pytest

from apps.fnx2.fuzz import frame
from libs.fnx2.channel.listener import ListenerLimits
from libs.fnx2.channel.receiver import ReceiverConfig
from libs.fnx2.channel.sender import Fnx2Client, SenderConfig
from libs.fnx2.channel.stream import FrameStream
from libs.fnx2.wire.codec import decode_frame, encode_frame
from libs.fnx2.wire.control import Control, Credit, ErrorMessage
from libs.fnx2.wire.errors import ChannelClosedError, ErrorCode, RemoteError
from libs.fnx2.wire.fields import canonical_json
from libs.fnx2.wire.messages import Kind, Phase, Result
from services.stage_worker.leases.receiver_state import ReceiverLimits
from tests.integration.fnx2.helpers import (
    BINDING,
    DoublingHandler,
    Seq,
    loopback,
    make_batch,
    new_request,
)
from tests.integration.fnx2.test_listener_limits import RawPeer, serve

pytestmark = pytest.mark.timeout(60)
TRACEPARENT = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"


def batch_frame(sequence_no: int, change) -> bytes:
    batch = make_batch(Phase.PREFILL, [Seq(new_request(), 2)])
    encoded = encode_frame(batch, sequence_no)
    meta = decode_frame(encoded.to_bytes()).message.to_meta()
    meta["sequence_no"] = sequence_no
    change(meta)
    return frame(Kind.BATCH, canonical_json(meta), bytes(encoded.payload), sequence_no)


async def test_wrong_json_types_get_an_error_frame_and_the_channel_stays_open():
    receiver, server, port = await serve(ListenerLimits())
    peer = await RawPeer.open(port)
    await peer.bind()
    cases = [(lambda m: m["tensor"].__setitem__("dtype", ["fp32"]), ErrorCode.TENSOR_CONTRACT),
             (lambda m: m["batch"].__setitem__("phase", {"a": 1}), ErrorCode.BATCH_CONTRACT),
             (lambda m: m.__setitem__("traceparent", TRACEPARENT), ErrorCode.METADATA)]
    for index, (change, code) in enumerate(cases, start=1):
        peer.writer.write(batch_frame(index, change))
        answer = await peer.read()
        assert isinstance(answer, ErrorMessage) and answer.code == code
    ack = {"operation": [], "control_id": "dddddddd-dddd-4ddd-8ddd-dddddddddddd", "sequence_no": 4}
    peer.writer.write(frame(Kind.ACK, canonical_json(ack), b"", 4))
    assert (await peer.read()).code == ErrorCode.METADATA
    peer.writer.write(batch_frame(5, lambda m: None))  # still aligned: a valid batch runs
    assert isinstance(await peer.read(), Result)
    assert receiver.unexpected_errors == 0
    server.close()


async def test_traceparent_is_accepted_once_negotiated():
    handler = DoublingHandler()
    async with loopback(handler) as (client, _):
        batch = dataclasses.replace(make_batch(Phase.PREFILL, [Seq(new_request(), 1)]),
                                    traceparent=TRACEPARENT)
        assert (await client.submit(batch)).results[0].kv_epoch_after == 1


async def _refusing_receiver(reader, writer):
    """Binds like a receiver, then answers each BATCH with an ERROR and never a CREDIT."""
    stream = FrameStream(reader, writer)
    await stream.send(Control("hello", "dddddddd-dddd-4ddd-8ddd-dddddddddddd", BINDING, ((2, 0),)))
    await stream.read()
    await stream.send(Credit(1, 1 << 20, 64, 8, 8, 1 << 30, 1 << 30))
    while True:
        got = await stream.read()
        message = got.frame.message
        if isinstance(message, Control):  # the extension offer: a plain 2.0 answer
            await stream.send(ErrorMessage("METADATA", "no extensions", message.control_id))
            continue
        await stream.send(ErrorMessage("ADMISSION", "refused", message.batch.batch_id))


async def test_submit_never_waits_for_a_credit_after_an_error():
    server = await asyncio.start_server(_refusing_receiver, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = await Fnx2Client.connect("127.0.0.1", port, SenderConfig(BINDING))
    for _ in range(3):  # each would wait forever for a credit the receiver never sends
        with pytest.raises(RemoteError) as info:
            await asyncio.wait_for(client.submit(make_batch(Phase.PREFILL, [Seq(new_request(), 1)])), 10)
        assert info.value.code is ErrorCode.ADMISSION
    await client.close()
    server.close()


async def test_a_lost_connection_has_its_own_code():
    gate = asyncio.Event()
    handler = DoublingHandler(gate=gate)
    async with loopback(handler) as (client, receiver):
        pending = asyncio.create_task(client.submit(make_batch(Phase.PREFILL, [Seq(new_request(), 1)])))
        await asyncio.sleep(0)
        while not receiver.connections:
            await asyncio.sleep(0.01)
        await receiver.close()  # the receiver's side goes away mid-batch
        with pytest.raises(ChannelClosedError) as info:
            await asyncio.wait_for(pending, 10)
        assert info.value.code is ErrorCode.CONNECTION_LOST and info.value.terminal


class Clock:
    def __init__(self) -> None:
        self.now = 10**12

    def __call__(self) -> int:
        return self.now


async def test_leases_expire_at_their_deadline_with_no_message():
    forgotten = asyncio.Event()

    class Handler(DoublingHandler):
        def forget(self, request_id, execution_lease_id):
            super().forget(request_id, execution_lease_id)
            forgotten.set()

    clock, handler = Clock(), Handler()
    config = ReceiverConfig(BINDING, listener=ListenerLimits(sweep_interval_s=0.01))
    async with loopback(handler, receiver_config=config, clock=clock) as (client, receiver):
        request = new_request()
        await client.submit(make_batch(Phase.PREFILL, [Seq(request, 2, budget_ns=5 * 10**9)]))
        assert receiver.state.live_requests == 1
        clock.now += 5 * 10**9  # the deadline passes; the sender says nothing more
        await asyncio.wait_for(forgotten.wait(), 10)
        assert handler.forgotten == [request] and receiver.state.live_requests == 0


async def test_a_quiet_sender_keeps_its_channel_past_the_idle_timeout():
    config = ReceiverConfig(BINDING, listener=ListenerLimits(idle_timeout_s=0.3))
    sender = SenderConfig(BINDING, keepalive_s=0.1)
    async with loopback(DoublingHandler(), receiver_config=config, sender_config=sender) as (client, _):
        await asyncio.sleep(1.2)  # four idle timeouts with nothing to send
        result = await client.submit(make_batch(Phase.PREFILL, [Seq(new_request(), 1)]))
        assert result.results[0].kv_epoch_after == 1
    quiet = SenderConfig(BINDING, keepalive_s=None)
    async with loopback(DoublingHandler(), receiver_config=config, sender_config=quiet) as (client, _):
        await asyncio.sleep(1.2)
        with pytest.raises(ChannelClosedError):  # without keepalives the receiver closed it
            await client.submit(make_batch(Phase.PREFILL, [Seq(new_request(), 1)]))


async def test_a_lease_whose_sender_vanished_mid_batch_expires_at_its_deadline():
    """The sender goes away while its batch executes (the receiver ends the batch's task
    with the channel): the lease is not left executing forever, and expires on time."""
    forgotten, gate = asyncio.Event(), asyncio.Event()

    class Handler(DoublingHandler):
        def forget(self, request_id, execution_lease_id):
            super().forget(request_id, execution_lease_id)
            forgotten.set()

    clock, handler = Clock(), Handler(gate=gate)
    config = ReceiverConfig(BINDING, listener=ListenerLimits(sweep_interval_s=0.01))
    async with loopback(handler, receiver_config=config, limits=ReceiverLimits(frames=8),
                        clock=clock) as (client, receiver):
        request = new_request()
        pending = asyncio.create_task(client.submit(
            make_batch(Phase.PREFILL, [Seq(request, 2, budget_ns=5 * 10**9)])))
        while not receiver.state.live_requests:
            await asyncio.sleep(0.01)
        await client.close()  # the sender vanishes with its batch executing
        with pytest.raises(ChannelClosedError):
            await asyncio.wait_for(pending, 10)
        while receiver.connections:
            await asyncio.sleep(0.01)
        assert receiver.state.credit().frames == 8  # the abandoned batch gave its credit back
        clock.now += 5 * 10**9
        await asyncio.wait_for(forgotten.wait(), 10)
        assert handler.forgotten == [request] and receiver.state.live_requests == 0
