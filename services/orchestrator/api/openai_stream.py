"""Writing OpenAI responses from request streams: one stream per choice (`n`), collected into
one body or merged into one SSE stream, with tool calls and logprobs per choice."""

from __future__ import annotations

import asyncio
import enum
import json
import time
import uuid
from dataclasses import dataclass, field

from aiohttp import web

from libs.service.errors import FornaxError, Internal
from libs.text.chat_template import ToolCall
from services.orchestrator.api import openai_response as fmt
from services.orchestrator.api.dashboard import record_error
from services.orchestrator.api.openai_logprobs import LogprobsFormatter
from services.orchestrator.api.openai_request import CommonOptions
from services.orchestrator.api.openai_tools import CallStreamSplitter, ToolRequest, extract_calls
from services.orchestrator.engine import metrics
from services.orchestrator.engine.domain import RequestOutput
from services.orchestrator.engine.serving import RequestStream, terminal_error

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
               "X-Accel-Buffering": "no"}


class ApiKind(enum.Enum):
    CHAT = "chat"
    COMPLETION = "completion"


@dataclass(frozen=True)
class ResponseForm:
    kind: ApiKind
    tools: ToolRequest | None = None  # chat with tools that may be called
    logprobs: bool = False
    token_ids: bool = False  # completions: each choice and chunk carries its generated ids

    @property
    def id_prefix(self) -> str:
        return "chatcmpl" if self.kind is ApiKind.CHAT else "cmpl"

    @property
    def object_name(self) -> str:
        return "chat.completion.chunk" if self.kind is ApiKind.CHAT else "text_completion"


@dataclass
class _Choice:
    index: int
    form: ResponseForm
    formatter: LogprobsFormatter
    splitter: CallStreamSplitter | None = None
    first: bool = True
    text: list[str] = field(default_factory=list)
    entries: list = field(default_factory=list)

    def carries_ids(self, output: RequestOutput) -> bool:
        """An event whose text is held back (a partial UTF-8 character) still sends its ids."""
        return self.form.token_ids and bool(output.token_ids)

    def logprobs(self, entries) -> dict | None:
        if not self.form.logprobs:
            return None
        entries = tuple(entries)
        return (self.formatter.chat(entries) if self.form.kind is ApiKind.CHAT
                else self.formatter.completion(entries))


def public_id(form: ResponseForm, stream: RequestStream) -> str:
    """OpenAI-style id; the internal request id is the UUID FNX2 requires."""
    return f"{form.id_prefix}-{uuid.UUID(stream.request_id).hex}"


async def _drain(stream: RequestStream, keep_ids: bool) -> tuple[str, RequestOutput, list, list[int]]:
    """One choice's text, final event and logprob entries, and its token ids when `keep_ids`."""
    text: list[str] = []
    entries: list = []
    ids: list[int] = []
    async for output in stream:
        text.append(output.text)
        entries += output.logprobs
        if keep_ids:
            ids += output.token_ids
        if output.finished:
            error = terminal_error(output)
            if error is not None:
                raise error
            return "".join(text), output, entries, ids
    raise Internal("request stream ended without a final event")


async def collect(streams: list[RequestStream], model: str, form: ResponseForm,
                  token_bytes: tuple[bytes, ...]) -> web.Response:
    created = int(time.time())
    drained = await asyncio.gather(*(_drain(s, form.token_ids) for s in streams))
    choices, completion_tokens = [], 0
    for index, (text, final, entries, ids) in enumerate(drained):
        calls: tuple[ToolCall, ...] = ()
        if form.tools is not None:
            text, calls = extract_calls(text, form.tools)
        choice = _Choice(index, form, LogprobsFormatter(token_bytes))
        build = fmt.chat_choice if form.kind is ApiKind.CHAT else fmt.completion_choice
        choices.append(build(index, text, final.finish_reason, calls, choice.logprobs(entries)))
        if form.token_ids:
            choices[-1]["token_ids"] = ids
        completion_tokens += final.completion_tokens
    full = fmt.chat_completion if form.kind is ApiKind.CHAT else fmt.completion
    # The choices share one prompt; the first choice's admission says how much of it was cached.
    return web.json_response(full(public_id(form, streams[0]), created, model, choices,
                                  streams[0].prompt_tokens, completion_tokens,
                                  drained[0][1].cached_tokens))


