"""OpenAI-compatible HTTP API on aiohttp: thin handlers over the serving engine.

Errors are JSON `{"error": {"message", "type", "code", "param"}}` with the FornaxError reason
as the code. A client that disconnects cancels its request, which releases its KV on every
stage (the runner is built with handler cancellation on).
"""

from __future__ import annotations

import asyncio
import hmac
import socket
import ssl
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

import structlog
from aiohttp import web
from opentelemetry.trace import SpanKind

from libs.service.errors import FornaxError, Unauthenticated, Unavailable
from libs.service.trace_context import context_from
from services.orchestrator.api import openai_response as fmt
from services.orchestrator.api.dashboard import STATE_PATH, add_dashboard, record_error
from services.orchestrator.api.openai_request import (
    CommonOptions,
    chat_options,
    chat_prompt_ids,
    check_model,
    choice_requests,
    completion_prompt_ids,
    generation_request,
    parse_chat_completion,
    parse_completion,
    parse_json_object,
)
from services.orchestrator.api.openai_stream import ApiKind, ResponseForm, collect, stream_sse
from services.orchestrator.engine.client import EngineClient
from services.orchestrator.engine.domain import GenerationRequest
from services.orchestrator.engine.multiroute import MultiRouteEngine
from services.orchestrator.engine.prefix_salt import cache_salt_of, prefix_salt, tenant_of
from services.orchestrator.engine.route_slot import RouteSlot
from services.orchestrator.engine.serving import RequestStream, ServingConfig
from services.orchestrator.engine.tracing import TRACER
from services.orchestrator.engine.unavailable import route_unavailable

_log = structlog.get_logger()

# Bodies larger than this are tokenized on a worker thread, so one huge prompt cannot stall
# every other stream on the event loop.
TOKENIZE_INLINE_MAX_BYTES = 16 << 10


@dataclass(frozen=True)
class HttpConfig:
    api_key: str | None = None
    max_body_bytes: int = 4 << 20
    # A streaming client that accepts no bytes for this long is dropped and its request
    # cancelled; None waits forever.
    idle_write_timeout_s: float | None = ServingConfig.stall_timeout_s
    # Kernel send buffer of each client connection; None leaves the kernel's autotuning
    # (up to several MiB per connection). Bounding it bounds what a client that stops
    # reading can pin, and lets the idle-write timeout notice it sooner.
    send_buffer_bytes: int | None = None


ROUTE_KEY = web.AppKey("route", RouteSlot)
CONFIG_KEY = web.AppKey("http_config", HttpConfig)
# What each stage runs now and what is compiling (services.orchestrator.route.coldstart); optional.
class BackendReport(Protocol):
    """The backend board `/v1/models` reports (services.orchestrator.route.coldstart.BackendBoard)."""

    def snapshot(self) -> dict[str, object]: ...


BOARD_KEY = web.AppKey("backend_board", BackendReport)


def build_http_app(route: RouteSlot, config: HttpConfig = HttpConfig()) -> web.Application:
    app = web.Application(middlewares=[_trace, _errors, _auth], client_max_size=config.max_body_bytes)
    app[ROUTE_KEY] = route
    app[CONFIG_KEY] = config
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/v1/models/{model}", _model)
    app.router.add_post("/v1/chat/completions", _chat_completions)
    app.router.add_post("/v1/completions", _completions)
    add_dashboard(app, route)
    return app


