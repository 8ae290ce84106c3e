"""OpenAI-compatible request bodies, from JSON to a GenerationRequest: parsing and validation
into typed values, then the model check, tokenization and the context window.

Every violation raises a FornaxError whose reason (lower-cased) becomes the OpenAI error
`code` and whose field becomes `param`, so a client learns which parameter is wrong and why.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from libs.service.errors import InvalidArgument, NotFound
from libs.text.chat_template import CHAT_ROLES, ChatMessage, ToolCall
from libs.text.context import TextContext
from services.orchestrator.api.compat import CHAT_POLICY, COMPLETION_POLICY, FieldPolicy, unsupported
from services.orchestrator.api.openai_tools import ToolRequest, output_lark, parse_tools
from services.orchestrator.api.structured import (
    TEXT_FORMAT,
    ResponseFormat,
    grammar_checker,
    parse_response_format,
    response_format_lark,
)
from services.orchestrator.engine.domain import GenerationRequest, SamplingParams, ServedModel, TokenLimits

MAX_STOP_STRINGS = 4
_U64 = 2**64

MAX_LOGIT_BIAS_ENTRIES = 300
MAX_TOP_LOGPROBS = 20
MAX_N = 16


@dataclass(frozen=True)
class CommonOptions:
    max_tokens: int | None
    sampling: SamplingParams
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    n: int = 1
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False  # generate to max_tokens (or a stop) past end-of-sequence
    return_token_ids: bool = False  # each choice and chunk carries its generated ids (vLLM's extension)


@dataclass(frozen=True)
class ChatCompletionBody:
    model: str
    messages: tuple[ChatMessage, ...]
    options: CommonOptions
    response_format: ResponseFormat = TEXT_FORMAT
    tools: ToolRequest = ToolRequest()


@dataclass(frozen=True)
class CompletionBody:
    model: str
    prompt: str | tuple[int, ...]
    options: CommonOptions


def bad(param: str, reason: str, message: str) -> InvalidArgument:
    return InvalidArgument(message, reason=reason, field=param)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgument(f"request body is not valid JSON: {exc}",
                              reason="INVALID_JSON") from exc
    if not isinstance(body, dict):
        raise InvalidArgument("request body must be a JSON object", reason="INVALID_JSON")
    return body


def parse_chat_completion(body: dict[str, Any]) -> ChatCompletionBody:
    _check_keys(body, CHAT_POLICY)
    if "max_completion_tokens" in body and "max_tokens" in body:
        raise bad("max_completion_tokens", "INVALID_MAX_TOKENS",
                  "give max_tokens or max_completion_tokens, not both")
    if body.get("max_completion_tokens") is not None:
        body = {**body, "max_tokens": body["max_completion_tokens"]}
    options = parse_options(body)
    logprobs = _opt_bool(body, "logprobs", False)
    top = body.get("top_logprobs")
    if top is not None and (not _is_int(top) or not 0 <= top <= MAX_TOP_LOGPROBS or not logprobs):
        raise bad("top_logprobs", "INVALID_LOGPROBS",
                  f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}] with logprobs true")
    if logprobs:
        options = replace(options, sampling=replace(options.sampling, top_logprobs=top or 0))
    return ChatCompletionBody(model=_model(body), messages=_messages(body.get("messages")),
                              options=options,
                              response_format=parse_response_format(body.get("response_format")),
                              tools=parse_tools(body))


def parse_completion(body: dict[str, Any]) -> CompletionBody:
    _check_keys(body, COMPLETION_POLICY)
    options = parse_options(body)
    top = body.get("logprobs")
    if top is not None:
        if not _is_int(top) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise bad("logprobs", "INVALID_LOGPROBS",
                      f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}]")
        options = replace(options, sampling=replace(options.sampling, top_logprobs=top))
    return CompletionBody(model=_model(body), prompt=_prompt(body.get("prompt")),
                          options=options)


_STRING_FIELDS = ("user", "safety_identifier", "prompt_cache_key", "service_tier")


def _check_keys(body: dict[str, Any], table: dict[str, FieldPolicy]) -> None:
    refused = unsupported(body, table)
    if refused is not None:
        raise bad(refused[0], "UNSUPPORTED_PARAMETER", refused[1])
    for key in _STRING_FIELDS:
        if body.get(key) is not None and not isinstance(body[key], str):
            raise bad(key, "INVALID_TYPE", f"{key} must be a string")
    if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
        raise bad("metadata", "INVALID_TYPE", "metadata must be an object")


def _model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", "INVALID_MODEL", "model is required and must be a non-empty string")
    return model


def parse_options(body: dict[str, Any]) -> CommonOptions:
    """Sampling, stop, limits and streaming options, by their OpenAI names."""
    stream = _opt_bool(body, "stream", False)
    stream_options = body.get("stream_options")
    include_usage = False
    if stream_options is not None:
        if not stream:
            raise bad("stream_options", "INVALID_STREAM_OPTIONS",
                      "stream_options is only allowed when stream is true")
        if not isinstance(stream_options, dict) or set(stream_options) - {"include_usage"}:
            raise bad("stream_options", "INVALID_STREAM_OPTIONS",
                      "stream_options accepts only include_usage")
        include_usage = _opt_bool(stream_options, "include_usage", False,
                                  "stream_options.include_usage")
    n = body.get("n", 1) if body.get("n") is not None else 1
    if not _is_int(n) or not 1 <= n <= MAX_N:
        raise bad("n", "INVALID_N", f"n must be an integer in [1, {MAX_N}], got {n!r}")
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(_is_int(t) and t >= 0 for t in stop_ids):
        raise bad("stop_token_ids", "INVALID_STOP", "stop_token_ids must be a list of token ids")
    return CommonOptions(max_tokens=_max_tokens(body.get("max_tokens")),
                         sampling=_sampling(body), stop=_stop(body.get("stop")),
                         stream=stream, include_usage=include_usage, n=n,
                         stop_token_ids=tuple(stop_ids),
                         ignore_eos=_opt_bool(body, "ignore_eos", False),
                         return_token_ids=_opt_bool(body, "return_token_ids", False))


def _sampling(body: dict[str, Any]) -> SamplingParams:
    temperature = _opt_number(body, "temperature", 1.0)
    if not 0.0 <= temperature <= 2.0:
        raise bad("temperature", "INVALID_TEMPERATURE",
                  f"temperature must be between 0 and 2, got {temperature}")
    top_p = _opt_number(body, "top_p", 1.0)
    if not 0.0 < top_p <= 1.0:
        raise bad("top_p", "INVALID_TOP_P", f"top_p must be in (0, 1], got {top_p}")
    top_k = body.get("top_k")
    if top_k is not None and (not _is_int(top_k) or top_k < -1):
        raise bad("top_k", "INVALID_TOP_K",
                  f"top_k must be an integer >= 0 (0 or -1 disable it), got {top_k!r}")
    seed = body.get("seed")
    if seed is not None and (not _is_int(seed) or not -(2**63) <= seed < _U64):
        raise bad("seed", "INVALID_SEED", f"seed must be a 64-bit integer, got {seed!r}")
    return SamplingParams(temperature=temperature, top_p=top_p, top_k=max(top_k or 0, 0),
                          seed=None if seed is None else seed % _U64,
                          presence_penalty=_penalty(body, "presence_penalty"),
                          frequency_penalty=_penalty(body, "frequency_penalty"),
                          logit_bias=_logit_bias(body.get("logit_bias")))


def _penalty(body: dict[str, Any], key: str) -> float:
    value = _opt_number(body, key, 0.0)
    if not -2.0 <= value <= 2.0:
        raise bad(key, "INVALID_PENALTY", f"{key} must be between -2 and 2, got {value}")
    return value


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI spells the map with token ids as string keys; bounds checked against the vocab later."""
    if value is None:
        return ()
    if not isinstance(value, dict) or len(value) > MAX_LOGIT_BIAS_ENTRIES:
        raise bad("logit_bias", "INVALID_LOGIT_BIAS",
                  f"logit_bias must be an object of at most {MAX_LOGIT_BIAS_ENTRIES} entries")
    pairs = []
    for key, bias in value.items():
        if not isinstance(key, str) or not key.isdigit():
            raise bad("logit_bias", "INVALID_LOGIT_BIAS", f"logit_bias key {key!r} is not a token id")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise bad("logit_bias", "INVALID_LOGIT_BIAS",
                      f"logit_bias[{key}] must be a number in [-100, 100], got {bias!r}")
        pairs.append((int(key), float(bias)))
    return tuple(sorted(pairs))


