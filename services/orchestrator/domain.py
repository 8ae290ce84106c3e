"""Typed values that flow between the request layer, the scheduler and the pipeline."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from libs.fnx2.messages import Phase, SequenceStatus
from libs.model.sampling import SamplingParams


class FinishReason(enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"
    DEADLINE = "deadline"
    REJECTED = "rejected"  # a stage refused the request (its KV reservation)
    ERROR = "error"


@dataclass(frozen=True)
class StageLayout:
    """KV cost of one stage: MLA caches (kv_lora_rank + qk_rope_head_dim) fp32 per layer."""

    layer_start: int
    layer_end_exclusive: int
    kv_bytes_per_token: int
    # KV bytes the stage holds for this route; None leaves the limit to the stage alone.
    kv_budget_bytes: int | None = None


@dataclass(frozen=True)
class ServedModel:
    """What the route serves: the public model id, its limits and its stage layout."""

    model_id: str
    context_length: int
    vocab_size: int
    stages: tuple[StageLayout, ...]
    created_unix_s: int = 0

    @property
    def num_stages(self) -> int:
        return len(self.stages)


def mla_kv_bytes_per_token(kv_lora_rank: int, qk_rope_head_dim: int, num_layers: int) -> int:
    return (kv_lora_rank + qk_rope_head_dim) * 4 * num_layers


@dataclass(frozen=True)
class GenerationRequest:
    """A validated request in token space, ready for admission."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()
    deadline_budget_ns: int | None = None  # None: no deadline
    # W3C traceparent of the request's span; its microbatches' hops join that trace.
    traceparent: str | None = None


@dataclass(frozen=True)
class RequestSlice:
    """One request's rows in a microbatch; the stage chain turns it into an FNX2 SequenceSlice."""

    request_id: str
    request_sequence_no: int
    token_ids: tuple[int, ...]
    token_position_start: int
    kv_epoch: int
    deadline_budget_ns: int | None
    sampling: SamplingParams
    # How many tokens this request has sampled before.
    sample_index: int
    # KV the request may grow to (prompt + max_tokens): what a stage reserves at prefill.
    kv_reserve_tokens: int
    traceparent: str | None = None


@dataclass(frozen=True)
class Microbatch:
    batch_id: int
    slot: int
    phase: Phase
    slices: tuple[RequestSlice, ...]

    @property
    def row_count(self) -> int:
        return sum(len(s.token_ids) for s in self.slices)


@dataclass(frozen=True)
class RequestSliceResult:
    request_id: str
    status: SequenceStatus
    sampled_token_id: int | None
    # The KV epoch after this step. On OK every stage holds it: a pipeline whose stages
    # disagree reports the sequence as failed instead.
    kv_epoch_after: int
    error: str = ""


@dataclass(frozen=True)
class MicrobatchResult:
    batch_id: int
    sequences: tuple[RequestSliceResult, ...]


@dataclass(frozen=True)
class ReleaseReport:
    """Every stage's KV epoch for a request at the moment it released the request's KV."""

    request_id: str
    stage_epochs: tuple[int, ...]


@dataclass(frozen=True)
class RequestOutput:
    """One event for a request's reader: a text delta, and on the last event the finish."""

    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str = ""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of the continuous-batching loop."""

    # Microbatch slots kept in flight; raised to the stage count when lower.
    inflight_microbatches: int = 0
    max_sequences_per_microbatch: int = 64
    # Prefill rows per microbatch; a longer prompt is prefilled in chunks of at most this.
    max_prefill_rows_per_microbatch: int = 2048
    output_queue_capacity: int = 16
