"""Request spans: one trace per request, from the API call through admission and queueing
to every microbatch hop across the stages.

`RequestSpans` keeps each live request's span; the request's traceparent rides on its
microbatch slices, and the route pipeline parents each microbatch span on it.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace import Link, Span, Status, StatusCode

from libs.service.trace_context import context_from, current_traceparent

TRACER = trace.get_tracer("fornax.orchestrator")


class RequestSpans:
    def __init__(self) -> None:
        self._request: dict[str, Span] = {}
        self._queue: dict[str, Span] = {}

    def begin(self, request_id: str) -> tuple[Span, str | None]:
        """Start the request span under the current context; returns it and its traceparent."""
        span = TRACER.start_span("generate", attributes={"fornax.request_id": request_id})
        self._request[request_id] = span
        with trace.use_span(span, end_on_exit=False):
            return span, current_traceparent()

    def admission(self, request_id: str):
        """A context manager: the admission span, a child of the request span."""
        parent = self._request.get(request_id)
        ctx = trace.set_span_in_context(parent) if parent else None
        return TRACER.start_as_current_span("admission", context=ctx)

    def queued(self, request_id: str) -> None:
        parent = self._request.get(request_id)
        if parent is not None:
            self._queue[request_id] = TRACER.start_span("queue", context=trace.set_span_in_context(parent))

    def scheduled(self, request_id: str) -> None:
        span = self._queue.pop(request_id, None)
        if span is not None:
            span.end()

    def rejected(self, request_id: str, reason: str) -> None:
        span = self._request.pop(request_id, None)
        if span is not None:
            span.set_status(Status(StatusCode.ERROR, reason))
            span.end()

    def move(self, request_id: str, to: RequestSpans) -> None:
        """The request continues under another engine (a replica route took it over)."""
        for mine, theirs in ((self._request, to._request), (self._queue, to._queue)):
            if request_id in mine:
                theirs[request_id] = mine.pop(request_id)

    def finish(self, request_id: str, finish_reason: str) -> None:
        self.scheduled(request_id)
        span = self._request.pop(request_id, None)
        if span is not None:
            span.set_attribute("fornax.finish_reason", finish_reason)
            span.end()


def microbatch_span(phase: str, traceparents: list[str | None]):
    """Span of one microbatch, parented on its first traced request, linked to the others."""
    contexts = [context_from(t) for t in traceparents]
    present = [c for c in contexts if c is not None]
    parent = present[0] if present else None
    links = [Link(trace.get_current_span(c).get_span_context()) for c in present[1:]]
    return TRACER.start_as_current_span(f"microbatch {phase}", context=parent, links=links)
