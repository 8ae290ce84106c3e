"""Chunked prefill under a per-step token budget, scheduled together with decode rows.

Pure: the scheduler hands in what is ready and the free slots; this decides which
microbatches one scheduling step issues. Without it, a prompt is prefilled in chunks of up
to `max_prefill_rows_per_microbatch` (2048 rows by default), so a few long prompts arriving
together stall every running request's next token for the whole prefill.

With a budget of T tokens per step, each step carries every ready decode row first, and the
prefill chunks of waiting prompts fill what is left of T (never less than
`min_prefill_chunk_tokens`, so prompts keep progressing under a full decode load). One
long prompt then delays the next token by at most one chunk's compute.

A microbatch stays phase-homogeneous: on the FNX2 wire a BATCH has one phase, and a stage
rejects a prefill slice for a request that already decodes (PHASE). "Together" therefore
means in the same step: decode and prefill microbatches are issued side by side, and with
a single slot the step alternates between a decode microbatch and one budgeted chunk.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from services.orchestrator.engine.domain import Phase

R = TypeVar("R")


@dataclass(frozen=True)
class StepBudget:
    tokens_per_step: int
    min_prefill_chunk_tokens: int
    max_sequences_per_microbatch: int


@dataclass(frozen=True)
class PlannedBatch(Generic[R]):
    """One microbatch to issue: its phase and (request, rows) pairs."""

    phase: Phase
    picked: tuple[tuple[R, int], ...]


def prefill_budget(budget: StepBudget, decode_rows: int) -> int:
    """Prompt tokens this step may prefill, after the decode rows it carries."""
    return max(budget.tokens_per_step - decode_rows, budget.min_prefill_chunk_tokens)


def chunk_prompts(waiting: Sequence[R], remaining: Sequence[int], tokens: int,
                  max_sequences: int) -> tuple[tuple[R, int], ...]:
    """First come, first served: whole remainders while they fit, then one cut chunk."""
    picked: list[tuple[R, int]] = []
    for request, left in zip(waiting, remaining, strict=True):
        if tokens <= 0 or len(picked) >= max_sequences:
            break
        rows = min(left, tokens)
        if rows > 0:
            picked.append((request, rows))
            tokens -= rows
    return tuple(picked)


def split_decode(decodable: Sequence[R], slots: int, fair_share: int,
                 max_sequences: int) -> list[tuple[tuple[R, int], ...]]:
    """Decode rows spread evenly over `slots` microbatches, each within the fair share."""
    groups: list[tuple[tuple[R, int], ...]] = []
    rest = list(decodable)
    for index in range(slots):
        if not rest:
            break
        share = min(math.ceil(len(rest) / (slots - index)), fair_share, max_sequences)
        groups.append(tuple((r, 1) for r in rest[:share]))
        rest = rest[share:]
    return groups


@dataclass(frozen=True)
class SlotView:
    """The scheduler's slots as the planner needs them."""

    free: int
    total: int
    prefill_inflight: bool  # a prompt chunk is executing: at most one is, so decode keeps a slot
    last_phase: Phase
    # Requests decoding now, ready or in flight: each takes a row of every step's budget.
    running: int = 0


def plan_step(budget: StepBudget, waiting: Sequence[R], remaining: Sequence[int],
              decodable: Sequence[R], slots: SlotView, fair_share: int) -> list[PlannedBatch[R]]:
    """The microbatches of one step, at most `slots.free` of them.

    `waiting` are prompts not yet fully prefilled (in arrival order) with `remaining`
    tokens each; `decodable` are running requests that want their next token.
    """
    if slots.free <= 0 or not (waiting or decodable):
        return []
    prefill: tuple[tuple[R, int], ...] = ()
    if not slots.prefill_inflight:
        decode_rows = max(slots.running, len(decodable))
        prefill = chunk_prompts(waiting, remaining, prefill_budget(budget, decode_rows),
                                budget.max_sequences_per_microbatch)
    decode_slots = slots.free
    if prefill and decodable:
        if slots.free == 1:  # alternate, so neither phase waits more than one microbatch
            if slots.last_phase is Phase.DECODE:
                return [PlannedBatch(Phase.PREFILL, prefill)]
            prefill = ()
        else:
            decode_slots -= 1
    planned = [PlannedBatch(Phase.DECODE, g) for g in split_decode(
        decodable, decode_slots, fair_share, budget.max_sequences_per_microbatch)]
    return planned + ([PlannedBatch(Phase.PREFILL, prefill)] if prefill else [])
