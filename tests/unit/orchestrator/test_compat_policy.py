"""The compatibility policy holds for every field of OpenAI's chat and completions request
schemas: accepted fields parse and take effect, ignored ones change nothing, neutral-only and
refused ones are 400s naming the field; the README shows exactly the policy table."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.service.errors import InvalidArgument
from services.orchestrator.api.compat import (
    CHAT_POLICY,
    COMPLETION_POLICY,
    Policy,
    policy_table,
)
from services.orchestrator.api.openai_request import parse_chat_completion, parse_completion

README = Path(__file__).parents[3] / "services" / "orchestrator" / "README.md"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "tiny", "prompt": "hi"}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}

# Every request field of OpenAI's CreateChatCompletionRequest and CreateCompletionRequest, with
# a value that is not the field's neutral default.
OPENAI_CHAT_FIELDS = {
    "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
    "model": "tiny", "audio": {"voice": "alloy", "format": "wav"}, "frequency_penalty": 0.5,
    "function_call": "auto", "functions": [{"name": "f"}], "logit_bias": {"5": 3},
    "logprobs": True, "max_completion_tokens": 7, "max_tokens": 7, "metadata": {"k": "v"},
    "modalities": ["text", "audio"], "n": 2, "parallel_tool_calls": False,
    "prediction": {"type": "content", "content": "x"}, "presence_penalty": 0.5,
    "prompt_cache_key": "k", "reasoning_effort": "low", "safety_identifier": "u1",
    "response_format": {"type": "json_object"}, "seed": 3, "service_tier": "auto",
    "stop": ["x"], "store": True, "stream": True, "stream_options": {"include_usage": True},
    "temperature": 0.5, "tool_choice": "required", "tools": [TOOL], "top_logprobs": 2,
    "top_p": 0.5, "user": "u1", "verbosity": "low", "web_search_options": {},
}
OPENAI_COMPLETION_FIELDS = {
    "model": "tiny", "prompt": [5, 6], "best_of": 3, "echo": True, "frequency_penalty": 0.5,
    "logit_bias": {"5": 3}, "logprobs": 2, "max_tokens": 7, "n": 2, "presence_penalty": 0.5,
    "seed": 3, "stop": "x", "stream": True, "stream_options": {"include_usage": True},
    "suffix": "end", "temperature": 0.5, "top_p": 0.5, "user": "u1",
}
# Fields that need a companion to be meaningful.
COMPANIONS = {"top_logprobs": {"logprobs": True}, "tool_choice": {"tools": [TOOL]},
              "stream_options": {"stream": True}, "max_completion_tokens": {}}


def _cases(fields: dict, table: dict):
    for name, value in fields.items():
        yield pytest.param(name, value, table[name] if name in table else None, id=name)


def test_every_openai_field_has_a_policy():
    assert set(OPENAI_CHAT_FIELDS) <= set(CHAT_POLICY)
    assert set(OPENAI_COMPLETION_FIELDS) <= set(COMPLETION_POLICY)
    extensions = {n for n, r in {**CHAT_POLICY, **COMPLETION_POLICY}.items() if r.extension}
    assert set(CHAT_POLICY) - set(OPENAI_CHAT_FIELDS) == extensions
    assert set(COMPLETION_POLICY) - set(OPENAI_COMPLETION_FIELDS) == extensions


def _check(parse, base: dict, name: str, value, rule) -> None:
    body = {**base, **COMPANIONS.get(name, {}), name: value}
    if rule.policy is Policy.ACCEPTED:
        parsed = parse(body)
        assert parsed != parse({**base, **COMPANIONS.get(name, {})}) or name in ("model",)
    elif rule.policy is Policy.IGNORED:
        assert parse(body) == parse({k: v for k, v in body.items() if k != name})
    else:
        with pytest.raises(InvalidArgument) as info:
            parse(body)
        assert (info.value.reason, info.value.field) == ("UNSUPPORTED_PARAMETER", name)
        for neutral in rule.neutral:
            parse({**base, name: neutral})


@pytest.mark.parametrize("name, value, rule", list(_cases(OPENAI_CHAT_FIELDS, CHAT_POLICY)))
def test_chat_field_policy(name, value, rule):
    _check(parse_chat_completion, CHAT, name, value, rule)


@pytest.mark.parametrize("name, value, rule",
                         list(_cases(OPENAI_COMPLETION_FIELDS, COMPLETION_POLICY)))
def test_completion_field_policy(name, value, rule):
    _check(parse_completion, COMPLETION, name, value, rule)


def test_unknown_fields_are_refused_by_name():
    with pytest.raises(InvalidArgument) as info:
        parse_chat_completion({**CHAT, "temprature": 0.5})
    assert (info.value.reason, info.value.field) == ("UNSUPPORTED_PARAMETER", "temprature")


@pytest.mark.parametrize("title, table", [("Chat completions", CHAT_POLICY),
                                          ("Completions", COMPLETION_POLICY)])
def test_readme_shows_the_policy_table(title, table):
    text = README.read_text()
    section = text.split(f"### {title} request fields\n", 1)[1].strip().split("\n\n")[0]
    rows = [tuple(cell.strip().strip("`") for cell in line.strip("|").split("|"))
            for line in section.splitlines()[2:]]
    assert rows == policy_table(table)
