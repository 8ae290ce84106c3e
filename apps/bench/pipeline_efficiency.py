"""Pipeline efficiency from each stage's own occupancy (physical, per concurrency level).

Each stage worker splits its wall time into busy, waiting for credit and waiting for input
(services/stage_worker/occupancy.py) and reports the running totals in GetHealth. Over one
level's window the bench takes the deltas.

Definition implemented: a stage "running alone on its host at the same microbatch sizes" is that
stage working through exactly the microbatches it worked on in the window, back to back with no
waiting; its tokens/s alone is therefore the window's output tokens ÷ its busy seconds. The
pipeline's efficiency is the pipeline's tokens/s ÷ the slowest such stage's tokens/s, which comes
to the bottleneck stage's busy seconds ÷ the window's wall seconds. It assumes a stage's work per
microbatch is what it would be alone, which holds when every stage has its own host and core (the
multi-host fleet); on a shared host the busy time is inflated by the other stages and the figure
reads high. It does not replay recorded activations through a lone stage.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StageWindow:
    """One stage's occupancy deltas over a level's window, seconds."""

    busy_s: float
    credit_wait_s: float
    input_wait_s: float

    @property
    def total_s(self) -> float:
        return self.busy_s + self.credit_wait_s + self.input_wait_s

    def fractions(self) -> dict[str, float]:
        total = self.total_s or 1.0
        return {"busy_fraction": self.busy_s / total, "credit_wait_fraction": self.credit_wait_s / total,
                "input_wait_fraction": self.input_wait_s / total}


def pipeline_efficiency(output_tokens: int, wall_s: float, stages: dict[str, StageWindow]) -> dict:
    """Pipeline tokens/s ÷ the slowest stage's tokens/s alone, with what went into it."""
    if not stages or wall_s <= 0 or output_tokens <= 0:
        raise ValueError("pipeline efficiency needs stages, output tokens and a positive window")
    alone = {name: (output_tokens / w.busy_s if w.busy_s > 0 else float("inf")) for name, w in stages.items()}
    slowest = min(alone, key=lambda name: alone[name])
    pipeline_tok_s = output_tokens / wall_s
    return {"pipeline_efficiency": pipeline_tok_s / alone[slowest], "pipeline_tokens_per_s": pipeline_tok_s,
            "slowest_stage": slowest, "slowest_stage_alone_tokens_per_s": alone[slowest],
            "definition": "pipeline tokens/s ÷ (output tokens ÷ the slowest stage's busy seconds in the window)"}
