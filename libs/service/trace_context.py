"""W3C trace context carried inside FNX2 frames (the `traceparent` extension)."""

from __future__ import annotations

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()


def current_traceparent() -> str | None:
    """The active span's traceparent header value, or None when nothing is being traced."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")


def context_from(traceparent: str | None) -> otel_context.Context | None:
    """A context whose parent is the remote span named by traceparent (None if absent/invalid)."""
    if not traceparent:
        return None
    ctx = _PROPAGATOR.extract({"traceparent": traceparent})
    span = trace.get_current_span(ctx)
    return ctx if span.get_span_context().is_valid else None
