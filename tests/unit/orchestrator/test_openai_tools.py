"""Tool calling, pure parts: parsing tools and tool_choice, the forced-call grammar, pulling
calls out of text, and the streaming splitter that holds back what may open a call."""

from __future__ import annotations

import json
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libs.model.tokenizer_build import ASSETS, TOKENIZER_JSON
from libs.service.errors import InvalidArgument
from libs.structured.grammar import GrammarVocabulary
from libs.structured.spec import GrammarSpec
from services.orchestrator.api.openai_tools import (
    CallStreamSplitter,
    ToolChoiceMode,
    extract_calls,
    forced_call_lark,
    output_lark,
    parse_tools,
)
from services.orchestrator.api.structured import json_lark

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time"}}
CALL = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>'


def test_choices_parse_to_modes():
    assert parse_tools({}).mode is ToolChoiceMode.NONE
    assert parse_tools({"tools": [WEATHER]}).mode is ToolChoiceMode.AUTO
    named = parse_tools({"tools": [WEATHER, CLOCK],
                         "tool_choice": {"type": "function", "function": {"name": "get_time"}}})
    assert (named.mode, named.named, named.forced) == (ToolChoiceMode.NAMED, "get_time", True)
    assert parse_tools({"tools": [WEATHER], "tool_choice": "none"}).active is False


@pytest.mark.parametrize("body, param", [
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]},
     "tools[0].function.parameters"),
])
def test_bad_tools_name_the_parameter(body, param):
    with pytest.raises(InvalidArgument) as info:
        parse_tools(body)
    assert info.value.field == param


def test_forced_call_grammars_compile_against_the_tokenizer():
    vocab = GrammarVocabulary((ASSETS / TOKENIZER_JSON).read_text(), 512)
    request = parse_tools({"tools": [WEATHER, CLOCK], "tool_choice": "required"})
    for lark in (forced_call_lark(request),
                 output_lark(parse_tools({"tools": [WEATHER]}), json_lark({"type": "object"}))):
        vocab.check(GrammarSpec(lark, (2,)), "tool_choice")  # raises when it does not compile


def test_calls_come_out_of_text_and_unknown_ones_stay():
    request = parse_tools({"tools": [WEATHER]})
    content, calls = extract_calls("Sure. " + CALL, request)
    assert content == "Sure." and len(calls) == 1
    assert (calls[0].name, json.loads(calls[0].arguments)) == ("get_weather", {"city": "Paris"})
    unknown = CALL.replace("get_weather", "launch")
    assert extract_calls(unknown, request) == (unknown, ())
    broken = CALL.replace("}}", "}")
    assert extract_calls(broken, request) == (broken, ())


@given(cuts=st.lists(st.integers(0, len("Hi <b> there " + CALL)), max_size=8))
def test_splitter_passes_content_and_holds_calls_however_the_text_is_cut(cuts):
    text = "Hi <b> there " + CALL
    bounds = sorted({0, len(text), *cuts})
    splitter = CallStreamSplitter(parse_tools({"tools": [WEATHER]}))
    passed = "".join(splitter.feed(text[a:b]) for a, b in pairwise(bounds))
    rest, calls = splitter.finish()
    assert passed.startswith("Hi <b> there") and "<tool_call>" not in passed
    assert (passed + rest).strip() == "Hi <b> there" and len(calls) == 1
