"""Grammars that constrain sampling, compiled with llguidance against a tokenizer.

A grammar travels as llguidance's Lark dialect: plain text, human-readable, and able to embed
a JSON schema (`%json {...}`) inside a larger shape such as a tool call. The orchestrator
builds and validates it (so a bad schema is a 400 that names what is unsupported); the final
stage compiles a matcher per request and computes token masks before each sample.

Why llguidance: on this host its per-token mask cost is microseconds (see `fornax bench
grammar`), its compile is ~100x cheaper than xgrammar's, it handles recursive JSON (a plain
`json_object`) that regex-based outlines-core cannot, it rolls back (replays and retries), and
it names unimplemented schema keywords instead of ignoring them.
"""

from __future__ import annotations

import json
import re
from typing import Any

import llguidance
import llguidance.numpy as llnp
import numpy as np

from libs.service.errors import FailedPrecondition, InvalidArgument
from libs.structured.spec import GrammarSpec

__all__ = ["GrammarMatcher", "GrammarSpec", "GrammarVocabulary", "json_lark", "lark_string"]

# Compact JSON: a flexible-whitespace grammar lets a weak model emit whitespace forever.
COMPACT_JSON = {"whitespace_flexible": False}
_UNIMPLEMENTED = re.compile(r"Unimplemented keys: \[([^\]]*)\]")


def json_lark(schema: dict[str, Any], rule: str = "start") -> str:
    """A Lark rule whose text is one JSON value valid against `schema` (compact separators)."""
    guided = {**schema, "x-guidance": {**COMPACT_JSON, **schema.get("x-guidance", {})}}
    return f"{rule}: %json {json.dumps(guided, sort_keys=True)}\n"


def lark_string(text: str) -> str:
    """A Lark string literal for `text`."""
    return json.dumps(text)


class GrammarVocabulary:
    """The tokenizer as llguidance sees it, sized to the model's vocabulary.

    Ids the tokenizer does not cover (a model vocabulary padded past the tokenizer's) decode
    to nothing; llguidance never allows them, so constrained output stays valid.
    """

    def __init__(self, tokenizer_json: str, model_vocab_size: int) -> None:
        self.vocab_size = model_vocab_size
        self._tokenizer_json = tokenizer_json
        self._by_end_ids: dict[tuple[int, ...], llguidance.LLTokenizer] = {}

    def tokenizer(self, end_token_ids: tuple[int, ...]) -> llguidance.LLTokenizer:
        """llguidance's view of the vocabulary with these end ids (built once per set)."""
        if not end_token_ids:
            raise InvalidArgument("a grammar needs at least one end token id",
                                  reason="INVALID_GRAMMAR", field="end_token_ids")
        found = self._by_end_ids.get(end_token_ids)
        if found is None:
            found = llguidance.LLTokenizer(self._tokenizer_json, n_vocab=self.vocab_size,
                                           eos_token=list(end_token_ids))
            self._by_end_ids[end_token_ids] = found
        return found

    def check(self, spec: GrammarSpec, param: str) -> None:
        """InvalidArgument naming what the grammar (or its JSON schema) cannot express."""
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            _grammar(spec), self.tokenizer(spec.end_token_ids))
        if not failed:
            return
        found = _UNIMPLEMENTED.search(messages[0])
        if found:
            keys = [k.strip().strip('"') for k in found.group(1).split(",") if k.strip()]
            raise InvalidArgument(f"{param}: unsupported JSON schema features: {', '.join(keys)}",
                                  reason="UNSUPPORTED_SCHEMA", field=param)
        first_line = messages[0].splitlines()[0] if messages[0] else "invalid grammar"
        raise InvalidArgument(f"{param}: {first_line}", reason="INVALID_SCHEMA", field=param)

    def matcher(self, spec: GrammarSpec) -> GrammarMatcher:
        return GrammarMatcher(self, spec)


def _grammar(spec: GrammarSpec) -> str:
    return llguidance.LLMatcher.grammar_from_lark(spec.lark)


class GrammarMatcher:
    """One request's parser state: the mask for the next token, advanced token by token."""

    def __init__(self, vocab: GrammarVocabulary, spec: GrammarSpec) -> None:
        self._vocab_size = vocab.vocab_size
        self._matcher = llguidance.LLMatcher(vocab.tokenizer(spec.end_token_ids), _grammar(spec),
                                             log_level=0)
        self._bits = llnp.allocate_token_bitmask(1, vocab.vocab_size)
        self._fail_if_error()

    def allowed(self) -> np.ndarray:
        """bool [vocab]: the tokens that keep the output inside the grammar."""
        llnp.fill_next_token_bitmask(self._matcher, self._bits, 0)
        self._fail_if_error()
        bits = np.unpackbits(self._bits[0].view(np.uint8), bitorder="little")
        return bits[:self._vocab_size].astype(bool)

    @property
    def stopped(self) -> bool:
        """The grammar is complete and an end token was consumed."""
        return self._matcher.is_stopped()

    def consume(self, token_id: int) -> None:
        self._matcher.consume_token(token_id)
        self._fail_if_error()

    def rollback(self, tokens: int) -> None:
        if tokens and not self._matcher.rollback(tokens):
            raise FailedPrecondition(f"grammar state cannot roll back {tokens} tokens",
                                     reason="GRAMMAR_STATE")

    def _fail_if_error(self) -> None:
        if self._matcher.is_error():
            raise FailedPrecondition(f"grammar matcher failed: {self._matcher.get_error()}",
                                     reason="GRAMMAR_STATE")
