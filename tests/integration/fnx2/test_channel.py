"""FNX2 channels over real loopback sockets."""

import asyncio
import dataclasses
import time

import numpy as np
import pytest

from libs.fnx2.channel.receiver import ReceiverConfig
from libs.fnx2.channel.sender import Fnx2Client, SenderConfig
from libs.fnx2.wire.control import EXT_MULTI_INFLIGHT, ChannelBinding
from libs.fnx2.wire.errors import ErrorCode, Fnx2Error, RemoteError
from libs.fnx2.wire.messages import Phase, SequenceStatus
from services.stage_worker.leases.receiver_state import ReceiverLimits
from tests.integration.fnx2.helpers import (
    BINDING,
    GENERATION,
    MANIFEST_HASH,
    PLAN_HASH,
    PLAN_ID,
    DoublingHandler,
    Seq,
    lease_for,
    loopback,
    make_batch,
    new_request,
    stage_state,
)
from tests.integration.fnx2.tls import self_signed_contexts

HOUR_NS = 3600 * 10**9
pytestmark = pytest.mark.timeout(60)


def by_request(result):
    return {r.request_id: r for r in result.results}


async def test_handshake_binds_plan_and_negotiates_extensions():
    async with loopback(DoublingHandler()) as (client, receiver):
        assert client.extensions == {"multi_inflight", "traceparent", "timings", "compact_output",
                                     "sample_logprobs", "compact_meta", "lease_sequence"}
        assert client.credit.frames == 1 and client.credit.live_requests == 1024


async def test_handshake_refuses_a_receiver_bound_elsewhere():
    other = ChannelBinding(PLAN_ID, PLAN_HASH, MANIFEST_HASH, "stage-7", GENERATION)
    with pytest.raises(Fnx2Error) as info:
        async with loopback(DoublingHandler(), receiver_config=ReceiverConfig(other)):
            pass
    assert info.value.code is ErrorCode.STALE_PLAN


async def test_prefill_then_decode_with_real_timings_and_output_rows():
    handler = DoublingHandler()
    async with loopback(handler) as (client, _):
        a, b = sorted([new_request(), new_request()])
        batch = make_batch(Phase.PREFILL, [Seq(a, 2), Seq(b, 3)])
        result = await client.submit(batch)
        assert np.array_equal(result.tensor.array, batch.tensor.array * 2)
        assert all(r.kv_epoch_after == 1 for r in result.results)
        assert all(r.timings.execute_ns > 0 and r.timings.unpack_ns > 0 for r in result.results)
        decode = make_batch(Phase.DECODE, [Seq(a, 1, 1, 2, 1), Seq(b, 1, 1, 3, 1)], seed=1)
        result = await client.submit(decode)
        assert [r.kv_epoch_after for r in result.results] == [2, 2]
        assert client.unacknowledged() == ()


async def test_exact_replay_and_sequence_conflict():
    handler = DoublingHandler()
    async with loopback(handler) as (client, _):
        a = new_request()
        batch = make_batch(Phase.PREFILL, [Seq(a, 3)])
        first = await client.submit(batch)
        again = await client.submit(make_batch(Phase.PREFILL, [Seq(a, 3)]))  # new batch id
        assert handler.executed == [a]
        assert np.array_equal(again.tensor.array, first.tensor.array)
        assert again.results[0].kv_epoch_after == 1
        conflict = await client.submit(make_batch(Phase.PREFILL, [Seq(a, 3)], seed=7))
        assert conflict.results[0].error_code == "SEQUENCE_CONFLICT" and conflict.tensor is None


async def test_stale_kv_and_tombstones_after_release():
    handler = DoublingHandler()
    async with loopback(handler) as (client, _):
        a = new_request()
        await client.submit(make_batch(Phase.PREFILL, [Seq(a, 2)]))
        stale = await client.submit(make_batch(Phase.DECODE, [Seq(a, 1, 1, 2, 0)]))
        assert stale.results[0].error_code == "STALE_KV"
        ack = await client.release(a, lease_for(a), expected_final_epoch=1)
        assert ack.released and ack.kv_epoch == 1 and ack.tombstone_present
        assert handler.forgotten == [a]
        after = await client.submit(make_batch(Phase.DECODE, [Seq(a, 1, 1, 2, 1)]))
        assert after.results[0].error_code == "RELEASED"
        replay = await client.submit(make_batch(Phase.PREFILL, [Seq(a, 2)]))
        assert replay.results[0].error_code == "RELEASED"
        assert handler.executed == [a]


