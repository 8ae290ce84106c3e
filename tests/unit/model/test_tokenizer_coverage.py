"""Every preset's checkpoint tokenizer covers the preset's whole vocabulary: each id a
random-weight model can sample decodes to text, so text-level tests (stop strings,
detokenization, greedy text equality) see text rather than empty strings."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from libs.model.presets import PRESETS
from libs.model.tokenizer_build import (
    ASSETS,
    BOS_TOKEN,
    CORPUS,
    EOS_TOKEN,
    SPECIAL_TOKENS,
    TOKENIZER_JSON,
    checkpoint_tokenizer_json,
    extend_tokenizer_json,
)
from libs.text.tokenizer import ProjectTokenizer, TokenizerIdentity

TRAINED = (ASSETS / TOKENIZER_JSON).read_text()


def serving_tokenizer(tokenizer_json: str) -> ProjectTokenizer:
    """The tokenizer as the orchestrator loads it."""
    return ProjectTokenizer(Tokenizer.from_str(tokenizer_json), TokenizerIdentity("memory", "-"))


@pytest.fixture(scope="module", params=sorted(PRESETS))
def preset_tokenizer(request) -> tuple[int, ProjectTokenizer]:
    vocab_size = PRESETS[request.param]["vocab_size"]
    return vocab_size, serving_tokenizer(checkpoint_tokenizer_json(vocab_size))


def test_every_id_of_every_preset_decodes_to_text(preset_tokenizer):
    vocab_size, tokenizer = preset_tokenizer
    assert tokenizer.vocab_size == vocab_size
    empty = [i for i in range(vocab_size) if not tokenizer.decode([i], skip_special_tokens=False)]
    assert empty == []
    assert all(tokenizer.token_bytes), "every id has bytes for incremental detokenization"


def test_extension_keeps_the_trained_ids_and_special_tokens(preset_tokenizer):
    vocab_size, tokenizer = preset_tokenizer
    trained = json.loads(TRAINED)["model"]["vocab"]
    assert all(tokenizer.token_id(token) == token_id for token, token_id in trained.items())
    assert [tokenizer.token_id(t) for t in SPECIAL_TOKENS] == [trained[t] for t in SPECIAL_TOKENS]
    assert tokenizer.special_ids == frozenset(trained[t] for t in SPECIAL_TOKENS)
    assert {BOS_TOKEN, EOS_TOKEN} <= set(SPECIAL_TOKENS)


def test_extended_merges_encode_text_and_round_trip(preset_tokenizer):
    vocab_size, tokenizer = preset_tokenizer
    corpus = CORPUS.read_text()
    ids = tokenizer.encode(corpus)
    assert tokenizer.decode(ids) == corpus
    trained_count = len(serving_tokenizer(TRAINED).encode(corpus))
    trained_size = len(json.loads(TRAINED)["model"]["vocab"])
    if vocab_size > trained_size:
        assert len(ids) < trained_count and max(ids) >= trained_size, "the new merges apply when encoding"
    else:
        assert len(ids) == trained_count


def test_the_trained_size_keeps_the_committed_bytes_and_extension_is_deterministic():
    assert checkpoint_tokenizer_json(PRESETS["tiny"]["vocab_size"]) == TRAINED
    assert extend_tokenizer_json(TRAINED, 4096) == extend_tokenizer_json(TRAINED, 4096)


def test_a_vocabulary_below_the_trained_one_is_refused():
    with pytest.raises(ValueError, match="below the trained tokenizer"):
        extend_tokenizer_json(TRAINED, 100)