async def start_http(app: web.Application, host: str, port: int,
                     ssl_context: ssl.SSLContext | None = None) -> tuple[web.AppRunner, int]:
    """Serves the app (HTTPS with ssl_context); returns the runner and the bound port (0 works)."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    listener = socket.create_server((host, port), reuse_port=False)
    send_buffer = app[CONFIG_KEY].send_buffer_bytes
    if send_buffer:  # accepted connections inherit the listener's buffer size
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    listener.setblocking(False)
    site = web.SockSite(runner, listener, ssl_context=ssl_context)
    await site.start()
    return runner, listener.getsockname()[1]


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
        record_error(request.app, exc.reason.lower())
        return _json_error(*fmt.error_from_exception(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = exc.reason.lower().replace(" ", "_")
        record_error(request.app, code)
        return _json_error(exc.status, fmt.error_envelope(
            f"{request.method} {request.path}: {exc.reason}", "invalid_request_error", code,
            None))
    except ConnectionResetError:  # the client went away or stopped reading: not our fault
        _log.info("http_client_gone", path=request.path)
        raise
    except Exception:
        _log.exception("http_handler_failed", path=request.path)
        record_error(request.app, "internal")
        return _json_error(500, fmt.error_envelope("internal error", "server_error",
                                                   "internal", None))


@web.middleware
async def _auth(request: web.Request, handler) -> web.StreamResponse:
    key = request.app[CONFIG_KEY].api_key
    if key and (request.path.startswith("/v1/") or request.path == STATE_PATH):
        header = request.headers.get("Authorization", "")
        if not header:
            raise Unauthenticated("missing bearer token in the Authorization header",
                                  reason="MISSING_API_KEY")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), key.encode()):
            raise Unauthenticated("invalid API key", reason="INVALID_API_KEY")
    return await handler(request)


def _engine(request: web.Request) -> EngineClient:
    engine = request.app[ROUTE_KEY].engine
    if engine is None:
        raise Unavailable("no route is installed yet", reason="ROUTE_NOT_READY")
    return engine


async def _health(request: web.Request) -> web.Response:
    engine = _engine(request)
    now = engine.snapshot()
    if now.degraded_reason is not None:
        raise route_unavailable(now.degraded_reason)
    if now.not_admitting_reason is not None:
        raise Unavailable(f"route is not admitting: {now.not_admitting_reason}",
                          reason="NOT_ADMITTING")
    return web.json_response({"status": "ready", "model": engine.served.model_id,
                              "stages": engine.served.num_stages,
                              "live_requests": now.live_requests})


async def _models(request: web.Request) -> web.Response:
    engine = request.app[ROUTE_KEY].engine
    if engine is None:
        return web.json_response(fmt.model_list(None))
    listing = fmt.model_list(engine.served, engine.text.identity)
    if isinstance(engine, MultiRouteEngine):  # replica routes: each one's state and stages
        for entry in listing["data"]:
            entry["fornax"]["routes"] = fmt.routes_value(engine.routes())
    board = request.app.get(BOARD_KEY)
    if board is not None:
        snapshot = board.snapshot()
        for entry in listing["data"]:
            entry["fornax_backend"] = snapshot
            execution = (entry.get("fornax") or {}).get("execution")
            if execution is not None:  # which backend runs and why, in one line each
                choice = snapshot.get("choice")
                execution["backend_choice"] = ({k: choice[k] for k in ("backend", "policy", "reason")}
                                               if isinstance(choice, dict) and choice else None)
    return web.json_response(listing)


async def _model(request: web.Request) -> web.Response:
    engine = _engine(request)
    check_model(request.match_info["model"], engine.served)
    return web.json_response(fmt.model_object(engine.served, engine.text.identity))


async def _chat_completions(request: web.Request) -> web.StreamResponse:
    engine = _engine(request)
    raw = await request.read()
    fields = parse_json_object(raw)
    body = parse_chat_completion(fields)
    check_model(body.model, engine.served)
    options = chat_options(body, engine.text, engine.served)
    ids = await _tokenize(len(raw), chat_prompt_ids, body, engine.text)
    gen = generation_request(str(uuid.uuid4()), ids,
                             options, engine.served, engine.config.token_limits,
                             "messages")
    gen = replace(gen, prefix_salt=_prefix_salt(request, engine, fields))
    form = ResponseForm(ApiKind.CHAT, body.tools if body.tools.active else None,
                        options.sampling.top_logprobs is not None, token_ids=options.return_token_ids)
    return await _respond(request, engine, gen, body.model, options, form)


async def _completions(request: web.Request) -> web.StreamResponse:
    engine = _engine(request)
    raw = await request.read()
    fields = parse_json_object(raw)
    body = parse_completion(fields)
    check_model(body.model, engine.served)
    ids = await _tokenize(len(raw), completion_prompt_ids, body, engine.text, engine.served)
    gen = generation_request(str(uuid.uuid4()), ids,
                             body.options, engine.served, engine.config.token_limits,
                             "prompt")
    gen = replace(gen, prefix_salt=_prefix_salt(request, engine, fields))
    form = ResponseForm(ApiKind.COMPLETION, None, body.options.sampling.top_logprobs is not None,
                        token_ids=body.options.return_token_ids)
    return await _respond(request, engine, gen, body.model, body.options, form)


def _prefix_salt(request: web.Request, engine: EngineClient, fields: dict) -> bytes | None:
    """The request's prefix-cache salt: model, tokenizer, caller's credential, own cache_salt."""
    return prefix_salt(engine.config.prefix_cache, engine.served.card.model_snapshot,
                       engine.text.identity.tokenizer_sha256,
                       tenant_of(request.headers.get("Authorization")), cache_salt_of(fields))


async def _tokenize(body_bytes: int, encode: Callable[..., tuple[int, ...]],
                    *args) -> tuple[int, ...]:
    if body_bytes <= TOKENIZE_INLINE_MAX_BYTES:
        return encode(*args)
    return await asyncio.to_thread(encode, *args)


async def _respond(request: web.Request, engine: EngineClient, gen: GenerationRequest,
                   model: str, options: CommonOptions, form: ResponseForm) -> web.StreamResponse:
    streams: list[RequestStream] = []
    try:
        for choice in choice_requests(gen, options.n):
            streams.append(engine.submit(choice))  # a capacity error at once when no room
        token_bytes = engine.text.tokenizer.token_bytes
        if options.stream:
            return await stream_sse(request, streams, model, options, form, token_bytes,
                                    request.app[CONFIG_KEY].idle_write_timeout_s)
        return await collect(streams, model, form, token_bytes)
    finally:
        for stream in streams:
            if not stream.finished:
                stream.cancel()  # the client went away, the handler failed, or a sibling did