async def test_cancel_is_idempotent_and_blocks_later_steps():
    async with loopback(DoublingHandler()) as (client, _):
        a, b = sorted([new_request(), new_request()])
        await client.submit(make_batch(Phase.PREFILL, [Seq(a, 1), Seq(b, 1)]))
        first = await client.cancel(a, lease_for(a))
        second = await client.cancel(a, lease_for(a))
        assert first.cancelled and second.cancelled and not first.kv_mutated
        result = by_request(await client.submit(
            make_batch(Phase.DECODE, [Seq(a, 1, 1, 1, 1), Seq(b, 1, 1, 1, 1)])))
        assert result[a].status is SequenceStatus.CANCELLED
        assert result[b].status is SequenceStatus.OK and result[b].output_row_start == 0
        assert (await client.release(a, lease_for(a))).released


async def test_credit_exhaustion_is_enforced_by_the_receiver_and_refreshed():
    limits = ReceiverLimits(live_requests=1)
    async with loopback(DoublingHandler(), limits=limits) as (
            client, _):
        a, b = new_request(), new_request()
        await client.submit(make_batch(Phase.PREFILL, [Seq(a, 1)]))
        assert client.credit.live_requests == 0
        refused = await client.submit(make_batch(Phase.PREFILL, [Seq(b, 1)]))
        assert refused.results[0].error_code == "ADMISSION"
        await client.release(a, lease_for(a))
        await client.credit_refresh()
        assert client.credit.live_requests == 1
        accepted = await client.submit(make_batch(Phase.PREFILL, [Seq(b, 1)]))
        assert accepted.results[0].status is SequenceStatus.OK


async def test_batch_over_transient_credit_is_refused_with_credit_error():
    limits = ReceiverLimits(rows=4)
    config = SenderConfig(BINDING)
    async with loopback(DoublingHandler(), limits=limits,
                        sender_config=config) as (client, _):
        client.credit = None  # bypass the sender's early check: the receiver must refuse
        with pytest.raises(RemoteError) as info:
            await client.submit(make_batch(Phase.PREFILL, [Seq(new_request(), 5)]))
        assert info.value.code is ErrorCode.CREDIT
        ok = await client.submit(make_batch(Phase.PREFILL, [Seq(new_request(), 4)]))
        assert ok.results[0].status is SequenceStatus.OK


async def test_deadline_budgets_survive_a_receiver_clock_hours_away():
    offset = 7 * HOUR_NS
    now = {"ns": time.monotonic_ns() + offset}
    clock = lambda: now["ns"]  # noqa: E731
    limits = ReceiverLimits(tombstone_ttl_ns=HOUR_NS)  # outlives the test
    async with loopback(DoublingHandler(), clock=clock, limits=limits) as (client, receiver):
        a, b = sorted([new_request(), new_request()])
        result = by_request(await client.submit(
            make_batch(Phase.PREFILL, [Seq(a, 1, budget_ns=60 * 10**9), Seq(b, 1, budget_ns=0)])))
        assert result[a].status is SequenceStatus.OK
        assert result[b].status is SequenceStatus.DEADLINE
        now["ns"] += 61 * 10**9  # the receiver's own clock passes a's local deadline
        late = await client.submit(make_batch(Phase.DECODE, [Seq(a, 1, 1, 1, 1, budget_ns=HOUR_NS)]))
        assert late.results[0].status is SequenceStatus.DEADLINE
        assert receiver.state.tombstones == 2


async def test_terminal_error_closes_and_recoverable_keeps_the_channel():
    async with loopback(DoublingHandler()) as (client, _):
        writer = client._stream._writer
        writer.write(b"FNX2" + bytes(36))  # version 0.0: terminal ABI_VERSION
        await writer.drain()
        with pytest.raises(Fnx2Error):
            for _ in range(50):
                await client.submit(make_batch(Phase.PREFILL, [Seq(new_request(), 1)]))


