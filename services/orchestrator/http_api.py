"""OpenAI-compatible HTTP API on aiohttp: thin handlers over the serving engine.

Errors are JSON `{"error": {"message", "type", "code", "param"}}` with the FornaxError reason
as the code. A client that disconnects cancels its request, which releases its KV on every
stage (the runner is built with handler cancellation on).
"""

from __future__ import annotations

import hmac
import json
import ssl
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from aiohttp import web
from opentelemetry.trace import SpanKind

from libs.service.errors import FornaxError, Unauthenticated, Unavailable
from libs.service.trace_context import context_from
from services.orchestrator import openai_response as fmt
from services.orchestrator.domain import FinishReason, GenerationRequest, RequestOutput
from services.orchestrator.openai_request import (
    CommonOptions,
    parse_chat_completion,
    parse_completion,
    parse_json_object,
)
from services.orchestrator.prompting import (
    chat_prompt_ids,
    check_model,
    completion_prompt_ids,
    generation_request,
)
from services.orchestrator.serving import RequestStream, RouteSlot, ServingEngine, terminal_error
from services.orchestrator.tracing import TRACER

_log = structlog.get_logger()
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
               "X-Accel-Buffering": "no"}


@dataclass(frozen=True)
class HttpConfig:
    api_key: str | None = None
    max_body_bytes: int = 4 << 20


ROUTE_KEY = web.AppKey("route", RouteSlot)
CONFIG_KEY = web.AppKey("http_config", HttpConfig)


def build_http_app(route: RouteSlot, config: HttpConfig = HttpConfig()) -> web.Application:
    app = web.Application(middlewares=[_trace, _errors, _auth], client_max_size=config.max_body_bytes)
    app[ROUTE_KEY] = route
    app[CONFIG_KEY] = config
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/v1/models/{model}", _model)
    app.router.add_post("/v1/chat/completions", _chat_completions)
    app.router.add_post("/v1/completions", _completions)
    return app


async def start_http(app: web.Application, host: str, port: int,
                     ssl_context: ssl.SSLContext | None = None) -> tuple[web.AppRunner, int]:
    """Serves the app (HTTPS with ssl_context); returns the runner and the bound port (0 works)."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    await site.start()
    sockets = site._server.sockets if site._server else ()  # aiohttp exposes no public getter
    return runner, sockets[0].getsockname()[1]


def _json_error(status: int, body: dict) -> web.Response:
    return web.json_response(body, status=status)


@web.middleware
async def _trace(request: web.Request, handler) -> web.StreamResponse:
    """A server span per API call, joining the caller's trace when it sends a traceparent."""
    if not request.path.startswith("/v1/"):
        return await handler(request)
    parent = context_from(request.headers.get("traceparent"))
    with TRACER.start_as_current_span(f"{request.method} {request.path}", context=parent,
                                      kind=SpanKind.SERVER) as span:
        response = await handler(request)
        span.set_attribute("http.response.status_code", response.status)
        return response


