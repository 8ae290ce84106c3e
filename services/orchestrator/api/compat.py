"""The compatibility policy: every field of the OpenAI chat and completions request schemas,
and what this server does with it. The parser consults this table for every key, so the table
is the policy; the orchestrator README renders it for people and a test holds both to it.

- ACCEPTED: implemented with OpenAI semantics (values validated; a bad one is a 400).
- IGNORED: accepted and has no effect on the output (bookkeeping fields for other services).
- NEUTRAL_ONLY: only the listed neutral values are accepted; any other value is refused.
- REFUSED: any value is a 400 `unsupported_parameter` naming the field.
Unknown fields are refused the same way. Extensions (vLLM-compatible) are marked.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class Policy(enum.Enum):
    ACCEPTED = "accepted"
    IGNORED = "ignored"
    NEUTRAL_ONLY = "neutral only"
    REFUSED = "refused"


@dataclass(frozen=True)
class FieldPolicy:
    policy: Policy
    note: str
    neutral: tuple[Any, ...] = ()  # NEUTRAL_ONLY: the values that are accepted
    extension: bool = False  # not in OpenAI's schema; vLLM's spelling


_A, _I, _N, _R = Policy.ACCEPTED, Policy.IGNORED, Policy.NEUTRAL_ONLY, Policy.REFUSED

_SHARED = {
    "model": FieldPolicy(_A, "must name the served model"),
    "frequency_penalty": FieldPolicy(_A, "[-2, 2], over generated tokens"),
    "presence_penalty": FieldPolicy(_A, "[-2, 2], over generated tokens"),
    "logit_bias": FieldPolicy(_A, "token id -> [-100, 100], at most 300 entries"),
    "max_tokens": FieldPolicy(_A, "prompt + max_tokens must fit the context"),
    "n": FieldPolicy(_A, "1..16 independent choices, seeds derived per choice"),
    "seed": FieldPolicy(_A, "64-bit; same seed, same tokens"),
    "stop": FieldPolicy(_A, "up to 4 strings, never emitted"),
    "stream": FieldPolicy(_A, "server-sent events"),
    "stream_options": FieldPolicy(_A, "include_usage"),
    "temperature": FieldPolicy(_A, "[0, 2]; 0 is greedy"),
    "top_p": FieldPolicy(_A, "(0, 1]"),
    "user": FieldPolicy(_I, "opaque end-user id, logged nowhere"),
    "top_k": FieldPolicy(_A, "0 or -1 disables", extension=True),
    "stop_token_ids": FieldPolicy(_A, "ids that end the output like eos", extension=True),
    "ignore_eos": FieldPolicy(_A, "eos does not end the output; not with an output grammar",
                              extension=True),
    "cache_salt": FieldPolicy(_A, "added to the tenant's prefix-cache salt", extension=True),
    "return_token_ids": FieldPolicy(_A, "each choice (each streamed chunk) carries its generated token ids as "
                                        "token_ids", extension=True),
}

CHAT_POLICY: dict[str, FieldPolicy] = {
    **_SHARED,
    "messages": FieldPolicy(_A, "system, user, assistant (with tool_calls), tool; text parts"),
    "max_completion_tokens": FieldPolicy(_A, "alias of max_tokens (not both)"),
    "logprobs": FieldPolicy(_A, "raw model logprobs of each sampled token"),
    "top_logprobs": FieldPolicy(_A, "0..20, with logprobs true"),
    "response_format": FieldPolicy(_A, "text, json_object, json_schema (always enforced)"),
    "tools": FieldPolicy(_A, "function tools, rendered by the chat template"),
    "tool_choice": FieldPolicy(_A, "none, auto, required, or a named function"),
    "parallel_tool_calls": FieldPolicy(_I, "at most one call is forced per turn"),
    "metadata": FieldPolicy(_I, "stored nowhere"),
    "store": FieldPolicy(_N, "nothing is stored", neutral=(False, None)),
    "service_tier": FieldPolicy(_I, "one tier"),
    "prompt_cache_key": FieldPolicy(_I, "prefix reuse is keyed by the prompt's tokens and tenant"),
    "safety_identifier": FieldPolicy(_I, "opaque end-user id"),
    "modalities": FieldPolicy(_N, "text only", neutral=(["text"], None)),
    "audio": FieldPolicy(_R, "no audio output"),
    "prediction": FieldPolicy(_R, "no predicted outputs"),
    "reasoning_effort": FieldPolicy(_R, "the model has no reasoning mode"),
    "verbosity": FieldPolicy(_R, "not a model control here"),
    "web_search_options": FieldPolicy(_R, "no web search"),
    "functions": FieldPolicy(_R, "deprecated: use tools"),
    "function_call": FieldPolicy(_R, "deprecated: use tool_choice"),
}

COMPLETION_POLICY: dict[str, FieldPolicy] = {
    **_SHARED,
    "prompt": FieldPolicy(_A, "a string, token ids, or a batch of one"),
    "logprobs": FieldPolicy(_A, "0..20 top entries per token"),
    "echo": FieldPolicy(_N, "the prompt is not echoed", neutral=(False, None)),
    "best_of": FieldPolicy(_N, "one candidate per choice", neutral=(1, None)),
    "suffix": FieldPolicy(_N, "no insertion", neutral=(None,)),
}


def unsupported(body: dict[str, Any], table: dict[str, FieldPolicy]) -> tuple[str, str] | None:
    """(field, why) for the first field the policy refuses, or None."""
    for key in sorted(body):
        rule = table.get(key)
        if rule is None:
            return key, f"unrecognized request argument: {key}"
        if rule.policy is Policy.REFUSED:
            return key, f"{key} is not supported: {rule.note}"
        if rule.policy is Policy.NEUTRAL_ONLY and not any(
                body[key] == v and type(body[key]) is type(v) for v in rule.neutral):
            return key, f"{key}={body[key]!r} is not supported ({rule.note})"
    return None


def policy_table(table: dict[str, FieldPolicy]) -> list[tuple[str, str, str]]:
    """(field, policy, note) rows in field order, as the README shows them."""
    return [(name + (" (extension)" if rule.extension else ""), rule.policy.value, rule.note)
            for name, rule in sorted(table.items())]
