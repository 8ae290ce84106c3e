from __future__ import annotations

import pytest

from libs.service.errors import FornaxError, InvalidArgument, NotFound
from services.orchestrator.api.openai_request import (
    chat_prompt_ids,
    check_model,
    completion_prompt_ids,
    generation_request,
    parse_chat_completion,
    parse_completion,
    parse_json_object,
)
from services.orchestrator.engine.domain import SamplingParams, ServedModel, StageLayout, TokenLimits

SERVED = ServedModel("tiny", context_length=64, vocab_size=420,
                     stages=(StageLayout(0, 2, 8),))
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def test_full_chat_body_parses():
    body = parse_chat_completion({
        **CHAT, "max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": -1,
        "stop": "x", "stream": True, "stream_options": {"include_usage": True}, "n": 1,
        "presence_penalty": 0, "user": "u1"})
    assert body.options.sampling == SamplingParams(temperature=0.5, top_p=0.9, top_k=40, seed=2**64 - 1)
    assert body.options.stop == ("x",)
    assert body.options.stream and body.options.include_usage
    assert body.options.max_tokens == 5


def test_top_k_minus_one_disables_like_zero():
    assert parse_chat_completion({**CHAT, "top_k": -1}).options.sampling.top_k == 0


def test_text_parts_are_joined():
    body = parse_chat_completion({"model": "tiny", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text",
                                                                     "text": "b"}]}]})
    assert body.messages[0].content == "ab"


