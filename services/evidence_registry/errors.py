"""Errors the evidence registry raises; each carries a gRPC status code and a stable reason."""

from __future__ import annotations

import grpc


class RegistryError(Exception):
    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    reason: str = "INTERNAL"

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class InvalidField(RegistryError):
    """Bad input. The message starts with the offending field's path."""

    code = grpc.StatusCode.INVALID_ARGUMENT
    reason = "INVALID_ARGUMENT"

    def __init__(self, field: str, reason: str, detail: str) -> None:
        super().__init__(f"{field}: {detail} [{reason}]", reason)
        self.field = field


class RecordNotFound(RegistryError):
    code = grpc.StatusCode.NOT_FOUND
    reason = "RECORD_NOT_FOUND"


class RecordConflict(RegistryError):
    """A put under an existing record id (or request id) with different content."""

    code = grpc.StatusCode.ALREADY_EXISTS
    reason = "RECORD_EXISTS"
