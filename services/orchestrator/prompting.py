"""From a validated body to a GenerationRequest: model check, tokenization, context limits."""

from __future__ import annotations

from libs.service.errors import InvalidArgument, NotFound
from libs.text.context import TextContext
from services.orchestrator.domain import GenerationRequest, ServedModel
from services.orchestrator.openai_request import ChatCompletionBody, CommonOptions, CompletionBody


def check_model(model: str, served: ServedModel) -> None:
    if model != served.model_id:
        raise NotFound(f"model {model!r} does not exist; this route serves {served.model_id!r}",
                       reason="MODEL_NOT_FOUND", field="model")


def chat_prompt_ids(body: ChatCompletionBody, text: TextContext) -> tuple[int, ...]:
    return tuple(text.encode_chat(list(body.messages)))


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
                       served: ServedModel, default_max_tokens: int, prompt_param: str,
                       deadline_budget_ns: int | None = None) -> GenerationRequest:
    """Applies the context window: the prompt plus max_tokens must fit in it."""
    context = served.context_length
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
        max_tokens = min(default_max_tokens, room)
    elif max_tokens > room:
        raise InvalidArgument(
            f"this model's maximum context length is {context} tokens; the prompt has "
            f"{len(prompt_ids)} tokens and max_tokens asks for {max_tokens} more",
            reason="CONTEXT_LENGTH_EXCEEDED", field="max_tokens")
    return GenerationRequest(request_id=request_id, prompt_token_ids=prompt_ids,
                             max_tokens=max_tokens, sampling=options.sampling,
                             stop=options.stop, deadline_budget_ns=deadline_budget_ns)