@pytest.mark.parametrize("patch, reason, param", [
    ({"max_tokens": -1}, "INVALID_MAX_TOKENS", "max_tokens"),
    ({"max_tokens": 0}, "INVALID_MAX_TOKENS", "max_tokens"),
    ({"max_tokens": 2.5}, "INVALID_MAX_TOKENS", "max_tokens"),
    ({"temperature": 3}, "INVALID_TEMPERATURE", "temperature"),
    ({"temperature": "hot"}, "INVALID_TYPE", "temperature"),
    ({"top_p": 0}, "INVALID_TOP_P", "top_p"),
    ({"top_k": -2}, "INVALID_TOP_K", "top_k"),
    ({"seed": 2**64}, "INVALID_SEED", "seed"),
    ({"n": 0}, "INVALID_N", "n"),
    ({"n": 17}, "INVALID_N", "n"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "INVALID_STOP", "stop"),
    ({"stop": [""]}, "INVALID_STOP", "stop"),
    ({"stream": "yes"}, "INVALID_TYPE", "stream"),
    ({"stream_options": {"include_usage": True}}, "INVALID_STREAM_OPTIONS", "stream_options"),
    ({"tools": []}, "INVALID_TOOLS", "tools"),
    ({"tool_choice": "required"}, "INVALID_TOOL_CHOICE", "tool_choice"),
    ({"response_format": {"type": "xml"}}, "INVALID_RESPONSE_FORMAT", "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "strin"}}}}, "INVALID_SCHEMA", "response_format.json_schema.schema"),
    ({"presence_penalty": 2.5}, "INVALID_PENALTY", "presence_penalty"),
    ({"logit_bias": {"a": 1}}, "INVALID_LOGIT_BIAS", "logit_bias"),
    ({"logit_bias": {"5": 101}}, "INVALID_LOGIT_BIAS", "logit_bias"),
    ({"logprobs": 1}, "INVALID_TYPE", "logprobs"),
    ({"top_logprobs": 3}, "INVALID_LOGPROBS", "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "INVALID_LOGPROBS", "top_logprobs"),
    ({"stop_token_ids": [-1]}, "INVALID_STOP", "stop_token_ids"),
    ({"ignore_eos": "yes"}, "INVALID_TYPE", "ignore_eos"),
    ({"echo": True}, "UNSUPPORTED_PARAMETER", "echo"),
    ({"model": ""}, "INVALID_MODEL", "model"),
    ({"messages": []}, "INVALID_MESSAGES", "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "INVALID_MESSAGES",
     "messages[0].tool_call_id"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "INVALID_MESSAGES", "messages[0].role"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "INVALID_MESSAGES",
     "messages[0].tool_calls"),
    ({"messages": [{"role": "user", "content": 3}]}, "INVALID_MESSAGES",
     "messages[0].content"),
    ({"max_tokens": 3, "max_completion_tokens": 3}, "INVALID_MAX_TOKENS",
     "max_completion_tokens"),
])
def test_chat_violations_name_the_parameter(patch, reason, param):
    with pytest.raises(InvalidArgument) as info:
        parse_chat_completion({**CHAT, **patch})
    assert (info.value.reason, info.value.field) == (reason, param)


@pytest.mark.parametrize("prompt, expected", [
    ("hello", "hello"), ([1, 2, 3], (1, 2, 3)), (["hello"], "hello"), ([[4, 5]], (4, 5))])
def test_completion_prompt_forms(prompt, expected):
    assert parse_completion({"model": "tiny", "prompt": prompt}).prompt == expected


@pytest.mark.parametrize("prompt", ["", [], ["a", "b"], [1, -2], [1, True], None, 7])
def test_bad_completion_prompts(prompt):
    with pytest.raises(InvalidArgument) as info:
        parse_completion({"model": "tiny", "prompt": prompt})
    assert (info.value.reason, info.value.field) == ("INVALID_PROMPT", "prompt")


@pytest.mark.parametrize("raw", [b"{", b"[1]", b"\xff", b"null"])
def test_malformed_json(raw):
    with pytest.raises(InvalidArgument) as info:
        parse_json_object(raw)
    assert info.value.reason == "INVALID_JSON"


def test_unknown_model_is_not_found():
    with pytest.raises(NotFound) as info:
        check_model("gpt-4", SERVED)
    assert (info.value.reason, info.value.field) == ("MODEL_NOT_FOUND", "model")


def test_context_limits(text_context):
    opts = parse_chat_completion(CHAT).options
    ids = tuple(range(10, 74))  # 64 tokens: fills the context
    with pytest.raises(InvalidArgument) as info:
        generation_request("r", ids, opts, SERVED, TokenLimits(16), "messages")
    assert (info.value.reason, info.value.field) == ("CONTEXT_LENGTH_EXCEEDED", "messages")
    with pytest.raises(FornaxError) as info:
        generation_request("r", ids[:60], parse_chat_completion({**CHAT, "max_tokens": 5})
                           .options, SERVED, TokenLimits(16), "messages")
    assert (info.value.reason, info.value.field) == ("CONTEXT_LENGTH_EXCEEDED", "max_tokens")
    assert generation_request("r", ids[:60], opts, SERVED, TokenLimits(16), "messages").max_tokens == 4
    assert generation_request("r", ids[:10], opts, SERVED, TokenLimits(16), "messages").max_tokens == 16


def test_prompt_tokenization(text_context):
    chat = parse_chat_completion(CHAT)
    ids = chat_prompt_ids(chat, text_context)
    assert text_context.tokenizer.decode(list(ids), skip_special_tokens=False) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(InvalidArgument, match="outside the vocabulary"):
        completion_prompt_ids(parse_completion({"model": "tiny", "prompt": [420]}),
                              text_context, SERVED)


def test_configured_caps_refuse_long_prompts_and_large_max_tokens(text_context):
    opts = parse_chat_completion(CHAT).options
    limits = TokenLimits(default_max_tokens=16, max_tokens_cap=8, max_prompt_tokens=20)
    with pytest.raises(InvalidArgument) as info:
        generation_request("r", tuple(range(10, 31)), opts, SERVED, limits, "messages")
    assert (info.value.reason, info.value.field) == ("PROMPT_TOO_LONG", "messages")
    asks = parse_chat_completion({**CHAT, "max_tokens": 9}).options
    with pytest.raises(InvalidArgument) as info:
        generation_request("r", tuple(range(10, 20)), asks, SERVED, limits, "messages")
    assert (info.value.reason, info.value.field) == ("MAX_TOKENS_TOO_LARGE", "max_tokens")
    # With no max_tokens asked, the default is held to the cap.
    assert generation_request("r", tuple(range(10, 20)), opts, SERVED, limits, "messages").max_tokens == 8
