"""Per-request decoding state on the final stage: the generated tokens and the grammar matcher.

State is keyed by generation index, not by arrival: a sample at row position p is generated
token number p - first_sample_position. A retried or replayed step (the same index again)
rolls the state back to that index first, so the state never depends on how requests were
grouped into microbatches or how often a step ran. A replay onto a fresh stage rebuilds it
from the tokens already generated (`SamplingParams.generated_token_ids`).
"""

from __future__ import annotations

import numpy as np

from libs.model.sampling import SamplingParams, TokenFilter
from libs.service.errors import FailedPrecondition
from libs.structured.grammar import GrammarMatcher, GrammarVocabulary


class SequenceDecoding:
    def __init__(self, params: SamplingParams, vocab_size: int,
                 grammar_vocab: GrammarVocabulary | None) -> None:
        if params.grammar is not None and grammar_vocab is None:
            raise FailedPrecondition("this stage has no tokenizer to compile grammars with",
                                     reason="GRAMMAR_UNAVAILABLE")
        self._params = params
        self._vocab_size = vocab_size
        self._first = params.first_sample_position
        self._tokens: list[int] = []
        self._grammar_vocab = grammar_vocab
        self._matcher: GrammarMatcher | None = self._fresh_matcher()
        self._logit_bias = _bias_vector(params.logit_bias, vocab_size)
        for token in params.generated_token_ids:
            self._append(token)

    @property
    def generated(self) -> tuple[int, ...]:
        return tuple(self._tokens)

    def token_filter(self, position: int) -> TokenFilter | None:
        """The filter for the sample at row `position`; None for a middle prefill chunk."""
        index = position - self._first
        if index < 0:
            return None
        self._rewind(index)
        allowed = self._matcher.allowed() if self._matcher is not None else None
        return TokenFilter(bias=self._bias(), allowed=allowed)

    def accept(self, position: int, token_id: int) -> None:
        index = position - self._first
        if index < 0:
            return
        self._rewind(index)
        self._append(token_id)

    def _rewind(self, index: int) -> None:
        if index > len(self._tokens):
            raise FailedPrecondition(
                f"sample for generated token {index} but only {len(self._tokens)} are known",
                reason="GRAMMAR_STATE")
        extra = len(self._tokens) - index
        if not extra:
            return
        kept = self._tokens[:index]
        if self._matcher is not None and self._matcher.stopped:
            # llguidance keeps no history entry for the end token that stopped it, so a
            # stopped matcher is rebuilt from the kept tokens instead of rolled back.
            self._matcher, self._tokens = self._fresh_matcher(), []
            for token in kept:
                self._append(token)
            return
        if self._matcher is not None:
            self._matcher.rollback(extra)
        del self._tokens[index:]

    def _fresh_matcher(self) -> GrammarMatcher | None:
        grammar = self._params.grammar
        return None if grammar is None else self._grammar_vocab.matcher(grammar)

    def _append(self, token_id: int) -> None:
        if self._matcher is not None:
            self._matcher.consume(token_id)
        self._tokens.append(token_id)

    def _bias(self) -> np.ndarray | None:
        p = self._params
        if not (p.presence_penalty or p.frequency_penalty) or not self._tokens:
            return self._logit_bias
        counts = np.bincount(np.asarray(self._tokens, dtype=np.int64),
                             minlength=self._vocab_size)[:self._vocab_size].astype(np.float32)
        penalty = counts * np.float32(p.frequency_penalty) + (counts > 0) * np.float32(
            p.presence_penalty)
        base = self._logit_bias if self._logit_bias is not None else 0.0
        return (base - penalty).astype(np.float32)


def _bias_vector(pairs: tuple[tuple[int, float], ...], vocab_size: int) -> np.ndarray | None:
    if not pairs:
        return None
    bias = np.zeros(vocab_size, dtype=np.float32)
    ids = np.array([i for i, _ in pairs], dtype=np.int64)
    if ids.min() < 0 or ids.max() >= vocab_size:
        raise FailedPrecondition(f"logit_bias token ids must lie in [0, {vocab_size})",
                                 reason="LOGIT_BIAS")
    bias[ids] = np.array([b for _, b in pairs], dtype=np.float32)
    return bias


class DecodingTable:
    """The final stage's per-request states; requests without history-dependent sampling
    have none and cost nothing."""

    def __init__(self, vocab_size: int, grammar_vocab: GrammarVocabulary | None) -> None:
        self._vocab_size = vocab_size
        self._grammar_vocab = grammar_vocab
        self._states: dict[str, SequenceDecoding] = {}

    def open(self, request_id: str, params: SamplingParams) -> None:
        if params.needs_history and request_id not in self._states:
            self._states[request_id] = SequenceDecoding(params, self._vocab_size,
                                                        self._grammar_vocab)

    def close(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    def filters(self, request_ids: list[str], positions: list[int]) -> tuple[TokenFilter | None, ...]:
        return tuple(self._filter(r, p) for r, p in zip(request_ids, positions, strict=True))

    def _filter(self, request_id: str, position: int) -> TokenFilter | None:
        state = self._states.get(request_id)
        return None if state is None else state.token_filter(position)

    def accept(self, request_ids: list[str], positions: list[int], tokens: list[int]) -> None:
        for request_id, position, token in zip(request_ids, positions, tokens, strict=True):
            state = self._states.get(request_id)
            if state is not None:
                state.accept(position, token)

    def __len__(self) -> int:
        return len(self._states)
