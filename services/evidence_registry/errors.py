"""The evidence registry's errors, on the shared hierarchy (status code + stable reason)."""

from __future__ import annotations

from libs.service.errors import AlreadyExists, DataLoss, InvalidArgument, NotFound


class InvalidField(InvalidArgument):
    """Bad input: names the offending field's path and a stable reason code."""

    def __init__(self, field: str, reason: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}", reason=reason, field=field)


class RecordNotFound(NotFound):
    default_reason = "RECORD_NOT_FOUND"


class RecordConflict(AlreadyExists):
    """A put under an existing record id (or request id) with different content."""

    default_reason = "RECORD_EXISTS"

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message, reason=reason)


class BlobDamaged(DataLoss):
    """The stored blob is missing or no longer hashes to the record's digest."""

    default_reason = "BLOB_MISMATCH"