async def test_multiple_frames_in_flight_overlap():
    limits = ReceiverLimits(frames=4)
    handler = DoublingHandler(gate=asyncio.Event())
    async with loopback(handler, limits=limits) as (client, _):
        assert EXT_MULTI_INFLIGHT in client.extensions and client.credit.frames == 4
        batches = [make_batch(Phase.PREFILL, [Seq(new_request(), 1)], seed=i) for i in range(3)]
        tasks = [asyncio.create_task(client.submit(b)) for b in batches]
        while len(client.unacknowledged()) < 3:
            await asyncio.sleep(0)
        handler.gate.set()
        results = await asyncio.gather(*tasks)
        assert all(r.results[0].status is SequenceStatus.OK for r in results)


async def test_plain_2_0_peers_interoperate_both_ways():
    plain_receiver = ReceiverConfig(BINDING, extensions=frozenset())
    async with loopback(DoublingHandler(), receiver_config=plain_receiver) as (client, _):
        assert client.extensions == frozenset()
        result = await client.submit(make_batch(Phase.PREFILL, [Seq(new_request(), 2)]))
        assert result.results[0].timings.execute_ns == 0  # zeros, as 2.0 sends
    plain_sender = SenderConfig(BINDING, offer_extensions=frozenset())
    async with loopback(DoublingHandler(), sender_config=plain_sender) as (client, _):
        assert client.extensions == frozenset()
        result = await client.submit(make_batch(Phase.PREFILL, [Seq(new_request(), 2)]))
        assert result.results[0].status is SequenceStatus.OK


async def test_tls_channel(tmp_path):
    server_ssl, client_ssl = self_signed_contexts(tmp_path)
    async with loopback(DoublingHandler(), server_ssl=server_ssl, client_ssl=client_ssl) as (
            client, _):
        batch = make_batch(Phase.PREFILL, [Seq(new_request(), 3)])
        result = await client.submit(batch)
        assert np.array_equal(result.tensor.array, batch.tensor.array * 2)


async def test_shutdown_is_acknowledged():
    async with loopback(DoublingHandler()) as (client, _):
        await client.shutdown()
        with pytest.raises(Fnx2Error):
            await client.submit(make_batch(Phase.PREFILL, [Seq(new_request(), 1)]))


async def test_timings_are_real_durations_even_with_an_offset_clock():
    offset_clock = lambda: time.monotonic_ns() + 5 * HOUR_NS  # noqa: E731
    async with loopback(DoublingHandler(), clock=offset_clock) as (client, _):
        result = await client.submit(make_batch(Phase.PREFILL, [Seq(new_request(), 2)]))
        timings = result.results[0].timings
        assert 0 < timings.execute_ns < HOUR_NS and 0 <= timings.queue_ns < HOUR_NS
        assert 0 < timings.unpack_ns < HOUR_NS and 0 < timings.pack_ns < HOUR_NS


