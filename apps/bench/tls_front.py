"""`fornax bench tls-front`: what the TLS front costs a call, side by side with gRPC core's TLS.

One child process serves the same servicer twice through the real server bootstrap
(`libs.service.server.build_server`, authorization interceptor included): once behind the TLS
front, once with gRPC core terminating TLS. The parent calls both over mTLS with an operator
certificate, rounds interleaved, on warm channels:

- unary: a small unary call (`GetPlanStatus`-shaped, 64-byte reply);
- stream: a `Generate`-shaped server stream of small messages (one per token).

Every figure is a physical measurement on this host (loopback, this build), not a prediction.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import multiprocessing
import os
import platform
import statistics
import tempfile
import time

import grpc

from libs.security.identity import Identity, Role
from libs.security.store import CertStore
from libs.service.event_loop import EventLoopKind
from libs.service.host import cpu_name

UNARY = "/fornax.orchestrator.v1.OrchestratorService/GetPlanStatus"
STREAM = "/fornax.orchestrator.v1.OrchestratorService/Generate"
SERVICE = "fornax.orchestrator.v1.OrchestratorService"
ORCHESTRATOR = Identity(Role.SERVICE, "orchestrator")
OPERATOR = Identity(Role.OPERATOR, "bench")


@dataclasses.dataclass(frozen=True)
class FrontBenchOptions:
    calls: int = 400  # unary calls per configuration
    streams: int = 40  # streams per configuration
    stream_messages: int = 64  # messages per stream (tokens)
    message_bytes: int = 48  # about one Generate token delta
    rounds: int = 4  # interleaved rounds the calls are split over
    front_loop: EventLoopKind = EventLoopKind.UVLOOP


def _register(options: FrontBenchOptions):
    def register(server: grpc.aio.Server) -> None:
        reply = b"x" * 64
        token = b"t" * options.message_bytes

        async def unary(request: bytes, context) -> bytes:
            return reply

        async def stream(request: bytes, context):
            for _ in range(options.stream_messages):
                yield token

        identity = (lambda b: b, lambda b: b)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
            "GetPlanStatus": grpc.unary_unary_rpc_method_handler(unary, *identity),
            "Generate": grpc.unary_stream_rpc_method_handler(stream, *identity),
        }),))

    return register


def _serve(state: str, options: FrontBenchOptions, ports, stop) -> None:
    from libs.service.config import ServerConfig
    from libs.service.server import ServiceSpec, build_server

    async def main() -> None:
        tls = CertStore(state).paths_for(ORCHESTRATOR)
        spec = ServiceSpec((SERVICE,), _register(options))
        running = []
        for front in (True, False):
            cfg = ServerConfig("orchestrator", tls=tls, tls_front=front, audit_log=None,
                               tls_front_loop=options.front_loop)
            running.append(await build_server(cfg, spec))
        ports.extend([running[0].port, running[1].port])
        while not stop.is_set():
            await asyncio.sleep(0.1)
        for server in running:
            await server.stop(0)

    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    asyncio.run(main())


def _quantiles(samples_s: list[float]) -> dict[str, float]:
    ordered = sorted(samples_s)
    return {"p50_us": round(statistics.median(ordered) * 1e6, 1),
            "p99_us": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6, 1),
            "n": len(ordered)}


def _measure(address: str, credentials: grpc.ChannelCredentials, options: FrontBenchOptions,
             rounds: int) -> tuple[list[float], list[float]]:
    unary_s: list[float] = []
    stream_s: list[float] = []
    with grpc.secure_channel(address, credentials) as channel:
        unary = channel.unary_unary(UNARY, request_serializer=None, response_deserializer=None)
        stream = channel.unary_stream(STREAM, request_serializer=None, response_deserializer=None)
        unary(b"", timeout=10)  # connect and warm
        for _ in range(options.calls // rounds):
            started = time.perf_counter()
            unary(b"", timeout=10)
            unary_s.append(time.perf_counter() - started)
        for _ in range(options.streams // rounds):
            started = time.perf_counter()
            count = sum(1 for _ in stream(b"", timeout=30))
            stream_s.append(time.perf_counter() - started)
            assert count == options.stream_messages
    return unary_s, stream_s


def run(options: FrontBenchOptions, command: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="fornax-bench-front-") as state:
        store = CertStore(state)
        now = dt.datetime.now(dt.UTC)
        store.init(now)
        store.ensure(ORCHESTRATOR, now)
        client = store.ensure(OPERATOR, now).read()
        credentials = grpc.ssl_channel_credentials(client.ca_pem, client.key_pem, client.cert_pem)
        context = multiprocessing.get_context("spawn")
        manager = context.Manager()
        ports, stop = manager.list(), manager.Event()
        child = context.Process(target=_serve, args=(state, options, ports, stop), daemon=True)
        child.start()
        try:
            deadline = time.monotonic() + 60
            while len(ports) < 2:
                if time.monotonic() > deadline or not child.is_alive():
                    raise RuntimeError("bench servers did not start")
                time.sleep(0.05)
            front_port, direct_port = ports[0], ports[1]
            samples: dict[str, tuple[list[float], list[float]]] = {"front": ([], []), "direct": ([], [])}
            for _ in range(options.rounds):
                for label, port in (("front", front_port), ("direct", direct_port)):
                    unary_s, stream_s = _measure(f"127.0.0.1:{port}", credentials, options, options.rounds)
                    samples[label][0].extend(unary_s)
                    samples[label][1].extend(stream_s)
        finally:
            stop.set()
            child.join(timeout=30)
            manager.shutdown()
    figures: dict[str, object] = {
        label: {"unary": _quantiles(u), "stream": _quantiles(s)} for label, (u, s) in samples.items()}
    for kind in ("unary", "stream"):
        front, direct = _quantiles(samples["front"][kind == "stream"]), _quantiles(samples["direct"][kind == "stream"])
        figures[f"{kind}_added_p50_us"] = round(front["p50_us"] - direct["p50_us"], 1)
        figures[f"{kind}_ratio_p50"] = round(front["p50_us"] / direct["p50_us"], 3)
    return {
        "evidence_class": "physical",
        "label": "loopback measurements on this host, one run, front vs gRPC core TLS interleaved; not predictions",
        "hardware": f"{cpu_name() or platform.machine()}, {len(os.sched_getaffinity(0))} usable CPUs",
        "load_average_1m": round(os.getloadavg()[0], 2),
        "grpc_build": f"grpcio {grpc.__version__}, Python {platform.python_version()}",
        "stream_shape": f"{options.stream_messages} messages x {options.message_bytes} B per stream",
        "front_loop": options.front_loop.value,
        "command": command,
        "figures": figures,
    }


def render(report: dict) -> str:
    lines = [f"TLS front vs gRPC core TLS ({report['label']})",
             f"  {report['hardware']}; load {report['load_average_1m']}; {report['grpc_build']}",
             f"  stream: {report['stream_shape']}; front loop: {report['front_loop']}"]
    figures = report["figures"]
    for kind in ("unary", "stream"):
        front, direct = figures["front"][kind], figures["direct"][kind]
        lines.append(f"  {kind:6s} p50 {direct['p50_us']:9.1f} us direct  {front['p50_us']:9.1f} us front  "
                     f"(+{figures[f'{kind}_added_p50_us']} us, x{figures[f'{kind}_ratio_p50']}); "
                     f"p99 {direct['p99_us']:.1f} / {front['p99_us']:.1f} us; n={front['n']}")
    lines.append(f"  command: {report['command']}")
    return "\n".join(lines)

