"""64 clients that open a stream and never read: each is dropped after the idle-write
timeout, every admission slot comes back, and a reading client is served meanwhile."""

from __future__ import annotations

import asyncio
import json
import socket
from urllib.parse import urlparse

import aiohttp
import pytest

from tests.faults.fleet import live_fleet, stream_completion

pytestmark = [pytest.mark.integration]
CLIENTS = 64
IDLE_WRITE_TIMEOUT_S = 2.0
# A bounded kernel send buffer, so a stream fills the socket within a few hundred tokens.
ENV = {"FORNAX_IDLE_WRITE_TIMEOUT_S": str(IDLE_WRITE_TIMEOUT_S),
       "FORNAX_HTTP_SEND_BUFFER_BYTES": "8192",
       "FORNAX_MAX_LIVE_REQUESTS": str(CLIENTS + 8)}


def _silent_client(api: str, index: int) -> socket.socket:
    """Sends a streaming request, then never reads: a tiny receive window fills at once."""
    url = urlparse(api)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.connect((url.hostname, url.port))
    body = json.dumps({"model": "fornax", "prompt": [5 + index % 200, 17, 42],
                       "max_tokens": 1900, "temperature": 0, "stream": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def test_clients_that_never_read_free_their_slots(tmp_path, checkpoint):
    with live_fleet(tmp_path, checkpoint, ENV) as fleet:
        sockets = [_silent_client(fleet.state.api, i) for i in range(CLIENTS)]
        try:
            fleet.wait_for(lambda: fleet.metric("fornax_orchestrator_live_requests") >= CLIENTS // 2,
                           30, "the silent clients are admitted")

            async def reader():
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                    return await stream_completion(session, fleet.state.api, [5, 6, 7], 8)

            served = asyncio.run(reader())  # the silent ones do not starve a real client
            assert served.status == 200 and served.error_code is None and served.tokens >= 1
            # Every silent client loses its request after the idle timeout; the slots return
            # while their sockets are still open.
            fleet.wait_for(lambda: fleet.metric("fornax_orchestrator_live_requests") == 0, 120,
                           "every silent client's slot is free", poll_s=0.5)
            # The greedy tiny model ends some streams early (EOS) into the buffers; the rest
            # outgrow them, block the writer and are dropped by the idle-write timeout.
            assert fleet.metric("fornax_orchestrator_idle_reader_cancellations_total") >= 1
        finally:
            for sock in sockets:
                sock.close()
        status, _ = fleet.health()
        assert status == 200
