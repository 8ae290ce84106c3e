"""One request's output events as its reader sees them, and what a final event means.

A full stream stalls the request's decode (backpressure); leaving `async with` early cancels
the request; `collect` gives the whole text or raises the error the request ended with.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from typing import Protocol

from libs.service.errors import (
    Cancelled,
    DeadlineExceeded,
    FornaxError,
    Internal,
    ResourceExhausted,
    Unavailable,
)
from services.orchestrator.engine.domain import FinishReason, RequestOutput
from services.orchestrator.engine.unavailable import ROUTE_UNAVAILABLE


class StreamOwner(Protocol):
    """What a stream needs from the engine that fills it: backpressure and cancellation."""

    def set_stalled(self, request_id: str, stalled: bool) -> None: ...

    def cancel(self, request_id: str) -> bool: ...


class RequestStream:
    """One request's events, bounded: a full stream stalls the request's decode."""

    def __init__(self, engine: StreamOwner, request_id: str, prompt_tokens: int,
                 capacity: int) -> None:
        self._engine = engine
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self._capacity = capacity
        self._events: collections.deque[RequestOutput] = collections.deque()
        self._ready = asyncio.Event()
        self._stalled = False
        self.finished = False

    def _rebind(self, engine: StreamOwner) -> None:
        """Another engine fills the stream from now on (a replica route took the request over)."""
        self._engine = engine

    def _push(self, output: RequestOutput) -> None:
        self._events.append(output)
        self._ready.set()
        if len(self._events) >= self._capacity and not output.finished:
            self._stalled = True
            self._engine.set_stalled(self.request_id, True)

    async def next(self) -> RequestOutput:
        while not self._events:
            self._ready.clear()
            await self._ready.wait()
        output = self._events.popleft()
        if self._stalled and len(self._events) < self._capacity:
            self._stalled = False
            self._engine.set_stalled(self.request_id, False)
        if output.finished:
            self.finished = True
        return output

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        return await self.next()

    def cancel(self) -> bool:
        return self._engine.cancel(self.request_id)

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(self, *exc) -> None:
        if not self.finished:
            self.cancel()  # the consumer went away, or failed, before the final event

    async def collect(self) -> Completion:
        """The whole generated text and the final event; raises the error a failed request ended with."""
        parts = []
        async for output in self:
            parts.append(output.text)
            if output.finished:
                error = terminal_error(output)
                if error is not None:
                    raise error
                return Completion("".join(parts), output)
        raise Internal("request stream ended without a final event")


@dataclass(frozen=True)
class Completion:
    text: str
    final: RequestOutput


def terminal_error(output: RequestOutput) -> FornaxError | None:
    """The error a final event stands for; None when it ended with stop or length."""
    if output.finish_reason is FinishReason.DEADLINE:
        return DeadlineExceeded("the request's deadline budget ran out",
                                reason="DEADLINE_EXCEEDED")
    if output.finish_reason is FinishReason.CANCELLED:
        return Cancelled("the request was cancelled")
    if output.finish_reason is FinishReason.REJECTED:
        return ResourceExhausted(f"a stage refused the request: {output.error}")
    if output.finish_reason is FinishReason.UNAVAILABLE:
        return Unavailable(output.error or "the route is unavailable", reason=ROUTE_UNAVAILABLE)
    if output.finish_reason is FinishReason.ERROR:
        return Internal(f"generation failed: {output.error}", reason="GENERATION_FAILED")
    return None
