"""The grammar a request's output must follow, as a plain value (no engine imported): it
travels from the orchestrator to the final stage inside the sampling settings."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GrammarSpec:
    """What the sampled tokens must spell: an llguidance Lark grammar, and the ids that may end
    the output once it is complete (the model's end-of-sequence ids)."""

    lark: str
    end_token_ids: tuple[int, ...]
