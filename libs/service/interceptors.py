"""The single place where exceptions become gRPC statuses, plus per-RPC metrics.

A FornaxError keeps its status code and reason; anything else becomes INTERNAL and is logged
with its traceback. The reason travels twice: as a google.rpc.ErrorInfo status detail (what
grpcurl and rich-status clients read) and as `fornax-reason` trailing metadata.
"""

from __future__ import annotations

import errno
import time
from collections.abc import AsyncIterator, Callable

import grpc
import structlog
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status
from prometheus_client import Counter, Histogram

from libs.service.errors import ERROR_DOMAIN, REASON_METADATA_KEY, FornaxError, Internal, ResourceExhausted

RPC_SECONDS = Histogram(
    "fornax_grpc_server_handling_seconds", "gRPC handling time", ["service", "method", "code"]
)
RPC_ERRORS = Counter(
    "fornax_grpc_errors_total", "gRPC calls that ended in an error", ["service", "code", "reason"]
)

log = structlog.get_logger()
# A write the volume could not take: the caller can act on it (free space), unlike an internal fault.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def status_for(error: FornaxError) -> grpc.Status:
    info = error_details_pb2.ErrorInfo(reason=error.reason, domain=ERROR_DOMAIN)
    if error.field:
        info.metadata["field"] = error.field
    detail = any_pb2.Any()
    detail.Pack(info)
    proto = status_pb2.Status(code=error.code.value[0], message=str(error), details=[detail])
    status = rpc_status.to_status(proto)
    metadata = tuple(status.trailing_metadata) + ((REASON_METADATA_KEY, error.reason),)
    return _Status(status.code, status.details, metadata)


class _Status(grpc.Status):
    def __init__(self, code, details, trailing_metadata):
        self.code = code
        self.details = details
        self.trailing_metadata = trailing_metadata


def reason_of(error: grpc.RpcError) -> str | None:
    """The stable reason code a Fornax server attached to an error, if any."""
    for key, value in error.trailing_metadata() or ():
        if key == REASON_METADATA_KEY:
            return value
    return None


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, service_kind: str):
        self._service = service_kind

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method.rsplit("/", 1)[-1]
        if handler.unary_unary:
            return handler._replace(unary_unary=self._wrap_unary(handler.unary_unary, method))
        if handler.stream_unary:
            return handler._replace(stream_unary=self._wrap_unary(handler.stream_unary, method))
        if handler.unary_stream:
            return handler._replace(unary_stream=self._wrap_stream(handler.unary_stream, method))
        return handler._replace(stream_stream=self._wrap_stream(handler.stream_stream, method))

    def _wrap_unary(self, behavior: Callable, method: str) -> Callable:
        async def wrapped(request, context):
            started = time.perf_counter()
            code = "OK"
            try:
                return await behavior(request, context)
            except Exception as exc:
                error = self._classify(exc, method)
                if error is None:
                    raise
                code = error.code.name
                await self._abort(error, context)
            finally:
                RPC_SECONDS.labels(self._service, method, code).observe(time.perf_counter() - started)

        return wrapped

    def _wrap_stream(self, behavior: Callable, method: str) -> Callable:
        async def wrapped(request, context) -> AsyncIterator:
            started = time.perf_counter()
            code = "OK"
            try:
                async for item in behavior(request, context):
                    yield item
            except Exception as exc:
                error = self._classify(exc, method)
                if error is None:
                    raise
                code = error.code.name
                await self._abort(error, context)
            finally:
                RPC_SECONDS.labels(self._service, method, code).observe(time.perf_counter() - started)

        return wrapped

    def _classify(self, exc: Exception, method: str) -> FornaxError | None:
        """The FornaxError to report for exc, or None when gRPC itself owns exc."""
        if isinstance(exc, grpc.aio.AbortError):
            return None
        if isinstance(exc, FornaxError):
            log.info("rpc_failed", method=method, code=exc.code.name, reason=exc.reason, message=exc.message)
            return exc
        log.error("rpc_internal_error", method=method, exc_info=exc)
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return ResourceExhausted(f"{method}: the service's disk is full ({exc.strerror}); free space on the "
                                     "volume that holds its state directory and retry", reason="DISK_FULL")
        return Internal(f"unexpected {type(exc).__name__} in {method}")

    async def _abort(self, error: FornaxError, context) -> None:
        RPC_ERRORS.labels(self._service, error.code.name, error.reason).inc()
        status = status_for(error)
        await context.abort(status.code, status.details, status.trailing_metadata)
