"""OpenTelemetry tracing: exported over OTLP/gRPC whenever an endpoint is configured.

Without an endpoint no SDK provider is installed, so every tracer stays the API's no-op: a span
on the data plane's hot path (one per batch hop, plus unpack, pack, queue, compute and transfer)
then costs a context switch and nothing else, where a recording span with no exporter cost ids,
attributes and its end bookkeeping for every decode microbatch, only to be dropped. A no-op span
carries the incoming traceparent on unchanged, so a traced caller's context still travels
through an untraced stage.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor


def configure_tracing(service_name: str, otlp_endpoint: str | None, instance: str = "") -> TracerProvider | None:
    """The installed provider, or None when no endpoint is configured (tracing stays a no-op)."""
    if not otlp_endpoint:
        return None
    attributes = {"service.name": service_name, "service.namespace": "fornax"}
    if instance:
        attributes["service.instance.id"] = instance
    provider = TracerProvider(resource=Resource.create(attributes))
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    insecure = not otlp_endpoint.startswith("https://")
    exporter = OTLPSpanExporter(endpoint=otlp_endpoint, insecure=insecure)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
    trace.set_tracer_provider(provider)
    return provider


def server_interceptors() -> list:
    from opentelemetry.instrumentation.grpc import aio_server_interceptor

    return [aio_server_interceptor()]


def client_interceptors() -> list:
    from opentelemetry.instrumentation.grpc import aio_client_interceptors

    return list(aio_client_interceptors())
