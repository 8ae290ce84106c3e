"""Orchestrator settings: the only module of this service that reads the environment."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from libs.common.kinds import FLOAT_DTYPES, Backend, DType
from libs.service.affinity import parse_cpu_set
from libs.service.config import ServerConfig, parse, pick, server_config
from libs.weights.policy import POLICIES
from services.orchestrator.api.http_tls import HttpTlsFiles
from services.orchestrator.engine.admission import KvFullPolicy
from services.orchestrator.engine.domain import SchedulerConfig
from services.orchestrator.engine.prefix_salt import PrefixPolicy
from services.orchestrator.engine.serving import ServingConfig
from services.orchestrator.route.backend_choice import DEFAULT_ROWS, SwitchPolicy, parse_rows, parse_switch_policy

BACKENDS = tuple(backend.value for backend in Backend)
BOUNDARY_DTYPES = tuple(dtype.value for dtype in FLOAT_DTYPES)
# FORNAX_BACKEND value for an unlike fleet: each stage runs its own worker's backend.
BACKEND_OF_WORKER = "worker"
PLAN_MODES = ("exploratory", "deployment")


def _plan_mode(value: str) -> str:
    if value not in PLAN_MODES:
        raise SystemExit(f"FORNAX_PLAN_MODE must be one of {PLAN_MODES}, got {value!r}")
    return value


def _addresses(raw: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in (raw or "").split(",") if part.strip())


def _cpu_sets(raw: str | None) -> tuple[tuple[int, ...], ...]:
    return tuple(parse_cpu_set(part) for part in (raw or "").split(";") if part.strip())


@dataclass(frozen=True)
class OrchestratorConfig:
    server: ServerConfig
    http_port: int = 0
    api_key: str | None = None
    planner_addr: str | None = None
    artifact_builder_addr: str | None = None
    # The evidence registry whose profiles and calibrations installs plan from.
    registry_addr: str | None = None
    # exploratory (default) or deployment: see services.orchestrator.route.install.Fleet.plan_mode.
    plan_mode: str = "exploratory"
    # gRPC addresses of the stage workers, in stage order.
    stage_workers: tuple[str, ...] = ()
    # Public model id of the route (what /v1/models lists and requests must name).
    model_id: str = "fornax"
    # Serve a checkpoint with in-process stages at startup (development and tests); the
    # networked route is installed with InstallPlan instead.
    inprocess_checkpoint: str | None = None
    inprocess_stages: int = 1
    inprocess_backend: Backend = Backend.NUMPY
    # numpy stage workers (stage order) that serve while MAX graphs compile; empty = none.
    reference_stage_workers: tuple[str, ...] = ()
    # CPU share of each stage (stage order) for background compiles; empty = inherited.
    stage_cpu_sets: tuple[tuple[int, ...], ...] = ()
    # MAX compile cache of the in-process stages and of background compiles (the stage
    # workers' own); None = the backend's default (~/.cache/fornax/max).
    compile_cache_dir: str | None = None
    # Installed on the stage workers at startup when set (with stage_workers).
    checkpoint: str | None = None
    # None: each stage runs its own worker's backend (FORNAX_BACKEND=worker; unlike fleets).
    backend: Backend | None = Backend.NUMPY
    boundary_dtype: DType = DType.BF16
    # Per hop of the installed route; empty = boundary_dtype on every hop.
    hop_boundary_dtypes: tuple[DType, ...] = ()
    # The weight policy of every stage (libs.weights.policy), or one per stage worker (aligned
    # with stage_workers) for a fleet that mixes formats per host.
    weights_policy: str = "fp32"
    worker_weights: tuple[str, ...] = ()
    # Whether the live switch from the numpy reference route to MAX happens only where each
    # stage's measured MAX decode step beats numpy's (measured), or unconditionally (always).
    max_switch: SwitchPolicy = SwitchPolicy.MEASURED
    # The decode rows (sequences per step) the switch is measured at: the route's load.
    max_switch_rows: tuple[int, ...] = DEFAULT_ROWS
    # The orchestrator's own state (model files fetched from the artifact builder).
    state_dir: str = ".fornax/orchestrator"
    # KV bytes each stage keeps for the route; 0 leaves the stage worker's default.
    stage_kv_limit_bytes: int = 0
    # How long a draining or retiring route may take to finish what it admitted.
    drain_timeout_s: float = 60.0
    max_live_requests: int = 256
    default_max_tokens: int = 256
    output_queue_capacity: int = 16
    # Microbatches in flight beyond the stage count on a multi-stage route (see SchedulerConfig).
    pipeline_spare_microbatches: int = 1
    # Chunked prefill beside decode (see step_budget.py): each step carries every running
    # request's decode row, and prompt chunks fill the rest of this many tokens, never less
    # than min_prefill_chunk_tokens; 0 keeps whole-prompt prefill microbatches.
    max_tokens_per_step: int = 0
    min_prefill_chunk_tokens: int = 32
    # Deadline budget of a request that brings none; 0 means no deadline.
    default_deadline_s: float = 600.0
    # A client that takes no output for this long loses its request (and frees its slot).
    idle_write_timeout_s: float = 30.0
    # Kernel send buffer per HTTP client connection; 0 leaves the kernel's autotuning.
    http_send_buffer_bytes: int = 0
    # Release of a finished request gives up after this long; stage leases expire anyway.
    release_budget_s: float = 10.0
    # How long greedy requests wait for a lost stage to come back (then replay on the
    # reloaded route); 0 ends them at once with ROUTE_UNAVAILABLE.
    recovery_timeout_s: float = 30.0
    # Request limits checked before any work; 0 = only the context window bounds tokens.
    http_max_body_bytes: int = 4 << 20
    max_tokens_cap: int = 0
    max_prompt_tokens: int = 0
    # Who shares prompt-prefix KV blocks: off, tenant (per credential) or global.
    prefix_cache: str = "tenant"
    # A request whose KV blocks are not free now: queue (wait within its deadline) or reject (429).
    kv_full: str = "queue"
    # Operator-supplied HTTP certificate; otherwise the fleet certificate beyond loopback.
    http_tls: HttpTlsFiles | None = None
    # Plain HTTP beyond loopback, said explicitly (TLS terminated in front of the pod, say).
    http_insecure: bool = False
    # Drift: a stage whose measured decode service time stays more than this fraction away from
    # the plan's prediction for `drift_sustain_rounds` health rounds marks the route uncalibrated.
    drift_relative_bound: float = 0.5
    drift_sustain_rounds: int = 3

    @classmethod
    def from_env(cls, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> OrchestratorConfig:
        env = os.environ if env is None else env
        parser = argparse.ArgumentParser(prog="fornax-orchestrator", description="Fornax orchestrator")
        parser.add_argument("--http-port", type=int, help="OpenAI-compatible HTTP port (env FORNAX_HTTP_PORT)")
        parser.add_argument("--planner-addr", help="env FORNAX_PLANNER_ADDR")
        parser.add_argument("--artifact-builder-addr", help="env FORNAX_ARTIFACT_BUILDER_ADDR")
        parser.add_argument("--registry-addr", help="evidence registry of profiles (env FORNAX_REGISTRY_ADDR)")
        parser.add_argument("--plan-mode", choices=PLAN_MODES,
                            help="exploratory or deployment (env FORNAX_PLAN_MODE)")
        parser.add_argument(
            "--stage-workers", help="comma-separated gRPC addresses in stage order (env FORNAX_STAGE_WORKERS)"
        )
        parser.add_argument(
            "--reference-stage-workers",
            help="numpy workers serving while MAX compiles (env FORNAX_REFERENCE_STAGE_WORKERS)",
        )
        parser.add_argument(
            "--stage-cpu-sets", help="';'-separated CPU set per stage, e.g. 0;1 (env FORNAX_STAGE_CPU_SETS)"
        )
        parser.add_argument("--model-id", help="public model id (env FORNAX_MODEL_ID)")
        parser.add_argument(
            "--inprocess-checkpoint",
            help="serve this checkpoint with in-process stages (env FORNAX_INPROCESS_CHECKPOINT)",
        )
        parser.add_argument("--inprocess-stages", type=int, help="env FORNAX_INPROCESS_STAGES")
        parser.add_argument("--inprocess-backend", choices=BACKENDS, help="env FORNAX_INPROCESS_BACKEND")
        parser.add_argument(
            "--checkpoint", help="install this checkpoint on the stage workers at startup (env FORNAX_CHECKPOINT)"
        )
        parser.add_argument("--backend", choices=(*BACKENDS, BACKEND_OF_WORKER),
                            help="stage backend for installs; worker = each worker's own (env FORNAX_BACKEND)")
        parser.add_argument("--boundary-dtype", choices=BOUNDARY_DTYPES, help="env FORNAX_BOUNDARY_DTYPE")
        parser.add_argument("--max-switch", help="measured (default) or always: when the live switch to MAX "
                                                 "happens (env FORNAX_MAX_SWITCH)")
        parser.add_argument("--weights", choices=POLICIES, help="weight policy of every stage (env FORNAX_WEIGHTS)")
        parser.add_argument(
            "--hop-boundary-dtypes", help="comma-separated, one per hop (env FORNAX_HOP_BOUNDARY_DTYPES)"
        )
        parser.add_argument("--state-dir", help="private state directory (env FORNAX_STATE_DIR)")
        parser.add_argument("--stage-kv-limit-bytes", type=int, help="env FORNAX_STAGE_KV_LIMIT_BYTES")
        parser.add_argument("--max-live-requests", type=int, help="admission queue size (env FORNAX_MAX_LIVE_REQUESTS)")
        parser.add_argument("--pipeline-spare-microbatches", type=int,
                            help="microbatches in flight beyond the stage count on a multi-stage route "
                                 "(env FORNAX_PIPELINE_SPARE_MICROBATCHES, default 1)")
        parser.add_argument("--max-tokens-per-step", type=int,
                            help="chunked prefill: tokens per scheduling step, decode rows first and "
                                 "prompt chunks in the rest; 0 = off (env FORNAX_MAX_TOKENS_PER_STEP)")
        parser.add_argument("--min-prefill-chunk-tokens", type=int,
                            help="chunked prefill: smallest prompt chunk a step carries "
                                 "(env FORNAX_MIN_PREFILL_CHUNK_TOKENS, default 32)")
        parser.add_argument("--default-max-tokens", type=int, help="env FORNAX_DEFAULT_MAX_TOKENS")
        parser.add_argument(
            "--default-deadline-s",
            type=float,
            help="request deadline budget when none is given, 0 = none (env FORNAX_DEFAULT_DEADLINE_S)",
        )
        parser.add_argument(
            "--idle-write-timeout-s",
            type=float,
            help="cancel a request whose client reads nothing for this long, 0 = never "
            "(env FORNAX_IDLE_WRITE_TIMEOUT_S)",
        )
        parser.add_argument(
            "--http-send-buffer-bytes",
            type=int,
            help="kernel send buffer per HTTP connection, 0 = kernel default (env FORNAX_HTTP_SEND_BUFFER_BYTES)",
        )
        parser.add_argument(
            "--recovery-timeout-s",
            type=float,
            help="wait this long for a lost stage before ending its requests, 0 = end at once "
            "(env FORNAX_RECOVERY_TIMEOUT_S)",
        )
        parser.add_argument(
            "--drain-timeout-s", type=float,
            help="how long a draining or retiring route finishes its requests (env FORNAX_DRAIN_TIMEOUT_S)",
        )
        parser.add_argument(
            "--release-budget-s",
            type=float,
            help="give up releasing a request's KV after this long (env FORNAX_RELEASE_BUDGET_S)",
        )
        parser.add_argument("--http-max-body-bytes", type=int, help="env FORNAX_HTTP_MAX_BODY_BYTES")
        parser.add_argument(
            "--max-tokens-cap",
            type=int,
            help="largest max_tokens accepted, 0 = context only (env FORNAX_MAX_TOKENS_CAP)",
        )
        parser.add_argument(
            "--max-prompt-tokens",
            type=int,
            help="longest prompt accepted, 0 = context only (env FORNAX_MAX_PROMPT_TOKENS)",
        )
        parser.add_argument(
            "--prefix-cache", choices=("off", "tenant", "global"),
            help="prompt-prefix KV reuse across requests: off, tenant (default: only requests with the "
                 "same credential share) or global (env FORNAX_PREFIX_CACHE)",
        )
        parser.add_argument(
            "--kv-full", choices=("queue", "reject"),
            help="a request whose KV blocks are not free now: queue (default: wait for them within its "
                 "deadline) or reject (HTTP 429 KV_BLOCKS_FULL) (env FORNAX_KV_FULL)",
        )
        parser.add_argument("--drift-relative-bound", type=float,
                            help="relative error that counts as outside the plan's prediction "
                                 "(env FORNAX_DRIFT_RELATIVE_BOUND)")
        parser.add_argument("--drift-sustain-rounds", type=int,
                            help="health rounds in a row outside (or back inside) the bound before the "
                                 "route's calibration changes (env FORNAX_DRIFT_SUSTAIN_ROUNDS)")
        parser.add_argument("--http-tls-cert", help="HTTP API certificate (env FORNAX_HTTP_TLS_CERT)")
        parser.add_argument("--http-tls-key", help="HTTP API private key (env FORNAX_HTTP_TLS_KEY)")
        args = parse(parser, argv)
        cert = pick(args.http_tls_cert, env, "FORNAX_HTTP_TLS_CERT", None)
        key = pick(args.http_tls_key, env, "FORNAX_HTTP_TLS_KEY", None)
        if bool(cert) != bool(key):
            raise SystemExit("set both FORNAX_HTTP_TLS_CERT and FORNAX_HTTP_TLS_KEY, or neither")
        tokens_per_step = pick(args.max_tokens_per_step, env, "FORNAX_MAX_TOKENS_PER_STEP",
                               cls.max_tokens_per_step, int)
        min_chunk = pick(args.min_prefill_chunk_tokens, env, "FORNAX_MIN_PREFILL_CHUNK_TOKENS",
                         cls.min_prefill_chunk_tokens, int)
        if tokens_per_step < 0 or min_chunk < 1:
            raise SystemExit(f"invalid step budget: FORNAX_MAX_TOKENS_PER_STEP must be >= 0 (got {tokens_per_step}) "
                             f"and FORNAX_MIN_PREFILL_CHUNK_TOKENS >= 1 (got {min_chunk})")
        return cls(
            http_max_body_bytes=pick(args.http_max_body_bytes, env, "FORNAX_HTTP_MAX_BODY_BYTES", 4 << 20, int),
            max_tokens_cap=pick(args.max_tokens_cap, env, "FORNAX_MAX_TOKENS_CAP", 0, int),
            max_prompt_tokens=pick(args.max_prompt_tokens, env, "FORNAX_MAX_PROMPT_TOKENS", 0, int),
            prefix_cache=PrefixPolicy.parse(pick(args.prefix_cache, env, "FORNAX_PREFIX_CACHE",
                                                 cls.prefix_cache)).value,
            kv_full=KvFullPolicy.parse(pick(args.kv_full, env, "FORNAX_KV_FULL", cls.kv_full)).value,
            http_tls=HttpTlsFiles(Path(cert), Path(key)) if cert else None,
            http_insecure=(env.get("FORNAX_HTTP_INSECURE") or "").lower() in ("1", "true", "yes"),
            server=server_config(args, env, "orchestrator"),
            http_port=pick(args.http_port, env, "FORNAX_HTTP_PORT", cls.http_port, int),
            # The key never comes from a flag, so it stays out of process listings.
            api_key=env.get("FORNAX_API_KEY") or cls.api_key,
            planner_addr=pick(args.planner_addr, env, "FORNAX_PLANNER_ADDR", cls.planner_addr),
            artifact_builder_addr=pick(args.artifact_builder_addr, env, "FORNAX_ARTIFACT_BUILDER_ADDR",
                                       cls.artifact_builder_addr),
            registry_addr=pick(args.registry_addr, env, "FORNAX_REGISTRY_ADDR", cls.registry_addr),
            plan_mode=_plan_mode(pick(args.plan_mode, env, "FORNAX_PLAN_MODE", cls.plan_mode)),
            stage_workers=_addresses(pick(args.stage_workers, env, "FORNAX_STAGE_WORKERS", None)),
            reference_stage_workers=_addresses(pick(args.reference_stage_workers, env,
                                                    "FORNAX_REFERENCE_STAGE_WORKERS", None)),
            stage_cpu_sets=_cpu_sets(pick(args.stage_cpu_sets, env, "FORNAX_STAGE_CPU_SETS", None)),
            model_id=pick(args.model_id, env, "FORNAX_MODEL_ID", cls.model_id),
            inprocess_checkpoint=pick(args.inprocess_checkpoint, env, "FORNAX_INPROCESS_CHECKPOINT",
                                      cls.inprocess_checkpoint),
            inprocess_stages=pick(args.inprocess_stages, env, "FORNAX_INPROCESS_STAGES", cls.inprocess_stages, int),
            inprocess_backend=_choice(pick(args.inprocess_backend, env, "FORNAX_INPROCESS_BACKEND",
                                           cls.inprocess_backend), Backend, "FORNAX_INPROCESS_BACKEND"),
            compile_cache_dir=pick(None, env, "FORNAX_COMPILE_CACHE_DIR", cls.compile_cache_dir),
            checkpoint=pick(args.checkpoint, env, "FORNAX_CHECKPOINT", cls.checkpoint),
            backend=_install_backend(pick(args.backend, env, "FORNAX_BACKEND", cls.backend)),
            boundary_dtype=_choice(pick(args.boundary_dtype, env, "FORNAX_BOUNDARY_DTYPE", cls.boundary_dtype),
                                   DType, "FORNAX_BOUNDARY_DTYPE"),
            hop_boundary_dtypes=tuple(_choice(d, DType, "FORNAX_HOP_BOUNDARY_DTYPES") for d in _addresses(
                pick(args.hop_boundary_dtypes, env, "FORNAX_HOP_BOUNDARY_DTYPES", None))),
            weights_policy=_policy(pick(args.weights, env, "FORNAX_WEIGHTS", cls.weights_policy), "FORNAX_WEIGHTS"),
            worker_weights=tuple(_policy(p, "FORNAX_WORKER_WEIGHTS") for p in _addresses(
                pick(None, env, "FORNAX_WORKER_WEIGHTS", None))),
            max_switch=parse_switch_policy(pick(args.max_switch, env, "FORNAX_MAX_SWITCH", cls.max_switch.value),
                                           "FORNAX_MAX_SWITCH"),
            max_switch_rows=parse_rows(pick(None, env, "FORNAX_MAX_SWITCH_ROWS", ",".join(map(str, DEFAULT_ROWS))),
                                       "FORNAX_MAX_SWITCH_ROWS"),
            state_dir=pick(args.state_dir, env, "FORNAX_STATE_DIR", cls.state_dir),
            stage_kv_limit_bytes=pick(args.stage_kv_limit_bytes, env, "FORNAX_STAGE_KV_LIMIT_BYTES",
                                      cls.stage_kv_limit_bytes, int),
            max_live_requests=pick(args.max_live_requests, env, "FORNAX_MAX_LIVE_REQUESTS", cls.max_live_requests, int),
            pipeline_spare_microbatches=pick(args.pipeline_spare_microbatches, env,
                                             "FORNAX_PIPELINE_SPARE_MICROBATCHES",
                                             cls.pipeline_spare_microbatches, int),
            max_tokens_per_step=tokens_per_step,
            min_prefill_chunk_tokens=min_chunk,
            default_max_tokens=pick(args.default_max_tokens, env, "FORNAX_DEFAULT_MAX_TOKENS",
                                    cls.default_max_tokens, int),
            default_deadline_s=pick(args.default_deadline_s, env, "FORNAX_DEFAULT_DEADLINE_S",
                                    cls.default_deadline_s, float),
            idle_write_timeout_s=pick(args.idle_write_timeout_s, env, "FORNAX_IDLE_WRITE_TIMEOUT_S",
                                      cls.idle_write_timeout_s, float),
            http_send_buffer_bytes=pick(args.http_send_buffer_bytes, env, "FORNAX_HTTP_SEND_BUFFER_BYTES",
                                        cls.http_send_buffer_bytes, int),
            recovery_timeout_s=pick(args.recovery_timeout_s, env, "FORNAX_RECOVERY_TIMEOUT_S",
                                    cls.recovery_timeout_s, float),
            drain_timeout_s=pick(args.drain_timeout_s, env, "FORNAX_DRAIN_TIMEOUT_S", cls.drain_timeout_s, float),
            release_budget_s=pick(args.release_budget_s, env, "FORNAX_RELEASE_BUDGET_S",
                                  cls.release_budget_s, float),
            drift_relative_bound=pick(args.drift_relative_bound, env, "FORNAX_DRIFT_RELATIVE_BOUND",
                                      cls.drift_relative_bound, float),
            drift_sustain_rounds=pick(args.drift_sustain_rounds, env, "FORNAX_DRIFT_SUSTAIN_ROUNDS",
                                      cls.drift_sustain_rounds, int),
        )


def _choice(value: str, kind: type[StrEnum], variable: str):
    """An enum member from a flag or variable; a value outside the enum stops startup."""
    try:
        return kind(value)
    except ValueError:
        raise SystemExit(f"invalid {variable} {value!r}; expected one of {', '.join(kind)}") from None


def _policy(value: str, variable: str) -> str:
    """A weight policy from a flag or variable; an unknown one stops startup."""
    if value not in POLICIES:
        raise SystemExit(f"invalid {variable} {value!r}; expected one of {', '.join(POLICIES)}")
    return value


def _install_backend(value: str) -> Backend | None:
    return None if value == BACKEND_OF_WORKER else _choice(value, Backend, "FORNAX_BACKEND")


def serving_config(cfg: OrchestratorConfig) -> ServingConfig:
    return ServingConfig(scheduler=SchedulerConfig(output_queue_capacity=cfg.output_queue_capacity,
                                                   pipeline_spare_microbatches=cfg.pipeline_spare_microbatches,
                                                   max_tokens_per_step=cfg.max_tokens_per_step,
                                                   min_prefill_chunk_tokens=cfg.min_prefill_chunk_tokens),
                         max_live_requests=cfg.max_live_requests,
                         default_max_tokens=cfg.default_max_tokens,
                         default_deadline_budget_ns=int(cfg.default_deadline_s * 1e9) or None,
                         release_budget_s=cfg.release_budget_s,
                         recovery_timeout_s=cfg.recovery_timeout_s,
                         stall_timeout_s=cfg.idle_write_timeout_s or None,
                         max_tokens_cap=cfg.max_tokens_cap, max_prompt_tokens=cfg.max_prompt_tokens,
                         prefix_cache=PrefixPolicy.parse(cfg.prefix_cache),
                         kv_full=KvFullPolicy.parse(cfg.kv_full))


def serving_defaults() -> ServingConfig:
    """The serving settings the service runs with when no flag or environment variable sets one.

    Benches start from these (replay recovery, stall timeout, deadline), not from ServingConfig's
    own field defaults, so a bench measures the engine the service runs.
    """
    return serving_config(OrchestratorConfig.from_env([], {}))