async def test_serve_channel_over_plain_asyncio_streams():
    """The stream API a stage worker can embed in its own server."""
    from libs.fnx2.channel.receiver import Fnx2Receiver, serve_channel

    handler = DoublingHandler()
    receiver = Fnx2Receiver(ReceiverConfig(BINDING), handler, stage_state())
    server = await asyncio.start_server(lambda r, w: serve_channel(r, w, receiver), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    client = await Fnx2Client.open(reader, writer, SenderConfig(BINDING))
    try:
        batch = make_batch(Phase.PREFILL, [Seq(new_request(), 2)])
        result = await client.submit(batch)
        assert np.array_equal(result.tensor.array, batch.tensor.array * 2)
        assert receiver.state.live_requests == 1
    finally:
        await client.close()
        server.close()
        await server.wait_closed()


async def test_large_frames_round_trip_over_the_chunked_writer():
    handler = DoublingHandler()
    async with loopback(handler) as (client, _):
        batch = make_batch(Phase.PREFILL, [Seq(new_request(), 300), Seq(new_request(), 212)],
                           width=1024)  # 2 MiB of fp32: several write chunks
        result = await client.submit(batch)
        assert result.tensor.array.shape == (512, 1024)
        assert np.array_equal(np.sort(result.tensor.array.ravel()),
                              np.sort((batch.tensor.array * 2).ravel()))


async def test_corrupted_payload_in_transit_is_a_terminal_checksum_error():
    from libs.fnx2.channel.receiver import Fnx2Receiver, start_server
    from libs.fnx2.wire.codec import PRELUDE_BYTES, decode_frame, encode_frame, parse_prelude
    from libs.fnx2.wire.control import Ack, AckHello, Credit

    server = await start_server(Fnx2Receiver(ReceiverConfig(BINDING), DoublingHandler(), stage_state()))
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def read_message():
        head = await reader.readexactly(PRELUDE_BYTES)
        body = await reader.readexactly(parse_prelude(head).body_bytes)
        return decode_frame(head + body).message

    try:
        hello = await read_message()
        writer.write(encode_frame(Ack("hello", hello.control_id, AckHello(BINDING)), 0).to_bytes())
        assert isinstance(await read_message(), Credit)
        frame = bytearray(encode_frame(make_batch(Phase.PREFILL, [Seq(new_request(), 600)],
                                                  width=512), 1).to_bytes())
        frame[-3] ^= 0x40  # one bit flipped deep in the 1.2 MiB payload
        writer.write(bytes(frame))
        await writer.drain()
        error = await read_message()
        assert error.code == "CHECKSUM"
        assert await reader.read() == b""  # terminal: the receiver closed the channel
    finally:
        writer.close()
        server.close()
        await server.wait_closed()


async def test_a_frame_other_than_the_hello_ack_ends_the_handshake_with_an_error():
    from libs.fnx2.channel.receiver import Fnx2Receiver, start_server
    from libs.fnx2.wire.codec import PRELUDE_BYTES, decode_frame, encode_frame, parse_prelude

    server = await start_server(Fnx2Receiver(ReceiverConfig(BINDING), DoublingHandler(), stage_state()))
    reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
    try:
        head = await reader.readexactly(PRELUDE_BYTES)
        await reader.readexactly(parse_prelude(head).body_bytes)
        writer.write(encode_frame(make_batch(Phase.PREFILL, [Seq(new_request(), 1)]), 0).to_bytes())
        head = await reader.readexactly(PRELUDE_BYTES)
        error = decode_frame(head + await reader.readexactly(parse_prelude(head).body_bytes))
        assert error.message.code == "STALE_PLAN"
        assert await reader.read() == b""
    finally:
        writer.close()
        server.close()
        await server.wait_closed()


TRACEPARENT = "00-" + "4bf92f3577b34da6a3ce929d0e0e4736" + "-" + "00f067aa0ba902b7" + "-01"


class TraceRecorder(DoublingHandler):
    def __init__(self):
        super().__init__()
        self.traceparents = []

    async def execute(self, work):
        self.traceparents.append(work.traceparent)
        return await super().execute(work)


async def test_traceparent_travels_when_negotiated_and_is_dropped_for_plain_peers():
    import dataclasses

    handler = TraceRecorder()
    async with loopback(handler) as (client, _):
        batch = dataclasses.replace(make_batch(Phase.PREFILL, [Seq(new_request(), 1)]),
                                    traceparent=TRACEPARENT)
        await client.submit(batch)
    plain = TraceRecorder()
    async with loopback(plain, receiver_config=ReceiverConfig(BINDING, extensions=frozenset())) as (
            client, _):
        batch = dataclasses.replace(make_batch(Phase.PREFILL, [Seq(new_request(), 1)]),
                                    traceparent=TRACEPARENT)
        assert (await client.submit(batch)).results[0].status is SequenceStatus.OK
    assert handler.traceparents == [TRACEPARENT] and plain.traceparents == [None]


async def test_cancel_during_execution_reports_inflight_and_release_waits():
    handler = DoublingHandler(gate=asyncio.Event())
    limits = ReceiverLimits(frames=2)
    async with loopback(handler, limits=limits) as (client, _):
        a = new_request()
        running = asyncio.create_task(client.submit(make_batch(Phase.PREFILL, [Seq(a, 1)])))
        while not client.unacknowledged():
            await asyncio.sleep(0)
        ack = await client.cancel(a, lease_for(a))
        assert ack.cancelled and ack.inflight and not ack.kv_mutated
        with pytest.raises(RemoteError) as info:
            await client.release(a, lease_for(a))
        assert info.value.code is ErrorCode.REQUEST_INFLIGHT
        handler.gate.set()
        await running
        assert (await client.release(a, lease_for(a))).released


async def test_large_prefill_replay_and_conflict_use_on_arrival_crcs():
    handler = DoublingHandler()
    async with loopback(handler) as (client, receiver):
        a = new_request()
        first = await client.submit(make_batch(Phase.PREFILL, [Seq(a, 400)], width=1024))
        again = await client.submit(make_batch(Phase.PREFILL, [Seq(a, 400)], width=1024))
        assert handler.executed == [a]
        assert np.array_equal(again.tensor.array, first.tensor.array)
        changed = await client.submit(make_batch(Phase.PREFILL, [Seq(a, 400)], width=1024, seed=3))
        assert changed.results[0].error_code == "SEQUENCE_CONFLICT"


async def test_a_sender_waiting_for_frame_credit_is_counted():
    from prometheus_client import REGISTRY

    def waits() -> float:
        return REGISTRY.get_sample_value("fornax_fnx2_credit_exhausted_total", {"stage": BINDING.stage_id}) or 0.0

    gate = asyncio.Event()
    handler = DoublingHandler(gate=gate)
    async with loopback(handler, limits=ReceiverLimits(frames=1)) as (client, _):
        before = waits()
        first = asyncio.create_task(client.submit(make_batch(Phase.PREFILL, [Seq(new_request(), 1)])))
        await asyncio.sleep(0)
        second = asyncio.create_task(client.submit(make_batch(Phase.PREFILL, [Seq(new_request(), 1)])))
        while waits() == before:
            await asyncio.sleep(0.01)
        gate.set()
        results = await asyncio.gather(first, second)
    assert all(r.results[0].status is SequenceStatus.OK for r in results)
    assert waits() == before + 1


@pytest.mark.parametrize("offer", ["all", "plain"])
async def test_lease_sequences_fence_without_tombstones_only_once_negotiated(offer):
    """A numbered lease that ends leaves no tombstone when the extension was negotiated; a
    plain 2.0 sender's slices go without the number and its ended leases get tombstones."""
    sender = SenderConfig(BINDING) if offer == "all" else SenderConfig(BINDING, offer_extensions=frozenset())
    async with loopback(DoublingHandler(), sender_config=sender) as (client, receiver):
        request = new_request()
        batch = make_batch(Phase.PREFILL, [Seq(request, 1)])
        numbered = dataclasses.replace(batch, batch=dataclasses.replace(
            batch.batch, sequences=(batch.batch.sequences[0]._replace(lease_sequence=0),)))
        assert (await client.submit(numbered)).results[0].kv_epoch_after == 1
        receiver.state.release(request, lease_for(request), 1)
        assert receiver.state.tombstones == (0 if offer == "all" else 1)
        stale = await client.submit(numbered)  # a late copy of the opening frame
        assert stale.results[0].error_code == ErrorCode.RELEASED


async def test_the_receiver_decides_nothing_itself_the_rules_it_is_handed_do():
    """The channel holds no lease rules of its own: one stage's rules, handed to two
    receivers, see the leases both open, and a refusal of theirs reaches the sender."""
    from libs.fnx2.channel.receiver import Fnx2Receiver, start_server
    from services.stage_worker.leases import ReceiverState

    class Draining(ReceiverState):
        draining = False

        def admit(self, batch, now_ns):
            if self.draining:
                raise Fnx2Error(ErrorCode.CREDIT, "the stage is draining")
            return super().admit(batch, now_ns)

    rules = Draining(BINDING)
    servers = [await start_server(Fnx2Receiver(ReceiverConfig(BINDING), DoublingHandler(), rules))
               for _ in range(2)]
    clients = [await Fnx2Client.connect("127.0.0.1", s.sockets[0].getsockname()[1], SenderConfig(BINDING))
               for s in servers]
    try:
        for client in clients:
            ok = await client.submit(make_batch(Phase.PREFILL, [Seq(new_request(), 2)]))
            assert ok.results[0].status is SequenceStatus.OK
        assert rules.live_requests == 2
        rules.draining = True
        with pytest.raises(RemoteError) as info:
            await clients[0].submit(make_batch(Phase.PREFILL, [Seq(new_request(), 2)]))
        assert (info.value.code, info.value.message) == (ErrorCode.CREDIT, "the stage is draining")
    finally:
        for client in clients:
            await client.close()
        for server in servers:
            server.close()
            await server.wait_closed()
