"""A receiver that accepts `lease_sequence` tells each new sender, in its ACK of the offer,
the lowest lease number above every one it has seen in the plan generation; a sender that
did not negotiate the extension gets no number."""

from __future__ import annotations

import dataclasses

import pytest

from libs.fnx2.channel.receiver import Fnx2Receiver, ReceiverConfig, start_server
from libs.fnx2.channel.sender import Fnx2Client, SenderConfig
from libs.fnx2.wire.messages import Phase
from tests.integration.fnx2.helpers import BINDING, DoublingHandler, Seq, make_batch, new_request, stage_state

pytestmark = pytest.mark.timeout(60)


def _numbered(number: int):
    batch = make_batch(Phase.PREFILL, [Seq(new_request(), 1)])
    return dataclasses.replace(batch, batch=dataclasses.replace(
        batch.batch, sequences=(batch.batch.sequences[0]._replace(lease_sequence=number),)))


async def test_a_second_sender_learns_where_the_generations_numbers_stand():
    receiver = Fnx2Receiver(ReceiverConfig(BINDING), DoublingHandler(), stage_state())
    server = await start_server(receiver)
    port = server.sockets[0].getsockname()[1]
    clients = []
    try:
        first = await Fnx2Client.connect("127.0.0.1", port, SenderConfig(BINDING))
        clients.append(first)
        assert first.lease_sequence_next == 0
        for number in (0, 1, 4):  # 2 and 3 skipped: still below the next number
            assert (await first.submit(_numbered(number))).results[0].kv_epoch_after == 1
        second = await Fnx2Client.connect("127.0.0.1", port, SenderConfig(BINDING))
        clients.append(second)
        assert second.lease_sequence_next == 5
        assert (await second.submit(_numbered(5))).results[0].kv_epoch_after == 1
        plain = await Fnx2Client.connect("127.0.0.1", port,
                                         SenderConfig(BINDING, offer_extensions=frozenset()))
        clients.append(plain)
        assert plain.lease_sequence_next is None
    finally:
        for client in clients:
            await client.close()
        server.close()
        await server.wait_closed()
