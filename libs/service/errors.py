"""One exception hierarchy for every service.

Each class carries its gRPC status code; each instance carries a stable UPPER_SNAKE reason
code and optionally the request field it is about. Business code raises these and never
calls `context.abort`: `libs.service.interceptors.ErrorInterceptor` maps them to statuses.
"""

from __future__ import annotations

import grpc


class FornaxError(Exception):
    """Base of every expected, client-visible failure."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    default_reason: str = "INTERNAL"

    def __init__(self, message: str, *, reason: str | None = None, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        self.field = field
        if not self.reason.isupper() or " " in self.reason:
            raise ValueError(f"reason codes are UPPER_SNAKE, got {self.reason!r}")

    def __str__(self) -> str:
        where = f" (field {self.field})" if self.field else ""
        return f"{self.reason}: {self.message}{where}"


class InvalidArgument(FornaxError):
    code = grpc.StatusCode.INVALID_ARGUMENT
    default_reason = "INVALID_ARGUMENT"


class NotFound(FornaxError):
    code = grpc.StatusCode.NOT_FOUND
    default_reason = "NOT_FOUND"


class AlreadyExists(FornaxError):
    code = grpc.StatusCode.ALREADY_EXISTS
    default_reason = "ALREADY_EXISTS"


class FailedPrecondition(FornaxError):
    code = grpc.StatusCode.FAILED_PRECONDITION
    default_reason = "FAILED_PRECONDITION"


class ResourceExhausted(FornaxError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    default_reason = "CAPACITY"


class Unavailable(FornaxError):
    code = grpc.StatusCode.UNAVAILABLE
    default_reason = "UNAVAILABLE"


class DeadlineExceeded(FornaxError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED
    default_reason = "DEADLINE"


class Aborted(FornaxError):
    code = grpc.StatusCode.ABORTED
    default_reason = "ABORTED"


class Cancelled(FornaxError):
    code = grpc.StatusCode.CANCELLED
    default_reason = "CANCELLED"


class Unauthenticated(FornaxError):
    code = grpc.StatusCode.UNAUTHENTICATED
    default_reason = "UNAUTHENTICATED"


class PermissionDenied(FornaxError):
    """The caller is known but its role may not do this (or a path lies outside the roots)."""

    code = grpc.StatusCode.PERMISSION_DENIED
    default_reason = "PERMISSION_DENIED"


class DataLoss(FornaxError):
    code = grpc.StatusCode.DATA_LOSS
    default_reason = "DATA_LOSS"


class Internal(FornaxError):
    code = grpc.StatusCode.INTERNAL
    default_reason = "INTERNAL"


def describe_failure(exc: BaseException) -> str:
    """One line for a failure: a FornaxError's reason and message; a gRPC call's status code and
    details (a Fornax service's details begin with its reason); anything else its type and text."""
    if isinstance(exc, FornaxError):
        return f"{exc.reason}: {exc.message}"
    if isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None)):
        code = exc.code()
        details = exc.details() if callable(getattr(exc, "details", None)) else ""
        return f"{code.name if code is not None else 'UNKNOWN'}: {details}"
    return f"{type(exc).__name__}: {exc}"


ERROR_DOMAIN = "fornax"
REASON_METADATA_KEY = "fornax-reason"
