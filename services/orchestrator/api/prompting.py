"""From a validated body to a GenerationRequest: model check, tokenization, context limits."""

from __future__ import annotations

import uuid
from dataclasses import replace

import numpy as np

from libs.service.errors import InvalidArgument, NotFound
from libs.text.context import TextContext
from services.orchestrator.api.openai_request import ChatCompletionBody, CommonOptions, CompletionBody
from services.orchestrator.api.openai_tools import output_lark
from services.orchestrator.api.structured import grammar_checker, response_format_lark
from services.orchestrator.engine.domain import GenerationRequest, ServedModel, TokenLimits


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
