"""Orchestrator settings: the only module of this service that reads the environment.

`OrchestratorConfig` composes the settings sections that the modules using them own (the HTTP
front's in api/, the serving core's in engine/, the route's in route/); each section parses
and writes its own FORNAX_* variables with one default per setting. A flag overrides its
variable: it is read as if the variable had its value.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from libs.common.kinds import FLOAT_DTYPES, Backend
from libs.service.config import ServerConfig, parse, server_config
from libs.service.env_settings import variables, write_env
from libs.weights.policy import POLICIES
from services.orchestrator.api.settings import HttpSettings
from services.orchestrator.engine.admission import KvFullPolicy
from services.orchestrator.engine.prefix_salt import PrefixPolicy
from services.orchestrator.engine.serving import ServingConfig
from services.orchestrator.engine.settings import DriftSettings, ServingSettings
from services.orchestrator.route.settings import BACKEND_OF_WORKER, PLAN_MODES, InprocessSettings, RouteSettings

BACKENDS = tuple(backend.value for backend in Backend)
BOUNDARY_DTYPES = tuple(dtype.value for dtype in FLOAT_DTYPES)
# The sections an orchestrator is configured by, as OrchestratorConfig names them.
SECTIONS: dict[str, type] = {"http": HttpSettings, "serving": ServingSettings, "drift": DriftSettings,
                             "route": RouteSettings, "inprocess": InprocessSettings}


@dataclass(frozen=True)
class Flag:
    """A command-line flag that sets one variable (and wins over the environment's value)."""

    flag: str
    variable: str
    help: str = ""
    choices: tuple[str, ...] | None = None
    # The value of the flag given alone (`--replan-on-change` means 1); None: it needs a value.
    bare: str | None = None

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


FLAGS = (
    Flag("--http-port", "FORNAX_HTTP_PORT", 'OpenAI-compatible HTTP port'),
    Flag("--planner-addr", "FORNAX_PLANNER_ADDR", ''),
    Flag("--artifact-builder-addr", "FORNAX_ARTIFACT_BUILDER_ADDR", ''),
    Flag("--registry-addr", "FORNAX_REGISTRY_ADDR", 'evidence registry of profiles'),
    Flag("--plan-mode", "FORNAX_PLAN_MODE", 'exploratory or deployment', PLAN_MODES),
    Flag("--stage-workers", "FORNAX_STAGE_WORKERS", 'comma-separated gRPC addresses in stage order'),
    Flag("--reference-stage-workers", "FORNAX_REFERENCE_STAGE_WORKERS", 'numpy workers serving while MAX compiles'),
    Flag("--stage-cpu-sets", "FORNAX_STAGE_CPU_SETS", "';'-separated CPU set per stage, e.g. 0;1"),
    Flag("--model-id", "FORNAX_MODEL_ID", 'public model id'),
    Flag("--inprocess-checkpoint", "FORNAX_INPROCESS_CHECKPOINT", 'serve this checkpoint with in-process stages'),
    Flag("--inprocess-stages", "FORNAX_INPROCESS_STAGES", ''),
    Flag("--inprocess-backend", "FORNAX_INPROCESS_BACKEND", '', BACKENDS),
    Flag("--checkpoint", "FORNAX_CHECKPOINT", 'install this checkpoint on the stage workers at startup'),
    Flag("--backend", "FORNAX_BACKEND",
         "stage backend for installs; worker = each worker's own", (*BACKENDS, BACKEND_OF_WORKER)),
    Flag("--boundary-dtype", "FORNAX_BOUNDARY_DTYPE", '', BOUNDARY_DTYPES),
    Flag("--max-switch", "FORNAX_MAX_SWITCH", 'measured or always: when the live switch to MAX happens'),
    Flag("--weights", "FORNAX_WEIGHTS", 'weight policy of every stage', POLICIES),
    Flag("--hop-boundary-dtypes", "FORNAX_HOP_BOUNDARY_DTYPES", 'comma-separated, one per hop'),
    Flag("--state-dir", "FORNAX_STATE_DIR", 'private state directory'),
    Flag("--stage-kv-limit-bytes", "FORNAX_STAGE_KV_LIMIT_BYTES", ''),
    Flag("--max-live-requests", "FORNAX_MAX_LIVE_REQUESTS", 'admission queue size'),
    Flag("--pipeline-spare-microbatches", "FORNAX_PIPELINE_SPARE_MICROBATCHES",
         'microbatches in flight beyond the stage count on a multi-stage route'),
    Flag("--max-tokens-per-step", "FORNAX_MAX_TOKENS_PER_STEP",
         'chunked prefill: tokens per scheduling step, decode rows first and prompt chunks in the rest; 0 = off'),
    Flag("--min-prefill-chunk-tokens", "FORNAX_MIN_PREFILL_CHUNK_TOKENS",
         'chunked prefill: smallest prompt chunk a step carries'),
    Flag("--default-max-tokens", "FORNAX_DEFAULT_MAX_TOKENS", ''),
    Flag("--default-deadline-s", "FORNAX_DEFAULT_DEADLINE_S", 'request deadline budget when none is given, 0 = none'),
    Flag("--idle-write-timeout-s", "FORNAX_IDLE_WRITE_TIMEOUT_S",
         'cancel a request whose client reads nothing for this long, 0 = never'),
    Flag("--http-send-buffer-bytes", "FORNAX_HTTP_SEND_BUFFER_BYTES",
         'kernel send buffer per HTTP connection, 0 = kernel default'),
    Flag("--recovery-timeout-s", "FORNAX_RECOVERY_TIMEOUT_S",
         'wait this long for a lost stage before ending its requests, 0 = end at once'),
    Flag("--drain-timeout-s", "FORNAX_DRAIN_TIMEOUT_S", 'how long a draining or retiring route finishes its requests'),
    Flag("--rejoin-timeout-s", "FORNAX_REJOIN_TIMEOUT_S",
         "remove a replica route whose stage worker's host is gone this long (another route serving), 0 = never"),
    Flag("--release-budget-s", "FORNAX_RELEASE_BUDGET_S", "give up releasing a request's KV after this long"),
    Flag("--http-max-body-bytes", "FORNAX_HTTP_MAX_BODY_BYTES", ''),
    Flag("--max-tokens-cap", "FORNAX_MAX_TOKENS_CAP", 'largest max_tokens accepted, 0 = context only'),
    Flag("--max-prompt-tokens", "FORNAX_MAX_PROMPT_TOKENS", 'longest prompt accepted, 0 = context only'),
    Flag("--prefix-cache", "FORNAX_PREFIX_CACHE",
         'prompt-prefix KV reuse across requests: off, tenant (only requests with the same credential '
         'share) or global', tuple(p.value for p in PrefixPolicy)),
    Flag("--kv-full", "FORNAX_KV_FULL",
         'a request whose KV blocks are not free now: queue (wait for them within its deadline) or reject '
         '(HTTP 429 KV_BLOCKS_FULL)', tuple(p.value for p in KvFullPolicy)),
    Flag("--drift-relative-bound", "FORNAX_DRIFT_RELATIVE_BOUND",
         "relative error that counts as outside the plan's prediction"),
    Flag("--drift-sustain-rounds", "FORNAX_DRIFT_SUSTAIN_ROUNDS",
         "health rounds in a row outside (or back inside) the bound before the route's calibration changes"),
    Flag("--stage-pools", "FORNAX_STAGE_POOLS",
         "comma-separated headless Services (service:port) of the stage-worker pools, stage order"),
    Flag("--replan-on-change", "FORNAX_REPLAN_ON_CHANGE",
         "re-plan onto the pools' workers when the discovered set changes and stays changed", bare="1"),
    Flag("--discovery-interval-s", "FORNAX_DISCOVERY_INTERVAL_S", "how often the pools are resolved"),
    Flag("--replan-settle-s", "FORNAX_REPLAN_SETTLE_S", "how long a changed worker set must stay the same"),
    Flag("--replan-min-interval-s", "FORNAX_REPLAN_MIN_INTERVAL_S", "least time between two re-plans"),
    Flag("--http-tls-cert", "FORNAX_HTTP_TLS_CERT", 'HTTP API certificate'),
    Flag("--http-tls-key", "FORNAX_HTTP_TLS_KEY", 'HTTP API private key'),
)


@dataclass(frozen=True)
class OrchestratorConfig:
    server: ServerConfig
    http: HttpSettings = field(default_factory=HttpSettings)
    serving: ServingSettings = field(default_factory=ServingSettings)
    drift: DriftSettings = field(default_factory=DriftSettings)
    route: RouteSettings = field(default_factory=RouteSettings)
    inprocess: InprocessSettings = field(default_factory=InprocessSettings)

    @classmethod
    def from_env(cls, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> OrchestratorConfig:
        env = os.environ if env is None else env
        args = parse(_parser(), argv)
        given = {flag.variable: str(value) for flag in FLAGS if (value := getattr(args, flag.dest)) is not None}
        merged = {**env, **given}
        sections = {name: section.from_env(merged) for name, section in SECTIONS.items()}  # type: ignore[attr-defined]
        return cls(server=server_config(args, env, "orchestrator"), **sections)

    def to_env(self) -> dict[str, str]:
        """The variables of every section (not the shared server settings)."""
        return {k: v for name in SECTIONS for k, v in write_env(getattr(self, name)).items()}


def section_variables() -> Iterator[str]:
    """Every variable the orchestrator's sections read."""
    for section in SECTIONS.values():
        yield from variables(section).values()


def _defaults() -> dict[str, Any]:
    return {variable: getattr(section(), name) for section in SECTIONS.values()
            for name, variable in variables(section).items()}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fornax-orchestrator", description="Fornax orchestrator")
    defaults = _defaults()
    for flag in FLAGS:
        default = defaults[flag.variable]
        shown = getattr(default, "value", default)
        described = f"{flag.help} " if flag.help else ""
        bare: dict[str, Any] = {"nargs": "?", "const": flag.bare} if flag.bare is not None else {}
        parser.add_argument(flag.flag, choices=flag.choices, **bare,
                            help=f"{described}(env {flag.variable}, default {shown!r})")
    return parser


def serving_config(cfg: OrchestratorConfig) -> ServingConfig:
    return cfg.serving.serving_config()


def serving_defaults() -> ServingConfig:
    """The serving settings the service runs with when no flag or environment variable sets one."""
    return ServingSettings().serving_config()

