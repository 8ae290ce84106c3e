"""Server bootstrap shared by every service: one grpc.aio server with the error and tracing
interceptors, gRPC health, reflection, a Prometheus /metrics endpoint, and a graceful SIGTERM.

A service describes itself with a `ServiceSpec`; `run_service` owns the process lifecycle.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import start_http_server

from libs.service.channels import MAX_MESSAGE_BYTES
from libs.service.config import ServerConfig
from libs.service.interceptors import ErrorInterceptor
from libs.service.logs import configure_logging
from libs.service.tracing import configure_tracing, server_interceptors


@dataclass
class ServiceSpec:
    """What one service contributes to the shared server."""

    # Fully qualified gRPC service names, e.g. "fornax.planner.v1.PlannerService".
    service_names: tuple[str, ...]
    # Registers servicers on the server.
    register: Callable[[grpc.aio.Server], None]
    # Awaited after the service is marked NOT_SERVING and before the server stops.
    on_drain: Callable[[], Awaitable[None]] | None = None
    # Awaited after the server stopped.
    on_stop: Callable[[], Awaitable[None]] | None = None
    # Extra ports reported in the ready file, e.g. {"http": 8000, "data_plane": 7070}.
    extra_ports: dict[str, int] = field(default_factory=dict)


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    spec: ServiceSpec

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *self.spec.service_names):
            await self.health.set(name, status)


async def build_server(cfg: ServerConfig, spec: ServiceSpec) -> RunningServer:
    """Build and start a server bound to cfg.host:cfg.grpc_port (0 = OS chooses)."""
    server = grpc.aio.server(
        interceptors=[*server_interceptors(), ErrorInterceptor(cfg.service_kind)],
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ],
    )
    spec.register(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*spec.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    port = server.add_insecure_port(f"{cfg.host}:{cfg.grpc_port}")
    if port == 0:
        raise OSError(f"could not bind gRPC on {cfg.host}:{cfg.grpc_port}")
    await server.start()
    running = RunningServer(server, port, health_servicer, spec)
    await running.set_serving(True)
    return running


def _write_ready_file(path: str, ports: dict[str, int]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump({**ports, "pid": os.getpid()}, handle)
    os.replace(tmp, path)


async def serve(cfg: ServerConfig, make_spec: Callable[[], Awaitable[ServiceSpec]]) -> None:
    """Run until SIGTERM/SIGINT, then mark not-serving, drain and stop within the grace period."""
    log = structlog.get_logger()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    metrics_server, _ = start_http_server(cfg.metrics_port, addr=cfg.host)
    spec = await make_spec()
    running = await build_server(cfg, spec)
    ports = {"grpc": running.port, "metrics": metrics_server.server_port, **spec.extra_ports}
    log.info("service_serving", host=cfg.host, **ports)
    if cfg.ready_file:
        _write_ready_file(cfg.ready_file, ports)
    await stop.wait()
    log.info("service_stopping", grace_period_s=cfg.grace_period_s)
    await running.set_serving(False)
    try:
        if spec.on_drain:
            await asyncio.wait_for(spec.on_drain(), timeout=cfg.grace_period_s)
    except asyncio.TimeoutError:
        log.warning("drain_timed_out", grace_period_s=cfg.grace_period_s)
    await running.server.stop(grace=cfg.grace_period_s)
    if spec.on_stop:
        await spec.on_stop()
    metrics_server.shutdown()
    log.info("service_stopped")


def run_service(cfg: ServerConfig, make_spec: Callable[[], Awaitable[ServiceSpec]]) -> int:
    """Process entry point shared by every service's __main__."""
    configure_logging(cfg.service_name, cfg.log_level)
    provider = configure_tracing(cfg.service_name, cfg.otlp_endpoint, cfg.instance)
    try:
        asyncio.run(serve(cfg, make_spec))
    finally:
        provider.shutdown()
    return 0
