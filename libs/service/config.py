"""Settings every service shares, read from flags and environment (flags win).

Each service's own `config.py` embeds a `ServerConfig` and is the only place that reads the
environment; it passes `env` down here explicitly.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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
    )


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    add_server_flags(parser)
    return parser.parse_args(argv)
