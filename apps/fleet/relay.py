"""A delaying TCP relay: what a fleet host's link uses for added one-way delay (no netem here).

A host with `link.delay` binds its services to loopback inside its namespace; for each port a
relay listens on the host's fabric address and forwards to loopback. Bytes travelling into the
host are released `delay` after they arrived, in order; bytes leaving it pass straight through.
So every connection into the host, gRPC, HTTP or FNX2, sees the declared one-way delay.

    python -m apps.fleet.relay --delay-ms 5 198.18.3.11:41000=127.0.0.1:41000 ...
"""

from __future__ import annotations

import argparse
import asyncio
import signal

CHUNK_BYTES = 64 * 1024
# Chunks held per direction before the reader stops reading (backpressure to the sender).
QUEUE_CHUNKS = 256


async def delayed_copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    """Copy until EOF, each chunk written no sooner than `delay_s` after it was read."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUE_CHUNKS)

    async def read() -> None:
        while data := await reader.read(CHUNK_BYTES):
            await queue.put((loop.time() + delay_s, data))
        await queue.put((loop.time() + delay_s, b""))

    async def write() -> None:
        while True:
            due, data = await queue.get()
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    await asyncio.gather(read(), write())


async def _serve_pair(listen: tuple[str, int], target: tuple[str, int], delay_s: float) -> asyncio.Server:
    async def on_client(client_reader, client_writer) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*target)
        except OSError:
            client_writer.close()
            return
        try:
            await asyncio.gather(delayed_copy(client_reader, upstream_writer, delay_s),
                                 delayed_copy(upstream_reader, client_writer, 0.0))
        except (ConnectionError, OSError):
            pass
        finally:
            for w in (client_writer, upstream_writer):
                w.close()

    return await asyncio.start_server(on_client, *listen)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def run(pairs: list[tuple[tuple[str, int], tuple[str, int]]], delay_s: float) -> None:
    servers = [await _serve_pair(listen, target, delay_s) for listen, target in pairs]
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    for server in servers:
        server.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="fornax-relay", description=__doc__.splitlines()[0])
    parser.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("pairs", nargs="+", help="LISTEN_HOST:PORT=TARGET_HOST:PORT")
    args = parser.parse_args(argv)
    pairs = [tuple(_address(side) for side in pair.split("=", 1)) for pair in args.pairs]
    asyncio.run(run(pairs, args.delay_ms / 1000))


if __name__ == "__main__":
    main()
