"""Tracing without an exporter stays the API's no-op, and a no-op span passes the caller's trace on."""

from __future__ import annotations

from opentelemetry import trace

from libs.service import tracing
from libs.service.trace_context import context_from, current_traceparent

REMOTE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_without_an_endpoint_no_provider_is_installed(monkeypatch):
    installed = []
    monkeypatch.setattr(trace, "set_tracer_provider", installed.append)
    assert tracing.configure_tracing("stage_worker", None) is None
    assert tracing.configure_tracing("stage_worker", "") is None
    assert installed == []


def test_with_an_endpoint_a_recording_provider_is_installed(monkeypatch):
    installed = []
    monkeypatch.setattr(trace, "set_tracer_provider", installed.append)
    provider = tracing.configure_tracing("stage_worker", "http://127.0.0.1:4317", "stage-0")
    try:
        assert installed == [provider]
        with provider.get_tracer("test").start_as_current_span("hop") as span:
            assert span.is_recording()
    finally:
        provider.shutdown()


def test_a_no_op_span_on_the_hot_path_records_nothing_and_carries_the_incoming_traceparent_on():
    tracer = trace.NoOpTracerProvider().get_tracer("fornax.stage_worker")
    with tracer.start_as_current_span("stage-0 decode", context=context_from(REMOTE)) as span:
        assert not span.is_recording()
        with tracer.start_as_current_span("transfer to stage-1"):
            assert current_traceparent() == REMOTE
