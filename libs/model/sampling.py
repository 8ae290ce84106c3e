"""Next-token selection on the final stage: greedy, temperature, top-k, top-p, seeded, with an
optional per-row token filter (grammar mask, logit bias and penalties) applied first.

A request's random stream is a pure function of (seed, position), so the token chosen at a
position never depends on what else shared the batch or on retries.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from libs.model.errors import BatchError
from libs.structured.spec import GrammarSpec


@dataclass(frozen=True)
class SamplingParams:
    """How a request picks its tokens, from the HTTP API down to the final stage.

    temperature 0 means greedy (the default here; the OpenAI API defaults to 1).
    """

    temperature: float = 0.0   # 0 selects greedy decoding
    top_k: int = 0             # 0 disables
    top_p: float = 1.0         # 1 disables
    # None: the request named none. The serving engine draws one per request before any stage
    # samples, so an unseeded request still gets its own stream; a stage reads None as 0.
    seed: int | None = None
    return_logits: bool = False  # logits mode: the caller receives the logits row too
    # OpenAI semantics over the tokens generated so far (not the prompt).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    grammar: GrammarSpec | None = None
    # Position of the row whose sample is the first generated token (prompt length - 1); rows
    # before it are middle prefill chunks, whose samples the orchestrator discards.
    first_sample_position: int = 0
    # Tokens generated before this admission (a replay): penalties and grammar resume after them.
    generated_token_ids: tuple[int, ...] = ()
    # None: no logprobs; k: the sampled token's logprob and the k most likely (k <= 20).
    top_logprobs: int | None = None

    @property
    def needs_history(self) -> bool:
        """Whether sampling depends on what was generated before (per-request state)."""
        return bool(self.grammar or self.presence_penalty or self.frequency_penalty
                    or self.logit_bias)

    @property
    def stream_seed(self) -> int:
        return 0 if self.seed is None else self.seed

    def validate(self) -> None:
        if self.temperature < 0 or not np.isfinite(self.temperature):
            raise BatchError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise BatchError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise BatchError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and self.seed < 0:
            raise BatchError(f"seed must be >= 0, got {self.seed}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise BatchError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= 20:
            raise BatchError(f"top_logprobs must be in [0, 20], got {self.top_logprobs}")
        if any(not -100.0 <= bias <= 100.0 for _, bias in self.logit_bias):
            raise BatchError("logit_bias values must be in [-100, 100]")


@dataclass(frozen=True)
class TokenFilter:
    """Per-row adjustments made before sampling: an additive bias (logit_bias, penalties) and
    the set of tokens a grammar allows."""

    bias: np.ndarray | None = None      # float32 [vocab]
    allowed: np.ndarray | None = None   # bool [vocab]

    def apply(self, logits: np.ndarray) -> np.ndarray:
        out = logits.astype(np.float32, copy=True)
        if self.bias is not None:
            out += self.bias
        if self.allowed is not None:
            if not self.allowed.any():
                raise BatchError("the grammar allows no token here", reason="GRAMMAR_STATE")
            out[~self.allowed] = -np.inf
        return out


GREEDY = SamplingParams()


def candidate_probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """float64 [vocab] distribution after temperature, top-k and top-p (zeros outside support)."""
    scaled = logits.astype(np.float64) / params.temperature
    if params.top_k and params.top_k < scaled.size:
        kth = np.partition(scaled, -params.top_k)[-params.top_k]
        scaled = np.where(scaled >= kth, scaled, -np.inf)
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        cut = int(np.searchsorted(cumulative, params.top_p, side="left")) + 1
        keep = np.zeros_like(probs, dtype=bool)
        keep[order[:cut]] = True
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum()
    return probs


def sample_token(logits: np.ndarray, params: SamplingParams, position: int,
                 token_filter: TokenFilter | None = None) -> int:
    """Choose the token for the row at `position` from float32 logits [vocab]."""
    params.validate()
    if token_filter is not None:
        logits = token_filter.apply(logits)
    if params.temperature == 0.0:
        return int(np.argmax(logits))
    probs = candidate_probabilities(logits, params)
    rng = np.random.default_rng(np.random.SeedSequence([params.stream_seed, position]))
    return int(rng.choice(probs.size, p=probs))
