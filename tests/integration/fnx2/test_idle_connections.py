"""100 idle connections to a receiver in its own process: its resident memory barely
moves, and every connection is closed at its timeout with its code."""

import asyncio
import struct
import subprocess
import sys

import pytest

from libs.fnx2.wire.errors import ErrorCode
from libs.fnx2.wire.messages import Kind
from tests.integration.fnx2.test_listener_limits import RawPeer

pytestmark = pytest.mark.timeout(120)
CONNECTIONS = 100
FEW_MIB = 4 * 1024 * 1024
PREAMBLE_BYTES = 16 * 1024  # what the listener admits before a peer is bound


def status_bytes(pid: int, field: str) -> int:
    """VmRSS (resident now) or VmHWM (resident peak) of a process."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field}")


def prelude(kind: int, metadata_bytes: int, payload_bytes: int) -> bytes:
    return struct.pack("!4sHHHHIQQII", b"FNX2", 2, 0, kind, 0, metadata_bytes, payload_bytes,
                       0, 0, 0)


# What each quarter of the connections does, and the code that closes it.
BEHAVIOURS = ("silent", "bound", "preamble", "large")
EXPECTED = {"silent": ErrorCode.HANDSHAKE_TIMEOUT, "bound": ErrorCode.IDLE_TIMEOUT,
            "preamble": ErrorCode.HANDSHAKE_TIMEOUT, "large": ErrorCode.FRAME_SIZE}


async def open_idle(port: int, behaviour: str) -> RawPeer:
    """silent: says nothing; bound: binds, then goes quiet; preamble: starts a frame of
    the size allowed before binding and never finishes it; large: announces a 200 MiB
    body, sends 8 KiB of it and goes quiet."""
    peer = await RawPeer.open(port)
    if behaviour == "bound":
        await peer.bind()
        return peer
    await peer.read()  # the hello
    if behaviour == "preamble":
        peer.writer.write(prelude(Kind.ACK, PREAMBLE_BYTES, 0) + b"{" * (PREAMBLE_BYTES // 2))
    elif behaviour == "large":
        peer.writer.write(prelude(Kind.BATCH, 1024, 200 * 1024 * 1024) + b"{" * 8192)
    await peer.writer.drain()
    return peer


async def closing_code(peer: RawPeer) -> str | None:
    error = await peer.read()
    closed = await peer.read() is None
    return error.code if closed and error is not None else None


async def idle_round(port: int) -> None:
    behaviours = [BEHAVIOURS[i % len(BEHAVIOURS)] for i in range(CONNECTIONS)]
    peers = [await open_idle(port, behaviour) for behaviour in behaviours]
    codes = await asyncio.gather(*(closing_code(peer) for peer in peers))
    assert codes == [EXPECTED[behaviour] for behaviour in behaviours]


async def test_idle_connections_cost_little_memory_and_are_closed_at_their_timeouts():
    process = subprocess.Popen(
        [sys.executable, "-m", "apps.fnx2.fuzz_receiver", "--handshake-timeout-s", "4",
         "--idle-timeout-s", "5"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(process.stdout.readline())
        probe = await RawPeer.open(port)  # warm the accept path once, then measure
        await probe.bind()
        probe.close()
        assert await probe.read() is None
        before = status_bytes(process.pid, "VmRSS")
        await idle_round(port)
        # The peak while all 100 were open, against the resident size before them.
        grown = status_bytes(process.pid, "VmHWM") - before
        after_first = status_bytes(process.pid, "VmRSS")
        await idle_round(port)  # memory the first round held was freed: reused, not added
        again = status_bytes(process.pid, "VmRSS") - after_first
        print(f"peak rss growth for {CONNECTIONS} idle connections: {grown} bytes; "
              f"a second round adds {again} bytes (physical)")
        assert grown < FEW_MIB
        assert again < FEW_MIB // 8
    finally:
        process.stdin.close()
        process.wait(timeout=30)
