"""FNX2 error codes and the one exception type every FNX2 failure is raised as."""

from __future__ import annotations

from enum import StrEnum

MAX_ERROR_CODE_CHARS = 64
MAX_ERROR_MESSAGE_CHARS = 256


class ErrorCode(StrEnum):
    # Terminal: the channel closes.
    ABI_VERSION = "ABI_VERSION"
    FRAME_SIZE = "FRAME_SIZE"
    CHECKSUM = "CHECKSUM"
    # Recoverable: one ERROR frame, the channel stays aligned.
    METADATA = "METADATA"
    TENSOR_CONTRACT = "TENSOR_CONTRACT"
    BATCH_CONTRACT = "BATCH_CONTRACT"
    BATCH_RESULT = "BATCH_RESULT"
    SEQUENCE = "SEQUENCE"
    # Per sequence.
    UNKNOWN_LEASE = "UNKNOWN_LEASE"
    RELEASED = "RELEASED"
    DEADLINE = "DEADLINE"
    LEASE_CONFLICT = "LEASE_CONFLICT"
    ADMISSION = "ADMISSION"
    SEQUENCE_CONFLICT = "SEQUENCE_CONFLICT"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"  # the stage (or a later one) could not execute the sequence
    STALE_KV = "STALE_KV"
    PHASE = "PHASE"
    POSITION = "POSITION"
    # Batch or runtime.
    STALE_PLAN = "STALE_PLAN"
    CREDIT = "CREDIT"
    TOMBSTONE_CAPACITY = "TOMBSTONE_CAPACITY"
    REQUEST_INFLIGHT = "REQUEST_INFLIGHT"


TERMINAL_CODES: frozenset[ErrorCode] = frozenset(
    {ErrorCode.ABI_VERSION, ErrorCode.FRAME_SIZE, ErrorCode.CHECKSUM}
)


def bounded(text: str, limit: int = MAX_ERROR_MESSAGE_CHARS) -> str:
    """Diagnostics crossing the wire are ASCII-safe and bounded."""
    text = text.encode("ascii", "replace").decode("ascii")
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Fnx2Error(Exception):
    """An FNX2 failure carrying its wire code and whether it ends the channel."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        self.code = ErrorCode(code)
        self.message = bounded(message)
        super().__init__(f"{self.code.value}: {self.message}")

    @property
    def terminal(self) -> bool:
        return self.code in TERMINAL_CODES


class ChannelClosedError(Fnx2Error):
    """The peer closed the stream or a terminal error ended the channel."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.FRAME_SIZE) -> None:
        super().__init__(code, message)


class RemoteError(Fnx2Error):
    """The peer answered with an ERROR frame."""
