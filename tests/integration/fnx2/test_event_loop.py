"""The FNX2 channel over uvloop: handshake, extension offer, decode round trips, echoed
activations, against a receiver process that runs uvloop too (real loopback sockets)."""

from __future__ import annotations

import asyncio
import uuid

import numpy as np
import pytest

from apps.fnx2.bench import DECODE_SEQUENCES, HIDDEN, _batch, _Peer, chunked_prefill
from apps.fnx2.bench_peer import BENCH_BINDING
from libs.fnx2.channel.sender import Fnx2Client, SenderConfig
from libs.fnx2.channel.stream import _keeps_unsent_views
from libs.fnx2.wire.messages import Phase
from libs.service.event_loop import EventLoopKind, run


def test_run_uses_the_chosen_loop_implementation():
    async def loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert run(loop_module(), EventLoopKind.UVLOOP).startswith("uvloop")
    assert run(loop_module(), EventLoopKind.ASYNCIO).startswith("asyncio")


@pytest.mark.parametrize("kind", list(EventLoopKind))
def test_decode_round_trips_echo_the_activation(kind):
    peer = _Peer("fnx2", kind)

    async def exchange() -> list[np.ndarray]:
        client = await Fnx2Client.connect("127.0.0.1", peer.port, SenderConfig(BENCH_BINDING))
        requests = [str(uuid.uuid4()) for _ in range(DECODE_SEQUENCES)]
        rows = []
        try:
            start = np.full((DECODE_SEQUENCES, HIDDEN), 0x3F80, dtype=np.uint16)
            await client.submit(_batch(Phase.PREFILL, 1, requests, 0, start))
            for step in range(1, 6):
                values = np.full((DECODE_SEQUENCES, HIDDEN), 0x3F80 + step, dtype=np.uint16)
                result = await client.submit(_batch(Phase.DECODE, 1, requests, step, values))
                assert all(item.status.value == "ok" for item in result.results)
                assert [item.kv_epoch_after for item in result.results] == [step + 1] * DECODE_SEQUENCES
                rows.append(np.asarray(result.tensor.array).copy())
            return rows
        finally:
            await client.close()

    try:
        echoed = run(exchange(), kind)
    finally:
        peer.close()
    for step, rows in enumerate(echoed, start=1):
        assert rows.shape == (DECODE_SEQUENCES, HIDDEN)
        assert (rows.view(np.uint16) == 0x3F80 + step).all()


@pytest.mark.parametrize("kind", list(EventLoopKind))
def test_16_mib_frames_in_flight_arrive_whole_on_either_loop(kind):
    """uvloop gets each payload in one write, the standard library's transport in 1 MiB
    writes; either way the receiver's CRC32C and finiteness checks on arrival pass and
    every sequence executes."""
    peer = _Peer("fnx2", kind)
    batches = chunked_prefill(6)

    async def exchange():
        client = await Fnx2Client.connect("127.0.0.1", peer.port, SenderConfig(BENCH_BINDING))
        try:
            one_write = _keeps_unsent_views(client._stream._writer)
            return one_write, await asyncio.gather(*(client.submit(b) for b in batches))
        finally:
            await client.close()

    try:
        one_write, results = run(exchange(), kind)
    finally:
        peer.close()
    assert one_write is (kind is EventLoopKind.UVLOOP)
    assert len(results) == len(batches)
    for batch, result in zip(batches, results, strict=True):
        assert all(item.status.value == "ok" for item in result.results)
        assert result.tensor.descriptor.rows == batch.batch.input_row_count
