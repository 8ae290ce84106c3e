"""Settings every service shares, read from flags and environment (flags win).

Each service's own `config.py` embeds a `ServerConfig` and is the only place that reads the
environment; it passes `env` down here explicitly.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from libs.security.tls import TlsConfigError, TlsPaths, insecure_from_env, tls_from_env
from libs.service.channels import ChannelConfig
from libs.service.event_loop import EventLoopKind

LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class ServerConfig:
    service_kind: str
    host: str = "127.0.0.1"
    grpc_port: int = 0
    metrics_port: int = 0
    log_level: str = "info"
    grace_period_s: float = 10.0
    ready_file: str | None = None
    otlp_endpoint: str | None = None
    # Distinguishes instances of one kind, e.g. "stage-1"; part of service.name when set.
    instance: str = ""
    # mTLS material; None serves plaintext, which needs insecure=True said explicitly.
    tls: TlsPaths | None = None
    insecure: bool = False
    # Hash-chained audit log of mutating and refused RPCs; None keeps no log.
    audit_log: str | None = None
    # A plaintext listener serving only grpc.health.v1 (for probes that hold no certificate).
    health_port: int | None = None
    # With TLS: True puts the TLS front (libs.service.tls_front) on the public port, so refused
    # handshakes are answered with their reason and audited; False lets gRPC core terminate TLS
    # (refusals are then invisible to the service).
    tls_front: bool = True
    # A peer that has not completed its TLS handshake by then is refused (HANDSHAKE_TIMEOUT).
    handshake_timeout_s: float = 10.0
    # The front's own event loop (`fornax bench tls-front`: uvloop adds less latency per call).
    tls_front_loop: EventLoopKind = EventLoopKind.UVLOOP

    def client_channel(self) -> ChannelConfig:
        """How this service reaches its peers: with its own certificate when it serves mTLS.

        Read at each call, so a rotated certificate is presented on the next channel."""
        return ChannelConfig(credentials=self.tls.read() if self.tls is not None else None)

    @property
    def service_name(self) -> str:
        base = f"fornax-{self.service_kind.replace('_', '-')}"
        return f"{base}-{self.instance}" if self.instance else base


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="bind address (env FORNAX_HOST)")
    parser.add_argument("--grpc-port", type=int, help="gRPC port, 0 = OS chooses (env FORNAX_GRPC_PORT)")
    parser.add_argument("--metrics-port", type=int, help="Prometheus port (env FORNAX_METRICS_PORT)")
    parser.add_argument("--log-level", choices=LOG_LEVELS, help="env FORNAX_LOG_LEVEL")
    parser.add_argument("--grace-period-s", type=float, help="SIGTERM drain grace (env FORNAX_GRACE_PERIOD_S)")
    parser.add_argument("--ready-file", help="write bound ports here once serving (env FORNAX_READY_FILE)")
    parser.add_argument("--tls-ca", help="fleet CA bundle (env FORNAX_TLS_CA)")
    parser.add_argument("--tls-cert", help="this service's certificate (env FORNAX_TLS_CERT)")
    parser.add_argument("--tls-key", help="this service's private key (env FORNAX_TLS_KEY)")
    parser.add_argument("--insecure", action="store_true", default=None,
                        help="serve plaintext gRPC without authentication (env FORNAX_INSECURE=1)")
    parser.add_argument(
        "--audit-log", help="audit log file (env FORNAX_AUDIT_LOG; default <state dir>/audit/<service>.jsonl)"
    )
    parser.add_argument("--health-port", type=int, help="plaintext health-only gRPC port (env FORNAX_HEALTH_PORT)")


def pick(flag_value: object, env: Mapping[str, str], key: str, default: object, cast=str):
    """Flag if given, else env var if set and non-empty, else default; cast strings."""
    if flag_value is not None:
        return flag_value
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        return cast(raw)
    except ValueError as exc:
        raise SystemExit(f"invalid value for {key}: {raw!r} ({exc})") from exc


def _tls(args: argparse.Namespace, env: Mapping[str, str]) -> TlsPaths | None:
    merged = {**env}
    for flag, key in (("tls_ca", "FORNAX_TLS_CA"), ("tls_cert", "FORNAX_TLS_CERT"), ("tls_key", "FORNAX_TLS_KEY")):
        if getattr(args, flag, None):
            merged[key] = getattr(args, flag)
    try:
        return tls_from_env(merged)
    except TlsConfigError as exc:
        raise SystemExit(str(exc)) from exc


def server_config(args: argparse.Namespace, env: Mapping[str, str], kind: str, instance: str = "") -> ServerConfig:
    level = pick(args.log_level, env, "FORNAX_LOG_LEVEL", "info")
    if level not in LOG_LEVELS:
        raise SystemExit(f"invalid FORNAX_LOG_LEVEL {level!r}; expected one of {', '.join(LOG_LEVELS)}")
    return ServerConfig(
        service_kind=kind,
        host=pick(args.host, env, "FORNAX_HOST", "127.0.0.1"),
        grpc_port=pick(args.grpc_port, env, "FORNAX_GRPC_PORT", 0, int),
        metrics_port=pick(args.metrics_port, env, "FORNAX_METRICS_PORT", 0, int),
        log_level=level,
        grace_period_s=pick(args.grace_period_s, env, "FORNAX_GRACE_PERIOD_S", 10.0, float),
        ready_file=pick(args.ready_file, env, "FORNAX_READY_FILE", None),
        otlp_endpoint=env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None,
        instance=instance,
        tls=_tls(args, env),
        insecure=bool(getattr(args, "insecure", None)) or insecure_from_env(env),
        audit_log=pick(getattr(args, "audit_log", None), env, "FORNAX_AUDIT_LOG", None)
        or str(Path(env.get("FORNAX_STATE_DIR") or ".fornax") / "audit" / f"{_service_name(kind, instance)}.jsonl"),
        health_port=pick(getattr(args, "health_port", None), env, "FORNAX_HEALTH_PORT", None, int),
        tls_front=(env.get("FORNAX_TLS_FRONT") or "1").lower() not in ("0", "false", "no"),
        handshake_timeout_s=pick(None, env, "FORNAX_HANDSHAKE_TIMEOUT_S", 10.0, float),
        tls_front_loop=pick(None, env, "FORNAX_TLS_FRONT_LOOP", EventLoopKind.UVLOOP, EventLoopKind),
    )


def _service_name(kind: str, instance: str) -> str:
    return ServerConfig(service_kind=kind, instance=instance).service_name


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    add_server_flags(parser)
    return parser.parse_args(argv)