def _max_tokens(value: Any) -> int | None:
    if value is None:
        return None
    if not _is_int(value):
        raise bad("max_tokens", "INVALID_MAX_TOKENS",
                  f"max_tokens must be an integer, got {value!r}")
    if value < 1:
        raise bad("max_tokens", "INVALID_MAX_TOKENS",
                  f"max_tokens must be at least 1, got {value}")
    return value


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if (not isinstance(stops, list) or len(stops) > MAX_STOP_STRINGS
            or not all(isinstance(s, str) and s for s in stops)):
        raise bad("stop", "INVALID_STOP",
                  f"stop must be a non-empty string or a list of at most {MAX_STOP_STRINGS} "
                  "non-empty strings")
    return tuple(stops)


def _messages(value: Any) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list) or not value:
        raise bad("messages", "INVALID_MESSAGES", "messages must be a non-empty list")
    return tuple(_message(m, f"messages[{i}]") for i, m in enumerate(value))


_MESSAGE_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id", "refusal"}


def _message(value: Any, where: str) -> ChatMessage:
    if not isinstance(value, dict) or set(value) - _MESSAGE_KEYS:
        raise bad(where, "INVALID_MESSAGES",
                  f"{where} must be an object with role and content (and optionally name, "
                  "tool_calls on an assistant message, tool_call_id on a tool message)")
    role = value.get("role")
    if role not in CHAT_ROLES:
        raise bad(f"{where}.role", "INVALID_MESSAGES",
                  f"{where}.role must be one of {', '.join(CHAT_ROLES)}, got {role!r}")
    calls = _tool_calls(value.get("tool_calls"), role, f"{where}.tool_calls")
    call_id = value.get("tool_call_id")
    if (role == "tool") != isinstance(call_id, str):
        raise bad(f"{where}.tool_call_id", "INVALID_MESSAGES",
                  "a tool message needs a string tool_call_id, and only a tool message has one")
    content = value.get("content")
    text = "" if content is None and calls else _content(content, f"{where}.content")
    return ChatMessage(role=role, content=text, tool_calls=calls, tool_call_id=call_id)