@web.middleware
async def _errors(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except FornaxError as exc:
        return _json_error(*fmt.error_from_exception(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = exc.reason.lower().replace(" ", "_")
        return _json_error(exc.status, fmt.error_envelope(
            f"{request.method} {request.path}: {exc.reason}", "invalid_request_error", code,
            None))
    except Exception:
        _log.exception("http_handler_failed", path=request.path)
        return _json_error(500, fmt.error_envelope("internal error", "server_error",
                                                   "internal", None))


@web.middleware
async def _auth(request: web.Request, handler) -> web.StreamResponse:
    key = request.app[CONFIG_KEY].api_key
    if key and request.path.startswith("/v1/"):
        header = request.headers.get("Authorization", "")
        if not header:
            raise Unauthenticated("missing bearer token in the Authorization header",
                                  reason="MISSING_API_KEY")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), key.encode()):
            raise Unauthenticated("invalid API key", reason="INVALID_API_KEY")
    return await handler(request)


def _engine(request: web.Request) -> ServingEngine:
    engine = request.app[ROUTE_KEY].engine
    if engine is None:
        raise Unavailable("no route is installed yet", reason="ROUTE_NOT_READY")
    return engine


async def _health(request: web.Request) -> web.Response:
    engine = _engine(request)
    if engine.admission.closed_reason is not None:
        raise Unavailable(f"route is not admitting: {engine.admission.closed_reason}",
                          reason="NOT_ADMITTING")
    return web.json_response({"status": "ready", "model": engine.served.model_id,
                              "stages": engine.served.num_stages,
                              "live_requests": engine.live_requests})


async def _models(request: web.Request) -> web.Response:
    engine = request.app[ROUTE_KEY].engine
    if engine is None:
        return web.json_response(fmt.model_list(None, 0))
    return web.json_response(fmt.model_list(engine.served.model_id,
                                            engine.served.created_unix_s))


async def _model(request: web.Request) -> web.Response:
    engine = _engine(request)
    check_model(request.match_info["model"], engine.served)
    return web.json_response(fmt.model_list(engine.served.model_id,
                                            engine.served.created_unix_s)["data"][0])


async def _chat_completions(request: web.Request) -> web.StreamResponse:
    engine = _engine(request)
    body = parse_chat_completion(parse_json_object(await request.read()))
    check_model(body.model, engine.served)
    gen = generation_request(str(uuid.uuid4()), chat_prompt_ids(body, engine.text),
                             body.options, engine.served, engine.config.token_limits,
                             "messages")
    return await _respond(request, engine, gen, body.model, body.options, _CHAT)


async def _completions(request: web.Request) -> web.StreamResponse:
    engine = _engine(request)
    body = parse_completion(parse_json_object(await request.read()))
    check_model(body.model, engine.served)
    gen = generation_request(str(uuid.uuid4()),
                             completion_prompt_ids(body, engine.text, engine.served),
                             body.options, engine.served, engine.config.token_limits,
                             "prompt")
    return await _respond(request, engine, gen, body.model, body.options, _COMPLETION)


@dataclass(frozen=True)
class _Format:
    id_prefix: str
    object_name: str
    full: Callable[..., dict]
    chunk: Callable[[str, int, str, str, FinishReason | None, bool, bool], dict]


def _chat_chunk(rid, created, model, text, finish, first, usage_field) -> dict:
    delta = {"role": "assistant", "content": text} if first else (
        {"content": text} if text else {})
    return fmt.chat_chunk(rid, created, model, delta, finish, usage_field)


def _completion_chunk(rid, created, model, text, finish, first, usage_field) -> dict:
    return fmt.completion_chunk(rid, created, model, text, finish, usage_field)


_CHAT = _Format("chatcmpl", "chat.completion.chunk", fmt.chat_completion, _chat_chunk)
_COMPLETION = _Format("cmpl", "text_completion", fmt.completion, _completion_chunk)


async def _respond(request: web.Request, engine: ServingEngine, gen: GenerationRequest,
                   model: str, options: CommonOptions, form: _Format) -> web.StreamResponse:
    # submit raises a capacity error at once when there is no room; leaving the block before
    # the final event (the client went away, or the handler failed) cancels the request.
    async with engine.submit(gen) as stream:
        if options.stream:
            return await _stream_sse(request, stream, model, options, form)
        return await _collect(stream, model, form)


async def _collect(stream: RequestStream, model: str, form: _Format) -> web.Response:
    created = int(time.time())
    done = await stream.collect()
    return web.json_response(form.full(
        _public_id(form, stream), created, model, done.text, done.final.finish_reason,
        done.final.prompt_tokens, done.final.completion_tokens))


async def _stream_sse(request: web.Request, stream: RequestStream, model: str,
                      options: CommonOptions, form: _Format) -> web.StreamResponse:
    head = await stream.next()
    if head.finished and terminal_error(head) is not None:
        raise terminal_error(head)  # nothing sent yet: a proper status (429, 504, ...)
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    rid, created, first = _public_id(form, stream), int(time.time()), True
    async for output in _prepend(head, stream):
        error = terminal_error(output) if output.finished else None
        if output.text or first or (output.finished and error is None):
            await _send(response, form.chunk(rid, created, model, output.text,
                                             None if error else output.finish_reason, first,
                                             options.include_usage))
            first = False
        if error is not None:
            await _send(response, fmt.error_from_exception(error)[1])
        if output.finished and options.include_usage:
            await _send(response, fmt.usage_chunk(rid, created, model, form.object_name,
                                                  output.prompt_tokens,
                                                  output.completion_tokens))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def _prepend(head: RequestOutput, stream: RequestStream):
    yield head
    async for output in stream:
        yield output


def _public_id(form: _Format, stream: RequestStream) -> str:
    """OpenAI-style id; the internal request id is the UUID FNX2 requires."""
    return f"{form.id_prefix}-{uuid.UUID(stream.request_id).hex}"


async def _send(response: web.StreamResponse, payload: dict) -> None:
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    await response.write(b"data: " + data.encode("utf-8") + b"\n\n")
