"""The serving core's settings (FORNAX_* variables) and what the engine builds from them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from libs.service.env_settings import choice, integer, number, read_env, setting, write_env
from services.orchestrator.engine.admission import KvFullPolicy
from services.orchestrator.engine.domain import SchedulerConfig
from services.orchestrator.engine.drift import DriftPolicy
from services.orchestrator.engine.prefix_salt import PrefixPolicy
from services.orchestrator.engine.serving import ServingConfig


@dataclass(frozen=True)
class ServingSettings:
    """Admission, scheduling, deadlines, request limits and KV sharing of the serving core.

    Each default is the engine's own (ServingConfig, SchedulerConfig): the service, the Python API
    and the benches run the same engine unless a setting says otherwise."""

    max_live_requests: int = setting("FORNAX_MAX_LIVE_REQUESTS", ServingConfig.max_live_requests, integer(1))
    default_max_tokens: int = setting("FORNAX_DEFAULT_MAX_TOKENS", ServingConfig.default_max_tokens, integer(1))
    # Microbatches in flight beyond the stage count on a multi-stage route (see SchedulerConfig).
    pipeline_spare_microbatches: int = setting("FORNAX_PIPELINE_SPARE_MICROBATCHES",
                                                   SchedulerConfig.pipeline_spare_microbatches, integer(0))
    # Chunked prefill beside decode (see step_budget.py): each step carries every running
    # request's decode row, and prompt chunks fill the rest of this many tokens, never less
    # than min_prefill_chunk_tokens; 0 keeps whole-prompt prefill microbatches.
    max_tokens_per_step: int = setting("FORNAX_MAX_TOKENS_PER_STEP", SchedulerConfig.max_tokens_per_step, integer(0))
    min_prefill_chunk_tokens: int = setting("FORNAX_MIN_PREFILL_CHUNK_TOKENS",
                                                SchedulerConfig.min_prefill_chunk_tokens, integer(1))
    # Deadline budget of a request that brings none; 0 means no deadline.
    default_deadline_s: float = setting("FORNAX_DEFAULT_DEADLINE_S",
                                        (ServingConfig.default_deadline_budget_ns or 0) / 1e9, number())
    # A client that takes no output for this long loses its request (and frees its slot); 0 = never.
    idle_write_timeout_s: float = setting("FORNAX_IDLE_WRITE_TIMEOUT_S", ServingConfig.stall_timeout_s or 0.0, number())
    # Release of a finished request gives up after this long; stage leases expire anyway.
    release_budget_s: float = setting("FORNAX_RELEASE_BUDGET_S", ServingConfig.release_budget_s, number())
    # How long greedy requests wait for a lost stage to come back (then replay on the
    # reloaded route); 0 ends them at once with ROUTE_UNAVAILABLE.
    recovery_timeout_s: float = setting("FORNAX_RECOVERY_TIMEOUT_S", ServingConfig.recovery_timeout_s, number())
    # Request limits checked before any work; 0 = only the context window bounds tokens.
    max_tokens_cap: int = setting("FORNAX_MAX_TOKENS_CAP", ServingConfig.max_tokens_cap, integer(0))
    max_prompt_tokens: int = setting("FORNAX_MAX_PROMPT_TOKENS", ServingConfig.max_prompt_tokens, integer(0))
    # Who shares prompt-prefix KV blocks: off, tenant (per credential) or global.
    prefix_cache: PrefixPolicy = setting("FORNAX_PREFIX_CACHE", ServingConfig.prefix_cache,
                                         choice(PrefixPolicy, "INVALID_PREFIX_CACHE"))
    # A request whose KV blocks are not free now: queue (wait within its deadline) or reject (429).
    kv_full: KvFullPolicy = setting("FORNAX_KV_FULL", ServingConfig.kv_full, choice(KvFullPolicy, "INVALID_KV_FULL"))

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ServingSettings:
        return read_env(cls, env)

    def to_env(self, *fields: str) -> dict[str, str]:
        return write_env(self, fields)

    def serving_config(self, output_queue_capacity: int = SchedulerConfig.output_queue_capacity) -> ServingConfig:
        scheduler = SchedulerConfig(output_queue_capacity=output_queue_capacity,
                                    pipeline_spare_microbatches=self.pipeline_spare_microbatches,
                                    max_tokens_per_step=self.max_tokens_per_step,
                                    min_prefill_chunk_tokens=self.min_prefill_chunk_tokens)
        return ServingConfig(scheduler=scheduler, max_live_requests=self.max_live_requests,
                             default_max_tokens=self.default_max_tokens,
                             default_deadline_budget_ns=int(self.default_deadline_s * 1e9) or None,
                             release_budget_s=self.release_budget_s, recovery_timeout_s=self.recovery_timeout_s,
                             stall_timeout_s=self.idle_write_timeout_s or None,
                             max_tokens_cap=self.max_tokens_cap, max_prompt_tokens=self.max_prompt_tokens,
                             prefix_cache=self.prefix_cache, kv_full=self.kv_full)


@dataclass(frozen=True)
class DriftSettings:
    """A stage whose measured decode service time stays more than `relative_bound` away from the
    plan's prediction for `sustain_rounds` health rounds marks the route uncalibrated."""

    relative_bound: float = setting("FORNAX_DRIFT_RELATIVE_BOUND", DriftPolicy.relative_bound,
                                    number(0.0, exclusive=True))
    sustain_rounds: int = setting("FORNAX_DRIFT_SUSTAIN_ROUNDS", DriftPolicy.sustain_rounds, integer(1))

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> DriftSettings:
        return read_env(cls, env)

    def to_env(self, *fields: str) -> dict[str, str]:
        return write_env(self, fields)

    def policy(self) -> DriftPolicy:
        return DriftPolicy(relative_bound=self.relative_bound, sustain_rounds=self.sustain_rounds,
                           recover_rounds=self.sustain_rounds)

