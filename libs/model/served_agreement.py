"""Top-1 agreement of a served route's greedy tokens with a teacher-forced reference.

The route generated `served` after `prompt`. The reference runs prompt + served[:-1] in one
teacher-forced pass; its argmax at position len(prompt) - 1 + k is what it would emit after the
route's own prefix prompt + served[:k]. Each served token is scored against that argmax, so one
disagreement never carries into the next position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PromptAgreement:
    prompt_tokens: int
    served: tuple[int, ...]
    reference_top1: tuple[int, ...]  # the reference's argmax after each served prefix
    agreed: int

    @property
    def positions(self) -> int:
        return len(self.served)

    @property
    def agreement(self) -> float:
        return self.agreed / self.positions if self.positions else 1.0

    @property
    def first_miss(self) -> int | None:
        """The index (within the continuation) of the first served token the reference disputes."""
        for k, (a, b) in enumerate(zip(self.served, self.reference_top1, strict=True)):
            if a != b:
                return k
        return None


def teacher_forced_sequence(prompt: Sequence[int], served: Sequence[int]) -> list[int]:
    """What the reference runs: the prompt and every served token but the last (no token follows it)."""
    return [*prompt, *served[:-1]] if served else list(prompt)


def prompt_agreement(prompt: Sequence[int], served: Sequence[int], top1: np.ndarray) -> PromptAgreement:
    """`top1`: the reference's argmax at every position of `teacher_forced_sequence(prompt, served)`."""
    start = len(prompt) - 1
    expected = tuple(int(t) for t in np.asarray(top1)[start:start + len(served)])
    if len(expected) != len(served):
        raise ValueError(f"{len(top1)} reference positions cannot score {len(served)} served tokens "
                         f"after a {len(prompt)}-token prompt")
    agreed = sum(int(a == b) for a, b in zip(served, expected, strict=True))
    return PromptAgreement(len(prompt), tuple(int(t) for t in served), expected, agreed)


def overall_agreement(prompts: Sequence[PromptAgreement]) -> tuple[float, int]:
    """(fraction of every served token the reference agrees with, positions scored)."""
    positions = sum(p.positions for p in prompts)
    return (sum(p.agreed for p in prompts) / positions if positions else 1.0), positions


@dataclass(frozen=True)
class Miss:
    """A served token the reference disputes: where, how it ranks among the reference's logits
    (0 = its first choice), and how far behind the reference's first choice it is, in logits."""

    prompt: int
    position: int  # within the continuation
    served_rank: int
    gap: float


@dataclass(frozen=True)
class Margins:
    """How close the reference's own decisions were at the scored positions: its first-to-second
    logit gap (percentiles 10/50/90), and each miss. A miss whose gap is within the numeric error of
    the route's products is a near-tie, not a wrong computation."""

    first_second_gap_p10: float
    first_second_gap_p50: float
    first_second_gap_p90: float
    logit_std: float
    misses: tuple[Miss, ...]


def margins(prompts: Sequence[Sequence[int]], served: Sequence[Sequence[int]],
            logits: Sequence[np.ndarray]) -> Margins:
    """`logits[i]`: the reference's float32 logits [positions, vocab] over
    `teacher_forced_sequence(prompts[i], served[i])`."""
    gaps, stds, misses = [], [], []
    for index, (prompt, tokens, rows) in enumerate(zip(prompts, served, logits, strict=True)):
        start = len(prompt) - 1
        scored = np.asarray(rows, dtype=np.float32)[start:start + len(tokens)]
        stds.append(float(scored.std()))
        for k, (row, token) in enumerate(zip(scored, tokens, strict=True)):
            first, second = np.partition(row, -2)[-1], np.partition(row, -2)[-2]
            gaps.append(float(first - second))
            if int(np.argmax(row)) != int(token):
                misses.append(Miss(index, k, int((row > row[token]).sum()), float(first - row[token])))
    p10, p50, p90 = (float(np.percentile(gaps, q)) for q in (10, 50, 90)) if gaps else (0.0, 0.0, 0.0)
    return Margins(p10, p50, p90, float(np.mean(stds)) if stds else 0.0, tuple(misses))
