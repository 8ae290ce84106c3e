"""OpenAI-compatible response bodies and the error envelope, built from typed values."""

from __future__ import annotations

import grpc

from libs.service.errors import FornaxError
from libs.text.chat_template import ToolCall
from libs.text.context import TextIdentity
from services.orchestrator.engine.admission import KvShortfall
from services.orchestrator.engine.domain import FinishReason, ServedModel

# gRPC status -> (HTTP status, OpenAI error type)
_HTTP_BY_CODE: dict[grpc.StatusCode, tuple[int, str]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.FAILED_PRECONDITION: (400, "invalid_request_error"),
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error"),
    grpc.StatusCode.NOT_FOUND: (404, "invalid_request_error"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "capacity_error"),
    grpc.StatusCode.CANCELLED: (499, "cancelled_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable_error"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout_error"),
    grpc.StatusCode.UNIMPLEMENTED: (501, "not_implemented_error"),
}


def error_envelope(message: str, error_type: str, code: str, param: str | None) -> dict:
    return {"error": {"message": message, "type": error_type, "code": code, "param": param}}


def error_from_exception(exc: FornaxError) -> tuple[int, dict]:
    status, error_type = _HTTP_BY_CODE.get(exc.code, (500, "server_error"))
    body = error_envelope(exc.message, error_type, exc.reason.lower(), exc.field)
    shortfall = getattr(exc, "kv_shortfall", None)
    if isinstance(shortfall, KvShortfall):  # KV_BLOCKS_FULL, KV_NEVER_FITS: the blocks in numbers
        body["error"]["kv_blocks"] = shortfall.as_body()
    return status, body


def finish_reason_text(reason: FinishReason | None) -> str | None:
    """OpenAI knows `stop` and `length`; other endings travel as errors, not finish reasons."""
    if reason is FinishReason.STOP:
        return "stop"
    if reason is FinishReason.LENGTH:
        return "length"
    return None


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def model_list(served: ServedModel | None, text: TextIdentity | None = None) -> dict:
    return {"object": "list", "data": [] if served is None else [model_object(served, text)]}


def model_object(served: ServedModel, text: TextIdentity | None) -> dict:
    """OpenAI's model object plus what a client needs to trust and size its requests."""
    card = served.card
    servable, bound = served.servable_context
    return {"id": served.model_id, "object": "model", "created": served.created_unix_s,
            "owned_by": "fornax", "max_model_len": servable,
            "fornax": {
                # max_model_len is min(model positions, the smallest stage KV capacity for one
                # sequence); this names which bound set it.
                "max_model_len_bound": bound,
                "model_snapshot": card.model_snapshot,
                "tokenizer_sha256": text.tokenizer_sha256 if text else None,
                "chat_template_sha256": text.template_sha256 if text else None,
                "context_length": served.context_length,
                "vocab_size": served.vocab_size,
                "plan": {"plan_id": card.plan_id, "mode": card.plan_mode,
                         "evidence_class": card.plan_evidence.value},
                "execution": {"backend": card.backend, "boundary_dtype": card.boundary_dtype,
                              "stages": served.num_stages, "stage_weights": list(card.stage_weights),
                              "stage_max_activations": list(card.stage_max_activations),
                              "stage_conversions": [list(c) for c in card.stage_conversions],
                              "evidence_class": card.execution_evidence.value}}}


def tool_call_value(call: ToolCall) -> dict:
    return {"id": call.call_id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def tool_call_delta(index: int, call: ToolCall) -> dict:
    return {"index": index, **tool_call_value(call)}


def chat_choice(index: int, text: str, finish: FinishReason | None,
                tool_calls: tuple[ToolCall, ...] = (), logprobs: dict | None = None) -> dict:
    message: dict = {"role": "assistant", "content": text}
    finish_text = finish_reason_text(finish)
    if tool_calls:
        message = {"role": "assistant", "content": text or None,
                   "tool_calls": [tool_call_value(c) for c in tool_calls]}
        finish_text = "tool_calls"
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_text}


def completion_choice(index: int, text: str, finish: FinishReason | None,
                      tool_calls: tuple = (), logprobs: dict | None = None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs,
            "finish_reason": finish_reason_text(finish)}


def chat_completion(rid: str, created: int, model: str, choices: list[dict],
                    prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": choices, "usage": usage(prompt_tokens, completion_tokens, cached_tokens)}


def completion(rid: str, created: int, model: str, choices: list[dict],
               prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": choices, "usage": usage(prompt_tokens, completion_tokens, cached_tokens)}


def chat_chunk(rid: str, created: int, model: str, delta: dict,
               finish: FinishReason | None, with_usage_field: bool,
               tool_calls: bool = False, index: int = 0, logprobs: dict | None = None) -> dict:
    finish_text = "tool_calls" if tool_calls else finish_reason_text(finish)
    chunk = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
             "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                          "finish_reason": finish_text}]}
    if with_usage_field:
        chunk["usage"] = None
    return chunk


def completion_chunk(rid: str, created: int, model: str, text: str,
                     finish: FinishReason | None, with_usage_field: bool, index: int = 0,
                     logprobs: dict | None = None) -> dict:
    chunk = {"id": rid, "object": "text_completion", "created": created, "model": model,
             "choices": [{"index": index, "text": text, "logprobs": logprobs,
                          "finish_reason": finish_reason_text(finish)}]}
    if with_usage_field:
        chunk["usage"] = None
    return chunk


def usage_chunk(rid: str, created: int, model: str, obj: str, prompt_tokens: int,
                completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens, cached_tokens)}


def routes_value(routes) -> list[dict]:
    """Replica routes (`engine.multiroute.ReplicaRouteView`): each one's state, stages and load."""
    return [{"index": r.index, "state": r.state, "reason": r.reason, "plan_id": r.plan_id,
             "stages": [{"index": i, "layer_start": a, "layer_end_exclusive": b}
                        for i, (a, b) in enumerate(r.stage_layers)],
             "live_requests": r.live_requests} for r in routes]