async def stream_sse(request: web.Request, streams: list[RequestStream], model: str,
                     options: CommonOptions, form: ResponseForm,
                     token_bytes: tuple[bytes, ...],
                     idle_write_timeout_s: float | None = None) -> web.StreamResponse:
    heads = [await s.next() for s in streams]
    for head in heads:
        error = terminal_error(head) if head.finished else None
        if error is not None:
            raise error  # nothing sent yet: a proper status (429, 504, ...)
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    writer = _SseWriter(response, request.transport, idle_write_timeout_s,
                        public_id(form, streams[0]), int(time.time()), model, options)
    queue: asyncio.Queue[tuple[int, RequestOutput]] = asyncio.Queue()
    tasks = [asyncio.create_task(_pump(i, head, stream, queue))
             for i, (head, stream) in enumerate(zip(heads, streams, strict=True))]
    choices = [_Choice(i, form, LogprobsFormatter(token_bytes),
                       CallStreamSplitter(form.tools) if form.tools is not None else None)
               for i in range(len(streams))]
    completion_tokens, open_choices, cached_tokens = 0, len(streams), 0
    try:
        while open_choices:
            index, output = await queue.get()
            error = await writer.event(choices[index], output)
            if error is not None:
                record_error(request.app, error.reason.lower())
            if output.finished:
                open_choices -= 1
                completion_tokens += output.completion_tokens
                if index == 0:
                    cached_tokens = output.cached_tokens
    finally:
        for task in tasks:
            task.cancel()
    if options.include_usage:
        await writer.send(fmt.usage_chunk(writer.rid, writer.created, model, form.object_name,
                                          streams[0].prompt_tokens, completion_tokens, cached_tokens))
    await writer.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def _pump(index: int, head: RequestOutput, stream: RequestStream,
                queue: asyncio.Queue) -> None:
    await queue.put((index, head))
    if head.finished:
        return
    async for output in stream:
        await queue.put((index, output))


def _with_token_ids(chunk: dict, form: ResponseForm, token_ids: tuple[int, ...]) -> dict:
    if form.token_ids:
        chunk["choices"][0]["token_ids"] = list(token_ids)
    return chunk


class _SseWriter:
    def __init__(self, response: web.StreamResponse, transport: asyncio.BaseTransport | None,
                 idle_timeout_s: float | None, rid: str, created: int, model: str,
                 options: CommonOptions) -> None:
        self.response, self.transport, self.idle_timeout_s = response, transport, idle_timeout_s
        self.rid, self.created, self.model = rid, created, model
        self.usage_field = options.include_usage

    async def write(self, data: bytes) -> None:
        """A client that stops reading fills the socket and blocks the write: after the idle
        timeout the connection is dropped, and the caller's `finally` cancels the request."""
        try:
            await asyncio.wait_for(self.response.write(data), self.idle_timeout_s)
        except TimeoutError:
            metrics.IDLE_READER_CANCELLATIONS.inc()
            if isinstance(self.transport, asyncio.Transport):
                self.transport.abort()
            raise ConnectionResetError("the client stopped reading") from None

    async def send(self, payload: dict) -> None:
        data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
        await self.write(b"data: " + data.encode("utf-8") + b"\n\n")

    async def event(self, choice: _Choice, output: RequestOutput) -> FornaxError | None:
        """Writes one event; returns the error it ended the choice with, if any."""
        error = terminal_error(output) if output.finished else None
        logprobs = choice.logprobs(output.logprobs) if output.logprobs else None
        if choice.form.kind is ApiKind.COMPLETION:
            if output.text or choice.first or logprobs or choice.carries_ids(output) or (
                    output.finished and error is None):
                chunk = fmt.completion_chunk(
                    self.rid, self.created, self.model, output.text,
                    None if error else output.finish_reason, self.usage_field, choice.index,
                    logprobs)
                await self.send(_with_token_ids(chunk, choice.form, output.token_ids))
                choice.first = False
        else:
            await self._chat_event(choice, output, error is not None, logprobs)
        if error is not None:
            await self.send(fmt.error_from_exception(error)[1])
        return error

    async def _chat_event(self, choice: _Choice, output: RequestOutput, failed: bool,
                          logprobs: dict | None) -> None:
        text = choice.splitter.feed(output.text) if choice.splitter else output.text
        if choice.splitter is not None and output.finished and not failed:
            rest, calls = choice.splitter.finish()
            text += rest
        else:
            calls = ()
        ends = output.finished and not failed
        if text or choice.first or logprobs or choice.carries_ids(output) or (ends and not calls):
            delta = ({"role": "assistant", "content": text} if choice.first
                     else ({"content": text} if text else {}))
            finish = output.finish_reason if ends and not calls and not failed else None
            chunk = fmt.chat_chunk(self.rid, self.created, self.model, delta, finish, self.usage_field,
                                   index=choice.index, logprobs=logprobs)
            await self.send(_with_token_ids(chunk, choice.form, output.token_ids))
            choice.first = False
        for position, call in enumerate(calls):
            await self.send(fmt.chat_chunk(self.rid, self.created, self.model,
                                           {"tool_calls": [fmt.tool_call_delta(position, call)]},
                                           None, self.usage_field, index=choice.index))
        if calls:
            await self.send(fmt.chat_chunk(self.rid, self.created, self.model, {},
                                           output.finish_reason, self.usage_field,
                                           tool_calls=True, index=choice.index))