def _tool_calls(value: Any, role: str, where: str) -> tuple[ToolCall, ...]:
    if value is None:
        return ()
    if role != "assistant" or not isinstance(value, list) or not value:
        raise bad(where, "INVALID_MESSAGES", "tool_calls is a non-empty list on assistant messages")
    calls = []
    for i, call in enumerate(value):
        function = call.get("function") if isinstance(call, dict) else None
        if (not isinstance(function, dict) or call.get("type", "function") != "function"
                or not isinstance(call.get("id"), str) or not isinstance(function.get("name"), str)
                or not isinstance(function.get("arguments"), str)):
            raise bad(f"{where}[{i}]", "INVALID_MESSAGES",
                      "a tool call needs id, type function, and function.name and "
                      "function.arguments strings")
        try:
            json.loads(function["arguments"])
        except json.JSONDecodeError:
            raise bad(f"{where}[{i}].function.arguments", "INVALID_MESSAGES",
                      "function.arguments must be JSON text") from None
        calls.append(ToolCall(call["id"], function["name"], function["arguments"]))
    return tuple(calls)


def _content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            and set(p) == {"type", "text"} for p in value):
        return "".join(p["text"] for p in value)
    raise bad(where, "INVALID_MESSAGES",
              f"{where} must be a string or a list of text parts")


def _prompt(value: Any) -> str | tuple[int, ...]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]  # a batch of one prompt
    if isinstance(value, str):
        if not value:
            raise bad("prompt", "INVALID_PROMPT", "prompt must not be empty")
        return value
    if isinstance(value, list) and value and all(_is_int(t) and t >= 0 for t in value):
        return tuple(value)
    raise bad("prompt", "INVALID_PROMPT",
              "prompt must be a non-empty string or a non-empty list of token ids "
              "(batches of several prompts are not supported)")


def _opt_bool(body: dict[str, Any], key: str, default: bool, param: str | None = None) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(param or key, "INVALID_TYPE", f"{param or key} must be a boolean")
    return value


