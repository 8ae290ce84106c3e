"""Services of a fleet host: the delaying relay (bytes into a delayed host arrive intact, in order,
and no sooner than the declared delay), loopback binding behind it, and a GPU host's device."""

from __future__ import annotations

import asyncio
import time

from apps.fleet.netns_compose import LOOPBACK, _process
from apps.fleet.netns_plan import CgroupVersion, make_plan
from apps.fleet.relay import run
from apps.fleet.spec import parse_fleet_spec

DELAY_S = 0.2


async def _echo_server() -> tuple[asyncio.Server, int]:
    async def echo(reader, writer):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_bytes_into_the_host_wait_the_delay_and_arrive_in_order():
    async def main():
        echo, echo_port = await _echo_server()
        listen = _free_port()
        relay = asyncio.create_task(run([(("127.0.0.1", listen), ("127.0.0.1", echo_port))], DELAY_S))
        await asyncio.sleep(0.1)
        reader, writer = await asyncio.open_connection("127.0.0.1", listen)
        payload = bytes(range(256)) * 4096  # 1 MiB, many chunks
        started = time.monotonic()
        writer.write(payload)
        await writer.drain()
        writer.write_eof()
        received = await reader.readexactly(len(payload))
        elapsed = time.monotonic() - started
        writer.close()
        relay.cancel()
        echo.close()
        return received == payload, elapsed

    intact, elapsed = asyncio.run(main())
    assert intact
    assert elapsed >= DELAY_S  # a lower bound only: the delay is added, never skipped


def test_a_delayed_host_binds_loopback_and_advertises_its_fabric_address():
    spec = parse_fleet_spec({
        "version": 1, "control_host": "a",
        "hosts": [{"name": "a", "backend": "numpy", "cpu_cores": 1, "memory_limit": "1GiB",
                   "link": {"rate": "1Gbit/s"}},
                  {"name": "b", "backend": "numpy", "cpu_cores": 1, "memory_limit": "1GiB",
                   "link": {"rate": "1Gbit/s", "delay": "5ms"}}],
    }, "0" * 64)
    plan = make_plan(spec, "abcdef", CgroupVersion.V1, (0, 1))
    plain, delayed = (_process(h, "stage_worker_0", "stage_worker", {}) for h in plan.hosts)
    assert plain.bind_host is None and plain.on_ready is None
    assert delayed.bind_host == LOOPBACK and delayed.host == plan.hosts[1].address
    assert delayed.env["FORNAX_ADVERTISE_HOST"] == plan.hosts[1].address
    assert spec.hosts[1].link.delay_ns == 5_000_000


def test_a_gpu_host_worker_sees_only_its_gpu(tmp_path):
    from apps.fleet.launcher import FleetOptions
    from apps.fleet.netns_compose import worker_process

    spec = parse_fleet_spec({
        "version": 1, "control_host": "a",
        "hosts": [{"name": "a", "backend": "max", "device": "gpu:1", "cpu_cores": 2, "memory_limit": "8GiB",
                   "link": {"rate": "10Gbit/s"}}],
    }, "0" * 64)
    (host,) = make_plan(spec, "abcdef", CgroupVersion.V1, (0, 1)).hosts
    env = worker_process(FleetOptions(state_dir=tmp_path), host, 0).env
    assert (env["FORNAX_DEVICE"], env["CUDA_VISIBLE_DEVICES"], env["FORNAX_BACKEND"]) == ("gpu", "1", "max")
    assert env["OMP_NUM_THREADS"] == "2"
