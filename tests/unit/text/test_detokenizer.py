from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from libs.text.context import TextContext
from libs.text.detokenizer import IncrementalDetokenizer, StopMatcher, TextStream


def _deltas(ctx: TextContext, ids: list[int]) -> list[str]:
    detok = IncrementalDetokenizer(ctx.tokenizer.token_bytes, ctx.tokenizer.special_ids)
    return [detok.push(i) for i in ids] + [detok.flush()]


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_deltas_concatenate_to_full_decode_and_are_valid_utf8(any_text_context, data):
    vocab = any_text_context.tokenizer.vocab_size
    ids = data.draw(st.lists(st.integers(min_value=0, max_value=vocab + 20), max_size=40))
    deltas = _deltas(any_text_context, ids)
    assert "".join(deltas) == any_text_context.tokenizer.decode(ids)
    for delta in deltas:
        delta.encode("utf-8")  # a lone surrogate would raise here


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=30))
def test_encoded_text_streams_back_without_replacement_chars(any_text_context, text):
    tokenizer = any_text_context.tokenizer
    ids = tokenizer.encode(text)
    deltas = _deltas(any_text_context, ids)
    if tokenizer.special_ids.isdisjoint(ids):
        assert "".join(deltas) == text
    else:  # the text spells a special token (Hypothesis draws string literals of the code): it
        # encodes to that token, which streams back as the full decode shows it, as nothing
        assert "".join(deltas) == tokenizer.decode(ids)
    assert all("\ufffd" not in d for d in deltas) or "\ufffd" in text


def test_split_multibyte_character_is_held_back_until_complete(text_context):
    tok = text_context.tokenizer
    ids = tok.encode("🙂")
    assert len(ids) > 1, "fixture must split the emoji across tokens"
    deltas = _deltas(text_context, ids)
    assert deltas[:-2] == [""] * (len(ids) - 1)
    assert deltas[-2] == "🙂"


def test_special_tokens_are_skipped(text_context):
    tok = text_context.tokenizer
    ids = [tok.token_id("<|im_start|>"), *tok.encode("ok"), tok.token_id("<|im_end|>")]
    assert "".join(_deltas(text_context, ids)) == "ok"


def test_stop_string_spanning_deltas_is_cut_and_never_emitted():
    matcher = StopMatcher(["STOP"])
    out = [matcher.push(t) for t in ["hello S", "T", "O", "Pworld"]]
    assert out == ["hello ", "", "", ""]
    assert matcher.stopped
    assert matcher.flush() == ""


def test_stop_prefix_that_does_not_complete_is_released():
    matcher = StopMatcher(["STOP", "xy"])
    assert matcher.push("aST") == "a"
    assert matcher.push("O") == ""
    assert matcher.push("x") == "STO"
    assert matcher.push("z") == "xz"
    assert not matcher.stopped
    assert matcher.push("x") == ""
    assert matcher.flush() == "x"


def test_earliest_stop_string_wins():
    matcher = StopMatcher(["world", "lo w"])
    assert matcher.push("hello world") == "hel"


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet="abAB", max_size=30),
       cuts=st.lists(st.integers(min_value=0, max_value=30), max_size=6),
       stop=st.lists(st.text(alphabet="abAB", min_size=1, max_size=3), max_size=3))
def test_stop_matcher_equals_cutting_the_whole_text(text, cuts, stop):
    bounds = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    matcher = StopMatcher(stop)
    out = "".join(matcher.push(text[a:b]) for a, b in pairwise(bounds)) + matcher.flush()
    hits = [i for i in (text.find(s) for s in stop) if i >= 0]
    expected = text[:min(hits)] if hits else text
    assert out == expected
    assert matcher.stopped == bool(hits)


def test_text_stream_stops_on_string_made_of_several_tokens(text_context):
    ids = text_context.tokenizer.encode("the lazy dog jumps")
    stream = TextStream(text_context.tokenizer.token_bytes, text_context.tokenizer.special_ids,
                        ("dog",))
    text, stopped_at = "", None
    for n, token_id in enumerate(ids):
        delta = stream.push(token_id)
        text += delta.text
        if delta.stopped:
            stopped_at = n
            break
    assert stopped_at is not None
    assert text == "the lazy "