def _opt_number(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(key, "INVALID_TYPE", f"{key} must be a number, got {value!r}")
    return float(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ----- from a validated body to a GenerationRequest -----

def _check_caps(prompt_tokens: int, max_tokens: int | None, limits: TokenLimits, prompt_param: str) -> None:
    if limits.max_prompt_tokens and prompt_tokens > limits.max_prompt_tokens:
        raise InvalidArgument(f"the prompt has {prompt_tokens} tokens; this server accepts at most "
                              f"{limits.max_prompt_tokens}", reason="PROMPT_TOO_LONG", field=prompt_param)
    if limits.max_tokens_cap and max_tokens is not None and max_tokens > limits.max_tokens_cap:
        raise InvalidArgument(f"max_tokens {max_tokens} exceeds this server's cap of {limits.max_tokens_cap}",
                              reason="MAX_TOKENS_TOO_LARGE", field="max_tokens")


def check_model(model: str, served: ServedModel) -> None:
    if model != served.model_id:
        raise NotFound(f"model {model!r} does not exist; this route serves {served.model_id!r}",
                       reason="MODEL_NOT_FOUND", field="model")


def chat_prompt_ids(body: ChatCompletionBody, text: TextContext) -> tuple[int, ...]:
    # Tools are rendered even with tool_choice none: the model sees them, it just cannot call.
    return tuple(text.encode_chat(list(body.messages), tools=body.tools.template_tools()))


def chat_options(body: ChatCompletionBody, text: TextContext, served: ServedModel) -> CommonOptions:
    """The body's options with its output grammar (response_format, forced tool calls)."""
    lark = output_lark(body.tools, response_format_lark(body.response_format))
    if lark is None:
        return body.options
    param = "tool_choice" if body.tools.forced else "response_format"
    if body.options.ignore_eos:  # a grammar ends the output at eos; it cannot be ignored
        raise InvalidArgument(f"ignore_eos cannot be combined with an output grammar ({param})",
                              reason="INVALID_IGNORE_EOS", field="ignore_eos")
    spec = grammar_checker(text, served.vocab_size).spec(lark, param)
    return replace(body.options, sampling=replace(body.options.sampling, grammar=spec))


def completion_prompt_ids(body: CompletionBody, text: TextContext,
                          served: ServedModel) -> tuple[int, ...]:
    if isinstance(body.prompt, str):
        return tuple(text.tokenizer.encode(body.prompt))
    return check_token_ids(body.prompt, served, "prompt")


def check_token_ids(ids: tuple[int, ...], served: ServedModel, param: str) -> tuple[int, ...]:
    vocab = served.vocab_size
    for token_id in ids:
        if not 0 <= token_id < vocab:
            raise InvalidArgument(f"prompt token id {token_id} is outside the vocabulary "
                                  f"[0, {vocab})", reason="INVALID_PROMPT", field=param)
    return ids


def generation_request(request_id: str, prompt_ids: tuple[int, ...], options: CommonOptions,
                       served: ServedModel, limits: TokenLimits, prompt_param: str,
                       deadline_budget_ns: int | None = None) -> GenerationRequest:
    """Applies the context window: the prompt plus max_tokens must fit in it."""
    context = served.context_length
    _check_caps(len(prompt_ids), options.max_tokens, limits, prompt_param)
    if not prompt_ids:
        raise InvalidArgument("the prompt encodes to zero tokens", reason="INVALID_PROMPT",
                              field=prompt_param)
    if len(prompt_ids) >= context:
        raise InvalidArgument(
            f"this model's maximum context length is {context} tokens; the prompt has "
            f"{len(prompt_ids)} tokens and leaves no room to generate",
            reason="CONTEXT_LENGTH_EXCEEDED", field=prompt_param)
    room = context - len(prompt_ids)
    max_tokens = options.max_tokens
    if max_tokens is None:
        default = min(limits.default_max_tokens, limits.max_tokens_cap or limits.default_max_tokens)
        max_tokens = min(default, room)
    elif max_tokens > room:
        raise InvalidArgument(
            f"this model's maximum context length is {context} tokens; the prompt has "
            f"{len(prompt_ids)} tokens and max_tokens asks for {max_tokens} more",
            reason="CONTEXT_LENGTH_EXCEEDED", field="max_tokens")
    for token_id, _ in options.sampling.logit_bias:
        if token_id >= served.vocab_size:
            raise InvalidArgument(f"logit_bias token id {token_id} is outside the vocabulary "
                                  f"[0, {served.vocab_size})", reason="INVALID_LOGIT_BIAS",
                                  field="logit_bias")
    # The sample after the prompt's last row is the first generated token.
    sampling = replace(options.sampling, first_sample_position=len(prompt_ids) - 1)
    for token_id in options.stop_token_ids:
        if token_id >= served.vocab_size:
            raise InvalidArgument(f"stop token id {token_id} is outside the vocabulary",
                                  reason="INVALID_STOP", field="stop_token_ids")
    return GenerationRequest(request_id=request_id, prompt_token_ids=prompt_ids,
                             max_tokens=max_tokens, sampling=sampling,
                             stop=options.stop, stop_token_ids=options.stop_token_ids,
                             ignore_eos=options.ignore_eos,
                             deadline_budget_ns=deadline_budget_ns)


def choice_requests(request: GenerationRequest, n: int) -> list[GenerationRequest]:
    """`n` independent generations: their own request ids and random streams. A seeded
    request gives choice i the seed derived from (seed, i), so each choice is reproducible
    and no two share a stream; choice 0 keeps the seed itself."""
    if n == 1:
        return [request]
    out = [request]
    for index in range(1, n):
        seed = request.sampling.seed
        if seed is not None:
            words = np.random.SeedSequence([seed, index]).generate_state(2, dtype=np.uint32)
            seed = (int(words[0]) << 32) | int(words[1])
        out.append(replace(request, request_id=str(uuid.uuid4()),
                           sampling=replace(request.sampling, seed=seed)))
    return out
