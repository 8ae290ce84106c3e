"""Measured service time of this stage per batch: what a plan predicts as the stage's service.

A batch's service is its unpack, compute and pack time (queueing and the next hop excluded),
the same terms as the planner's `StageCost.service_s`, timed on the clock this host's profiles
use (`timing`: sustained cost under a CPU quota, else wall; `libs.profiles.sustained_clock`).
Decode and prefill are kept apart: decode per microbatch (cumulative, and the rolling mean of
the most recent microbatches, which the orchestrator compares with the installed plan's prediction), prefill per token.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

RECENT_DECODE_MICROBATCHES = 32


@dataclass(frozen=True)
class RecentDecode:
    mean_service_ns: int
    microbatches: int
    mean_rows: float


@dataclass
class ServiceTimes:
    timing: str = "wall"
    decode_service_ns: int = 0
    decode_microbatches: int = 0
    decode_rows: int = 0
    decode_past_tokens: int = 0  # tokens of past summed over those rows (mean past = this / rows)
    prefill_service_ns: int = 0
    prefill_tokens: int = 0
    prefill_batches: int = 0
    _recent: collections.deque[tuple[int, int]] = field(
        default_factory=lambda: collections.deque(maxlen=RECENT_DECODE_MICROBATCHES))

    def observe_decode(self, service_s: float, rows: int, past_tokens: int = 0) -> None:
        """`past_tokens`: the KV tokens its rows attended over, summed (each row's position)."""
        service_ns = int(service_s * 1e9)
        self.decode_service_ns += service_ns
        self.decode_microbatches += 1
        self.decode_rows += rows
        self.decode_past_tokens += past_tokens
        self._recent.append((service_ns, rows))

    def observe_prefill(self, service_s: float, tokens: int) -> None:
        self.prefill_service_ns += int(service_s * 1e9)
        self.prefill_tokens += tokens
        self.prefill_batches += 1

    def recent_decode(self) -> RecentDecode:
        count = len(self._recent)
        if count == 0:
            return RecentDecode(0, 0, 0.0)
        return RecentDecode(sum(ns for ns, _ in self._recent) // count, count,
                            sum(rows for _, rows in self._recent) / count)
