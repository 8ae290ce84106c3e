"""Typed values that flow between the request layer, the scheduler and the pipeline."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from libs.fnx2 import Phase, SequenceResult, SequenceSlice, SequenceStatus, Timings
from libs.model.kv_blocks import KV_BLOCK_TOKENS, kv_format
from libs.model.logprobs import TokenLogprobs
from libs.model.sampling import SamplingParams


class FinishReason(enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"
    DEADLINE = "deadline"
    REJECTED = "rejected"  # a stage refused the request (its KV reservation)
    UNAVAILABLE = "unavailable"  # the route lost a stage or its data plane mid-request
    ERROR = "error"


@dataclass(frozen=True)
class StageLayout:
    """KV cost of one stage: MLA caches (kv_lora_rank + qk_rope_head_dim) per layer, in the
    stages' KV dtype (fp32 unless the route names another; `mla_kv_bytes_per_token`)."""

    layer_start: int
    layer_end: int
    kv_bytes_per_token: int
    # KV bytes the stage holds for this route; None leaves the limit to the stage alone.
    kv_budget_bytes: int | None = None
    # Paged KV: tokens per block, and the blocks the stage holds when it reported them (its
    # KV dtype may differ from the fp32 bytes above); None derives them from the budget.
    kv_block_tokens: int = KV_BLOCK_TOKENS
    kv_blocks_total: int | None = None

    @property
    def kv_capacity_tokens(self) -> int | None:
        """Tokens one sequence could hold if it had the stage's whole pool: its reported
        blocks, else its budget's whole blocks; None when neither bounds it."""
        if self.kv_blocks_total is not None:
            return self.kv_blocks_total * self.kv_block_tokens
        if self.kv_budget_bytes is None:
            return None
        return max(1, self.kv_budget_bytes // (self.kv_block_tokens * self.kv_bytes_per_token)) * self.kv_block_tokens


class EvidenceClass(enum.Enum):
    """How far a figure or a route's outputs can be trusted (the seed's classes)."""

    CONTRACT = "contract"
    REFERENCE = "reference"   # the float32 numpy reference backend
    PHYSICAL = "physical"     # a production backend on named hardware
    PREDICTION = "prediction"  # a cost-model figure


@dataclass(frozen=True)
class RouteCard:
    """Provenance of what is served: model snapshot, plan, and the evidence behind them."""

    model_snapshot: str = ""
    plan_id: str = ""
    plan_mode: str = ""  # the planner's mode, or "in-process" without a planner
    backend: str = ""
    boundary_dtype: str = ""
    # The execution's class: reference for the numpy backend, physical for MAX.
    execution_evidence: EvidenceClass = EvidenceClass.REFERENCE
    # The plan's time figures: cost-model predictions until a route is qualified.
    plan_evidence: EvidenceClass = EvidenceClass.PREDICTION
    # The weight policy of each stage, from its verified manifest (part of the stage contract).
    stage_weights: tuple[str, ...] = ()
    # Each stage's block-format activations, as its worker reported them at load ("" off MAX).
    stage_max_activations: tuple[str, ...] = ()
    # Each stage's build-time weight conversions, summarized (`libs.artifacts.conversions`).
    stage_conversions: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class ServedModel:
    """What the route serves: the public model id, its limits and its stage layout."""

    model_id: str
    context_length: int
    vocab_size: int
    stages: tuple[StageLayout, ...]
    created_unix_s: int = 0
    card: RouteCard = RouteCard()

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def servable_context(self) -> tuple[int, str]:
        """The longest sequence the route can serve, and which bound sets it: the model's
        positions, or the smallest stage KV capacity for one sequence ("stage N KV")."""
        best, bound = self.context_length, "model positions"
        for index, stage in enumerate(self.stages):
            tokens = stage.kv_capacity_tokens
            if tokens is not None and tokens < best:
                best, bound = tokens, f"stage {index} KV"
        return best, bound


def mla_kv_bytes_per_token(kv_lora_rank: int, qk_rope_head_dim: int, num_layers: int,
                           kv_dtype: str = "fp32") -> int:
    """KV bytes a token costs on a stage of `num_layers` layers holding `kv_dtype`
    (libs.model.kv_blocks.KV_DTYPES): its block bytes over its block tokens, rounded up to a
    whole byte for fp8 (whose per-block scales make it a quarter byte per layer)."""
    block = kv_format(kv_dtype).block_bytes(kv_lora_rank, qk_rope_head_dim, num_layers)
    return -(-block // KV_BLOCK_TOKENS)


@dataclass(frozen=True)
class GenerationRequest:
    """A validated request in token space, ready for admission."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()
    # Ids that end the output like an end-of-sequence token (not part of the text).
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False  # end-of-sequence ids are ordinary tokens (vLLM's extension)
    deadline_budget_ns: int | None = None  # None: no deadline
    # W3C traceparent of the request's span; its microbatches' hops join that trace.
    traceparent: str | None = None
    # Prefix-cache salt (services.orchestrator.engine.prefix_salt); None: no prefix reuse.
    prefix_salt: bytes | None = None


# FNX2 carries a deadline as a remaining budget and 0 means expired, so a request without a
# deadline travels with a day-long budget.
NO_DEADLINE_BUDGET_NS = 24 * 3600 * 10**9


@dataclass(frozen=True)
class RequestSlice:
    """One request's rows in a microbatch: the FNX2 `SequenceSlice` that travels to the stages,
    with what travels beside it (its token ids) and what stays with the orchestrator.

    The scheduler fills every field of `sequence` but the execution lease, which belongs to the
    route that runs it: the pipeline sets it (`with_lease`). Its rows start at
    `sequence.input_row_start` among the microbatch's rows, in slice order.
    """

    sequence: SequenceSlice
    token_ids: tuple[int, ...]
    sampling: SamplingParams
    # How many tokens this request has sampled before.
    sample_index: int
    # KV the request may grow to (prompt + max_tokens): what a stage reserves at prefill.
    kv_reserve_tokens: int
    traceparent: str | None = None
    # On the slice that opens the lease: the prefix-cache salt (None: no reuse).
    prefix_salt: bytes | None = None
    # On that slice, when the prompt is prefilled in chunks: the prompt tokens after this chunk.
    # They are hashed with it, and a reused prefix of n tokens moves the chunk n tokens into
    # them (the chunk still computes at most len(token_ids) rows; `consumed_tokens`).
    prefix_tail: tuple[int, ...] = ()

    @property
    def request_id(self) -> str:
        return self.sequence.request_id

    @property
    def prefix_token_ids(self) -> tuple[int, ...]:
        """The prompt tokens the prefix query hashes: this chunk and the rest of the prompt."""
        return self.token_ids + self.prefix_tail

    def consumed_tokens(self, cached_tokens: int) -> int:
        """Prompt tokens this slice advances the request by when every stage held
        `cached_tokens` of them: the reused ones plus the rows it computed."""
        return min(len(self.token_ids) + len(self.prefix_tail), cached_tokens + len(self.token_ids))

    def computed_token_ids(self, cached_tokens: int) -> tuple[int, ...]:
        """The tokens this slice feeds the route after skipping `cached_tokens` reused ones."""
        return self.prefix_token_ids[cached_tokens : self.consumed_tokens(cached_tokens)]

    def with_lease(self, execution_lease_id: str) -> RequestSlice:
        # Built directly (not dataclasses.replace, NamedTuple._replace): it runs for every slice of every step.
        q = self.sequence
        sequence = SequenceSlice(q.request_id, q.request_sequence_no, q.input_row_start, q.input_row_count,
                                 q.token_position_start, q.kv_epoch, q.deadline_budget_ns, execution_lease_id,
                                 q.trace_id, q.span_id, q.lease_sequence)
        return RequestSlice(sequence, self.token_ids,
                            self.sampling, self.sample_index, self.kv_reserve_tokens, self.traceparent,
                            self.prefix_salt, self.prefix_tail)


def request_slice(request_id: str, sequence_no: int, token_ids: tuple[int, ...], position_start: int,
                  kv_epoch: int, deadline_budget_ns: int | None, sampling: SamplingParams, sample_index: int,
                  kv_reserve_tokens: int, input_row_start: int = 0, traceparent: str | None = None,
                  prefix_salt: bytes | None = None, prefix_tail: tuple[int, ...] = ()) -> RequestSlice:
    """A request slice whose FNX2 slice has no lease yet (trace and span ids are the request
    id); `deadline_budget_ns` None: no deadline."""
    budget = NO_DEADLINE_BUDGET_NS if deadline_budget_ns is None else deadline_budget_ns
    sequence = SequenceSlice(request_id, sequence_no, input_row_start, len(token_ids), position_start, kv_epoch,
                             budget, "", request_id, request_id)
    return RequestSlice(sequence, tuple(token_ids), sampling, sample_index, kv_reserve_tokens, traceparent,
                        prefix_salt, prefix_tail)


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
    """One request's outcome of a microbatch: the FNX2 `SequenceResult` the last stage sent back
    (or one the orchestrator wrote for a slice that never ran), with the token sampled from its
    rows. Results come back in the microbatch's slice order."""

    sequence: SequenceResult
    sampled_token_id: int | None = None
    error: str = ""  # what the request's reader is told when the status is not OK
    logprobs: TokenLogprobs | None = None  # when the request asked for them
    # The route failed (a stage died, stopped or lost its next hop), not the sequence: its
    # status is FAILED, and it may be replayed on a reloaded route.
    route_lost: bool = False
    # Leading tokens of the slice whose KV every stage already held (prefix reuse).
    cached_tokens: int = 0

    @property
    def request_id(self) -> str:
        return self.sequence.request_id

    @property
    def status(self) -> SequenceStatus:
        return self.sequence.status

    @property
    def kv_epoch_after(self) -> int:
        """The KV epoch after this step. On OK every stage holds it: a pipeline whose stages
        disagree reports the sequence as failed instead."""
        return self.sequence.kv_epoch_after


def sequence_ok(piece: RequestSlice, kv_epoch_after: int) -> SequenceResult:
    """The FNX2 result of a slice that ran, with one output row (its sampled token)."""
    s = piece.sequence
    return SequenceResult(s.request_id, s.execution_lease_id, s.request_sequence_no, SequenceStatus.OK,
                          s.input_row_start, s.input_row_count, 0, 1, s.kv_epoch, kv_epoch_after, None, None,
                          Timings())


def sequence_failed(piece: RequestSlice, status: SequenceStatus, error_code: str, error_message: str,
                    kv_epoch_after: int | None = None) -> SequenceResult:
    """The FNX2 result of a slice that did not run (or failed), no output rows; its epoch is
    unchanged unless `kv_epoch_after` says otherwise."""
    s = piece.sequence
    return SequenceResult(s.request_id, s.execution_lease_id, s.request_sequence_no, status, s.input_row_start,
                          s.input_row_count, None, 0, s.kv_epoch,
                          s.kv_epoch if kv_epoch_after is None else kv_epoch_after, error_code, error_message,
                          Timings())


def failed_result(piece: RequestSlice, error: str, route_lost: bool = False,
                  status: SequenceStatus = SequenceStatus.FAILED, error_code: str = "FAILED") -> RequestSliceResult:
    """A slice the orchestrator fails itself (its batch failed, or a stage refused its lease)."""
    return RequestSliceResult(sequence_failed(piece, status, error_code, error), None, error, route_lost=route_lost)


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
    logprobs: tuple[TokenLogprobs, ...] = ()  # one per token id, when asked for
    cached_tokens: int = 0  # prompt tokens served from the prefix cache

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of the continuous-batching loop."""

    # Microbatch slots kept in flight; raised to the stage count when lower.
    inflight_microbatches: int = 0
    # On a route of more than one stage, slots beyond the stage count: a microbatch whose result
    # is on its way back (last stage -> first stage -> orchestrator -> first stage) leaves the last
    # stage without input unless another one is in flight to cover that round trip.
    pipeline_spare_microbatches: int = 1
    max_sequences_per_microbatch: int = 64
    # Prefill rows per microbatch; a longer prompt is prefilled in chunks of at most this.
    max_prefill_rows_per_microbatch: int = 2048
    output_queue_capacity: int = 16
    # Chunked prefill mixed with decode (0: off): each scheduling step carries every ready
    # decode row, and prompt chunks fill the rest of this many tokens, never less than
    # `min_prefill_chunk_tokens` (see step_budget.py).
    max_tokens_per_step: int = 0
    min_prefill_chunk_tokens: int = 32


@dataclass(frozen=True)
class StageStats:
    """One stage as the dashboard sees it: where it runs, its KV, and cumulative phase times
    (physical figures from the stage's own clock; 0 where a phase does not exist)."""

    index: int
    host: str
    kv_bytes_used: int
    kv_bytes_limit: int
    live_sequences: int
    batches: int
    queue_ns: int = 0
    compute_ns: int = 0
    pack_ns: int = 0
    transfer_ns: int = 0
    unpack_ns: int = 0
    # Paged KV: blocks free (including cached ones) of the total, and prefix lookups.
    kv_blocks_free: int = 0
    kv_blocks_total: int = 0
    prefix_hit_blocks: int = 0
    prefix_missed_blocks: int = 0
    kv_evicted_blocks: int = 0


@dataclass(frozen=True)
class TokenLimits:
    """Per-request token limits besides the context window; 0 means only the window bounds it."""

    default_max_tokens: int = 256
    max_tokens_cap: int = 0
    max_prompt_tokens: int = 0


@dataclass(frozen=True)
class EngineSnapshot:
    """The serving engine's state at one instant, as the front ends read it."""

    live_requests: int
    # Why the route cannot serve (a stage is down); None while it can.
    degraded_reason: str | None
    # Why admission is closed (the route drains); None while it admits.
    not_admitting_reason: str | None
