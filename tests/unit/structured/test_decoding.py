"""Grammar masks and per-request decoding state: validity from any logits, rollback on
retries, rebuild from generated tokens, penalties and logit bias, unsupported schemas."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.model.errors import BatchError
from libs.model.sampling import SamplingParams, TokenFilter, sample_token
from libs.model.tokenizer_build import ASSETS, TOKENIZER_JSON
from libs.service.errors import FailedPrecondition, InvalidArgument
from libs.structured.decoding import DecodingTable, SequenceDecoding
from libs.structured.grammar import GrammarSpec, GrammarVocabulary, json_lark
from libs.text.tokenizer import ProjectTokenizer

EOS = 2
TOKENIZER = ProjectTokenizer.from_file(ASSETS / TOKENIZER_JSON)
TOKENIZER_TEXT = (ASSETS / TOKENIZER_JSON).read_text()
# A model vocabulary padded past the tokenizer's: ids at and above 512 decode to nothing.
MODEL_VOCAB = TOKENIZER.vocab_size + 88
SCHEMA = {"type": "object",
          "properties": {"n": {"type": "integer", "minimum": -5, "maximum": 5000},
                         "s": {"type": "string", "maxLength": 6},
                         "e": {"enum": ["x", "yy", None]},
                         "l": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
          "required": ["n", "s", "e", "l"], "additionalProperties": False}


@pytest.fixture(scope="module")
def vocab() -> GrammarVocabulary:
    return GrammarVocabulary(TOKENIZER_TEXT, MODEL_VOCAB)


def _params(first: int = 0, seed: int = 0) -> SamplingParams:
    return SamplingParams(temperature=1.0, seed=seed, first_sample_position=first,
                          grammar=GrammarSpec(json_lark(SCHEMA), (EOS,)))


def _decode(tokens: list[int]) -> str:
    return b"".join(TOKENIZER.token_bytes[t] for t in tokens if t != EOS).decode("utf-8")


def _generate(state: SequenceDecoding, params: SamplingParams, logits_seed: int,
              steps: int = 200) -> list[int]:
    rng = np.random.default_rng(logits_seed)
    out: list[int] = []
    first = params.first_sample_position
    for position in range(first, first + steps):
        logits = rng.normal(0, 3, MODEL_VOCAB).astype(np.float32)
        logits[TOKENIZER.vocab_size:] += 50.0  # the model loves ids the tokenizer lacks
        token = sample_token(logits, params, position, state.token_filter(position))
        state.accept(position, token)
        out.append(token)
        if token == EOS:
            return out
    raise AssertionError("the grammar never completed")


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_any_logits_give_schema_valid_json(vocab, seed):
    params = _params(first=7, seed=seed)
    tokens = _generate(SequenceDecoding(params, MODEL_VOCAB, vocab), params, seed)
    assert all(t < TOKENIZER.vocab_size for t in tokens)
    jsonschema.validate(json.loads(_decode(tokens)), SCHEMA)


def test_retry_of_a_step_rolls_the_state_back(vocab):
    params = _params(first=3)
    state = SequenceDecoding(params, MODEL_VOCAB, vocab)
    tokens = _generate(state, params, 1)
    # The same step again (a retried microbatch): the mask is the one before that token.
    retried = state.token_filter(3 + 2)
    expected = SequenceDecoding(params, MODEL_VOCAB, vocab)
    for position, token in enumerate(tokens[:2], start=3):
        expected.accept(position, token)
    assert np.array_equal(retried.allowed, expected.token_filter(5).allowed)
    assert state.generated == tuple(tokens[:2])


def test_state_rebuilds_from_generated_tokens(vocab):
    params = _params(first=10, seed=4)
    tokens = _generate(SequenceDecoding(params, MODEL_VOCAB, vocab), params, 4)
    half = len(tokens) // 2
    direct = SequenceDecoding(params, MODEL_VOCAB, vocab)
    for position, token in enumerate(tokens[:half], start=10):
        direct.accept(position, token)
    # A replay re-prefills prompt + emitted tokens: the first sample is then half rows later.
    replayed = SequenceDecoding(
        SamplingParams(temperature=1.0, seed=4, grammar=params.grammar,
                       first_sample_position=10, generated_token_ids=tuple(tokens[:half])),
        MODEL_VOCAB, vocab)
    assert np.array_equal(direct.token_filter(10 + half).allowed,
                          replayed.token_filter(10 + half).allowed)


def test_a_gap_in_the_history_fails_closed(vocab):
    state = SequenceDecoding(_params(), MODEL_VOCAB, vocab)
    with pytest.raises(FailedPrecondition) as info:
        state.token_filter(5)  # generated token 5 before tokens 0..4 are known
    assert info.value.reason == "GRAMMAR_STATE"


def test_middle_prefill_chunks_are_unconstrained():
    params = SamplingParams(grammar=None, presence_penalty=1.0, first_sample_position=9)
    state = SequenceDecoding(params, MODEL_VOCAB, None)
    assert state.token_filter(4) is None
    state.accept(4, 17)  # a middle chunk's sample is discarded and changes nothing
    assert state.generated == ()


def test_penalties_follow_openai_semantics():
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25,
                            logit_bias=((3, 2.0), (7, -1.0)), first_sample_position=0)
    state = SequenceDecoding(params, 10, None)
    for position, token in enumerate([3, 3, 5]):
        state.accept(position, token)
    bias = state.token_filter(3).bias
    expected = np.zeros(10, dtype=np.float32)
    expected[3], expected[7] = 2.0 - (2 * 0.25 + 0.5), -1.0
    expected[5] = -(0.25 + 0.5)
    np.testing.assert_allclose(bias, expected)


def test_filter_masks_before_greedy_and_refuses_an_empty_mask():
    logits = np.array([5.0, 1.0, 0.0, 3.0], dtype=np.float32)
    allowed = np.array([False, True, False, True])
    assert sample_token(logits, SamplingParams(), 0, TokenFilter(allowed=allowed)) == 3
    with pytest.raises(BatchError):
        sample_token(logits, SamplingParams(), 0, TokenFilter(allowed=np.zeros(4, dtype=bool)))


def test_table_keeps_state_only_for_requests_that_need_it(vocab):
    table = DecodingTable(MODEL_VOCAB, vocab)
    table.open("plain", SamplingParams())
    table.open("json", _params())
    assert len(table) == 1
    plain, constrained = table.filters(["plain", "json"], [3, 0])
    assert plain is None and constrained.allowed is not None
    table.close("json")
    assert len(table) == 0


def test_grammar_needs_a_tokenizer_on_the_stage():
    with pytest.raises(FailedPrecondition) as info:
        SequenceDecoding(_params(), MODEL_VOCAB, None)
    assert info.value.reason == "GRAMMAR_UNAVAILABLE"


@pytest.mark.parametrize("schema, named", [
    ({"type": "object", "if": {"required": ["a"]}, "then": {}}, ["if", "then"]),
    ({"type": "object", "dependentSchemas": {"a": {}}}, ["dependentSchemas"]),
])
def test_unsupported_schema_features_are_named(vocab, schema, named):
    with pytest.raises(InvalidArgument) as info:
        vocab.check(GrammarSpec(json_lark(schema), (EOS,)), "response_format")
    assert info.value.reason == "UNSUPPORTED_SCHEMA"
    assert all(name in info.value.message for name in named)
