"""Server bootstrap shared by every service: one grpc.aio server with the error, tracing and
authorization interceptors, gRPC health, reflection, a Prometheus /metrics endpoint, and a
graceful SIGTERM.

The port serves TLS unless the configuration says insecure explicitly; with neither, the server
refuses to start. By default the TLS front (`tls_front`) owns the public port and the gRPC
server listens plaintext on an ephemeral loopback port behind it, so a refused handshake is
answered with its reason and audited; a fleet client certificate is then required per RPC by
the authorization interceptor. SIGHUP, or a change of the certificate files, reloads the
certificate (and trust bundle) for new connections.

A service describes itself with a `ServiceSpec`; `run_service` owns the process lifecycle.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
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

from libs.security.audit import ANONYMOUS, AuditEvent, AuditLog, AuditLogBroken, open_audit_log
from libs.security.handshake import HandshakeRefusal
from libs.security.tls import ReloadingServerCredentials
from libs.service.authz_interceptor import AuthzInterceptor
from libs.service.channels import MAX_MESSAGE_BYTES
from libs.service.config import ServerConfig
from libs.service.interceptors import ErrorInterceptor
from libs.service.logs import configure_logging
from libs.service.tls_front import FrontSslContext, PeerTable, RefusalSink, TlsFront
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
    # Bearer token that grants serving access (Generate, Cancel) besides a client certificate.
    api_key: str | None = None


class InsecureNotChosen(RuntimeError):
    """Neither TLS material nor an explicit insecure choice: the server will not start."""


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    spec: ServiceSpec
    credentials: ReloadingServerCredentials | None = None
    health_server: grpc.aio.Server | None = None
    health_port: int | None = None
    front: TlsFront | None = None
    # The gRPC server's own port behind the front (loopback, plaintext); None without a front.
    inner_port: int | None = None

    def request_reload(self) -> None:
        if self.front is not None:
            self.front.request_reload()
        if self.credentials is not None:
            self.credentials.request_reload()

    async def stop(self, grace: float | None) -> None:
        """Stop taking connections, let calls finish within grace, then close everything."""
        if self.front is not None:
            await self.front.stop_accepting()
        await self.server.stop(grace)
        if self.front is not None:
            await self.front.close()
        if self.health_server is not None:
            await self.health_server.stop(grace=None)

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *self.spec.service_names):
            await self.health.set(name, status)


def _interceptors(cfg: ServerConfig, spec: ServiceSpec, audit: AuditLog | None,
                  peers: PeerTable | None) -> list:
    enforce = cfg.tls is not None
    return [*server_interceptors(), ErrorInterceptor(cfg.service_kind),
            AuthzInterceptor(cfg.service_kind, audit, spec.api_key, enforce=enforce, peers=peers)]


def _audit_refusal(audit: AuditLog | None, service: str) -> RefusalSink:
    empty = hashlib.sha256(b"").hexdigest()

    def record(reason: HandshakeRefusal, peer: str, rpc: str) -> None:
        if audit is not None:
            audit.append(AuditEvent(
                time=dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"), caller=ANONYMOUS,
                rpc=rpc, args_sha256=empty, result=f"UNAUTHENTICATED:{reason.value}", service=service))

    return record


def _bind(server: grpc.aio.Server, cfg: ServerConfig) -> tuple[int, ReloadingServerCredentials | None]:
    address = f"{cfg.host}:{cfg.grpc_port}"
    if cfg.tls is not None and cfg.tls_front:
        return server.add_insecure_port("127.0.0.1:0"), None
    if cfg.tls is not None:
        credentials = ReloadingServerCredentials(cfg.tls)
        return server.add_secure_port(address, credentials.credentials), credentials
    if not cfg.insecure:
        raise InsecureNotChosen(
            "TLS is on by default: set FORNAX_TLS_CA, FORNAX_TLS_CERT and FORNAX_TLS_KEY "
            "(see `fornax certs`), or choose plaintext with --insecure / FORNAX_INSECURE=1")
    structlog.get_logger().warning(
        "insecure_plaintext", detail="gRPC serves plaintext with no authentication or authorization")
    return server.add_insecure_port(address), None


async def _health_only_server(cfg: ServerConfig, servicer) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port(f"{cfg.host}:{cfg.health_port}")
    if port == 0:
        raise OSError(f"could not bind the health port on {cfg.host}:{cfg.health_port}")
    await server.start()
    return server, port


async def build_server(cfg: ServerConfig, spec: ServiceSpec) -> RunningServer:
    """Build and start a server bound to cfg.host:cfg.grpc_port (0 = OS chooses)."""
    audit = open_audit_log(cfg.audit_log) if cfg.audit_log else None
    peers = PeerTable() if cfg.tls is not None and cfg.tls_front else None
    server = grpc.aio.server(
        interceptors=_interceptors(cfg, spec, audit, peers),
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
    port, credentials = _bind(server, cfg)
    if port == 0:
        raise OSError(f"could not bind gRPC on {cfg.host}:{cfg.grpc_port}")
    await server.start()
    running = RunningServer(server, port, health_servicer, spec, credentials)
    if peers is not None:
        assert cfg.tls is not None
        front = TlsFront(cfg.host, cfg.grpc_port, port, FrontSslContext(cfg.tls), peers,
                         _audit_refusal(audit, cfg.service_kind), handshake_timeout_s=cfg.handshake_timeout_s,
                         loop_kind=cfg.tls_front_loop)
        running.front, running.inner_port = front, port
        running.port = await front.start()
    if cfg.health_port is not None:
        running.health_server, running.health_port = await _health_only_server(cfg, health_servicer)
    await running.set_serving(True)
    return running


def _reload_on_hup(running: RunningServer) -> Callable[[], None]:
    def reload() -> None:
        running.request_reload()
        structlog.get_logger().info("certificate_reload_requested", signal="SIGHUP")

    return reload


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
    if running.health_port is not None:
        ports["health"] = running.health_port
    if running.inner_port is not None:
        ports["grpc_inner"] = running.inner_port
    if running.credentials is not None or running.front is not None:
        loop.add_signal_handler(signal.SIGHUP, _reload_on_hup(running))
    log.info("service_serving", host=cfg.host, tls=cfg.tls is not None, **ports)
    if cfg.ready_file:
        _write_ready_file(cfg.ready_file, ports)
    await stop.wait()
    log.info("service_stopping", grace_period_s=cfg.grace_period_s)
    await running.set_serving(False)
    try:
        if spec.on_drain:
            await asyncio.wait_for(spec.on_drain(), timeout=cfg.grace_period_s)
    except TimeoutError:
        log.warning("drain_timed_out", grace_period_s=cfg.grace_period_s)
    await running.stop(grace=cfg.grace_period_s)
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
    except InsecureNotChosen as exc:
        structlog.get_logger().error("tls_not_configured", detail=str(exc))
        return 2
    except AuditLogBroken as exc:
        structlog.get_logger().error("audit_log_broken", detail=str(exc))
        return 2
    finally:
        if provider is not None:
            provider.shutdown()
    return 0
