"""An in-process OTLP/gRPC trace receiver for tests: collects every exported span."""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass(frozen=True)
class ReceivedSpan:
    service_name: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict


class _Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self):
        self.spans: list[ReceivedSpan] = []
        self.changed = threading.Condition()

    def Export(self, request, context):
        received = []
        for resource_spans in request.resource_spans:
            resource = {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    attrs = {kv.key: kv.value.string_value or kv.value.int_value for kv in span.attributes}
                    received.append(
                        ReceivedSpan(
                            service_name=resource.get("service.name", ""),
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            attributes=attrs,
                        )
                    )
        with self.changed:
            self.spans.extend(received)
            self.changed.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    def __init__(self):
        self._collector = _Collector()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self._collector, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> OtlpReceiver:
        self._server.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.stop(grace=None)

    def wait_for(self, predicate, timeout_s: float = 20.0) -> list[ReceivedSpan]:
        """Block until predicate(spans) is true; returns the spans so far."""
        with self._collector.changed:
            self._collector.changed.wait_for(lambda: predicate(self._collector.spans), timeout=timeout_s)
            return list(self._collector.spans)
