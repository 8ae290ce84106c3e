"""One request's output events as its reader sees them, with backpressure on its decode."""

from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING

from services.orchestrator.domain import RequestOutput

if TYPE_CHECKING:
    from services.orchestrator.serving import ServingEngine


class RequestStream:
    """One request's events, bounded: a full stream stalls the request's decode."""

    def __init__(self, engine: ServingEngine, request_id: str, prompt_tokens: int,
                 capacity: int) -> None:
        self._engine = engine
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self._capacity = capacity
        self._events: collections.deque[RequestOutput] = collections.deque()
        self._ready = asyncio.Event()
        self._stalled = False
        self.finished = False

    def _push(self, output: RequestOutput) -> None:
        self._events.append(output)
        self._ready.set()
        if len(self._events) >= self._capacity and not output.finished:
            self._stalled = True
            self._engine._stall(self.request_id, True)

    async def next(self) -> RequestOutput:
        while not self._events:
            self._ready.clear()
            await self._ready.wait()
        output = self._events.popleft()
        if self._stalled and len(self._events) < self._capacity:
            self._stalled = False
            self._engine._stall(self.request_id, False)
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
