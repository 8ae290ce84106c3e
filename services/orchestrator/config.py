"""Orchestrator settings: the only module of this service that reads the environment."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from libs.service.config import ServerConfig, parse, pick, server_config
from services.orchestrator.http_tls import HttpTlsFiles


def _addresses(raw: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in (raw or "").split(",") if part.strip())


@dataclass(frozen=True)
class OrchestratorConfig:
    server: ServerConfig
    http_port: int = 0
    api_key: str | None = None
    planner_addr: str | None = None
    registry_addr: str | None = None
    artifact_builder_addr: str | None = None
    # gRPC addresses of the stage workers, in stage order.
    stage_workers: tuple[str, ...] = ()
    # Public model id of the route (what /v1/models lists and requests must name).
    model_id: str = "fornax"
    # Serve a checkpoint with in-process stages at startup (development and tests); the
    # networked route is installed with InstallPlan instead.
    inprocess_checkpoint: str | None = None
    inprocess_stages: int = 1
    inprocess_backend: str = "numpy"
    # Installed on the stage workers at startup when set (with stage_workers).
    checkpoint: str | None = None
    backend: str = "numpy"
    boundary_dtype: str = "bf16"
    artifact_store: str = ".fornax/artifacts"
    # KV bytes each stage keeps for the route; 0 leaves the stage worker's default.
    stage_kv_limit_bytes: int = 0
    drain_timeout_s: float = 60.0
    max_live_requests: int = 256
    default_max_tokens: int = 256
    output_queue_capacity: int = 16
    # Deadline budget of a request that brings none; 0 means no deadline.
    default_deadline_s: float = 0.0
    # Request limits checked before any work; 0 = only the context window bounds tokens.
    http_max_body_bytes: int = 4 << 20
    max_tokens_cap: int = 0
    max_prompt_tokens: int = 0
    # Operator-supplied HTTP certificate; otherwise the fleet certificate beyond loopback.
    http_tls: HttpTlsFiles | None = None
    # Plain HTTP beyond loopback, said explicitly (TLS terminated in front of the pod, say).
    http_insecure: bool = False

    @classmethod
    def from_env(cls, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> OrchestratorConfig:
        env = os.environ if env is None else env
        parser = argparse.ArgumentParser(prog="fornax-orchestrator", description="Fornax orchestrator")
        parser.add_argument("--http-port", type=int, help="OpenAI-compatible HTTP port (env FORNAX_HTTP_PORT)")
        parser.add_argument("--planner-addr", help="env FORNAX_PLANNER_ADDR")
        parser.add_argument("--registry-addr", help="env FORNAX_REGISTRY_ADDR")
        parser.add_argument("--artifact-builder-addr", help="env FORNAX_ARTIFACT_BUILDER_ADDR")
        parser.add_argument("--stage-workers", help="comma-separated gRPC addresses in stage order (env FORNAX_STAGE_WORKERS)")
        parser.add_argument("--model-id", help="public model id (env FORNAX_MODEL_ID)")
        parser.add_argument("--inprocess-checkpoint", help="serve this checkpoint with in-process stages (env FORNAX_INPROCESS_CHECKPOINT)")
        parser.add_argument("--inprocess-stages", type=int, help="env FORNAX_INPROCESS_STAGES")
        parser.add_argument("--inprocess-backend", choices=("numpy", "max"), help="env FORNAX_INPROCESS_BACKEND")
        parser.add_argument("--checkpoint", help="install this checkpoint on the stage workers at startup (env FORNAX_CHECKPOINT)")
        parser.add_argument("--backend", choices=("numpy", "max"), help="stage backend for installs (env FORNAX_BACKEND)")
        parser.add_argument("--boundary-dtype", choices=("bf16", "fp16", "fp32"), help="env FORNAX_BOUNDARY_DTYPE")
        parser.add_argument("--artifact-store", help="where stage artifacts are built (env FORNAX_ARTIFACT_STORE)")
        parser.add_argument("--stage-kv-limit-bytes", type=int, help="env FORNAX_STAGE_KV_LIMIT_BYTES")
        parser.add_argument("--max-live-requests", type=int, help="admission queue size (env FORNAX_MAX_LIVE_REQUESTS)")
        parser.add_argument("--default-max-tokens", type=int, help="env FORNAX_DEFAULT_MAX_TOKENS")
        parser.add_argument("--default-deadline-s", type=float, help="request deadline budget when none is given, 0 = none (env FORNAX_DEFAULT_DEADLINE_S)")
        parser.add_argument("--http-max-body-bytes", type=int, help="env FORNAX_HTTP_MAX_BODY_BYTES")
        parser.add_argument("--max-tokens-cap", type=int, help="largest max_tokens accepted, 0 = context only (env FORNAX_MAX_TOKENS_CAP)")
        parser.add_argument("--max-prompt-tokens", type=int, help="longest prompt accepted, 0 = context only (env FORNAX_MAX_PROMPT_TOKENS)")
        parser.add_argument("--http-tls-cert", help="HTTP API certificate (env FORNAX_HTTP_TLS_CERT)")
        parser.add_argument("--http-tls-key", help="HTTP API private key (env FORNAX_HTTP_TLS_KEY)")
        args = parse(parser, argv)
        cert = pick(args.http_tls_cert, env, "FORNAX_HTTP_TLS_CERT", None)
        key = pick(args.http_tls_key, env, "FORNAX_HTTP_TLS_KEY", None)
        if bool(cert) != bool(key):
            raise SystemExit("set both FORNAX_HTTP_TLS_CERT and FORNAX_HTTP_TLS_KEY, or neither")
        return cls(
            http_max_body_bytes=pick(args.http_max_body_bytes, env, "FORNAX_HTTP_MAX_BODY_BYTES", 4 << 20, int),
            max_tokens_cap=pick(args.max_tokens_cap, env, "FORNAX_MAX_TOKENS_CAP", 0, int),
            max_prompt_tokens=pick(args.max_prompt_tokens, env, "FORNAX_MAX_PROMPT_TOKENS", 0, int),
            http_tls=HttpTlsFiles(Path(cert), Path(key)) if cert else None,
            http_insecure=(env.get("FORNAX_HTTP_INSECURE") or "").lower() in ("1", "true", "yes"),
            server=server_config(args, env, "orchestrator"),
            http_port=pick(args.http_port, env, "FORNAX_HTTP_PORT", 0, int),
            # The key never comes from a flag, so it stays out of process listings.
            api_key=env.get("FORNAX_API_KEY") or None,
            planner_addr=pick(args.planner_addr, env, "FORNAX_PLANNER_ADDR", None),
            registry_addr=pick(args.registry_addr, env, "FORNAX_REGISTRY_ADDR", None),
            artifact_builder_addr=pick(args.artifact_builder_addr, env, "FORNAX_ARTIFACT_BUILDER_ADDR", None),
            stage_workers=_addresses(pick(args.stage_workers, env, "FORNAX_STAGE_WORKERS", None)),
            model_id=pick(args.model_id, env, "FORNAX_MODEL_ID", "fornax"),
            inprocess_checkpoint=pick(args.inprocess_checkpoint, env, "FORNAX_INPROCESS_CHECKPOINT", None),
            inprocess_stages=pick(args.inprocess_stages, env, "FORNAX_INPROCESS_STAGES", 1, int),
            inprocess_backend=pick(args.inprocess_backend, env, "FORNAX_INPROCESS_BACKEND", "numpy"),
            checkpoint=pick(args.checkpoint, env, "FORNAX_CHECKPOINT", None),
            backend=pick(args.backend, env, "FORNAX_BACKEND", "numpy"),
            boundary_dtype=pick(args.boundary_dtype, env, "FORNAX_BOUNDARY_DTYPE", "bf16"),
            artifact_store=pick(args.artifact_store, env, "FORNAX_ARTIFACT_STORE", ".fornax/artifacts"),
            stage_kv_limit_bytes=pick(args.stage_kv_limit_bytes, env, "FORNAX_STAGE_KV_LIMIT_BYTES", 0, int),
            max_live_requests=pick(args.max_live_requests, env, "FORNAX_MAX_LIVE_REQUESTS", 256, int),
            default_max_tokens=pick(args.default_max_tokens, env, "FORNAX_DEFAULT_MAX_TOKENS", 256, int),
            default_deadline_s=pick(args.default_deadline_s, env, "FORNAX_DEFAULT_DEADLINE_S", 0.0, float),
        )
