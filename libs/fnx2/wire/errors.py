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
    # Terminal, beyond the 2.0 table: the transport or the listener ended the channel.
    CONNECTION_LOST = "CONNECTION_LOST"      # the peer closed or the socket failed
    HANDSHAKE_TIMEOUT = "HANDSHAKE_TIMEOUT"  # no hello ACK in time
    IDLE_TIMEOUT = "IDLE_TIMEOUT"            # no frame in time on an idle channel
    CONNECTION_LIMIT = "CONNECTION_LIMIT"    # the listener holds its maximum of channels
    PEER_REFUSED = "PEER_REFUSED"            # the peer's certificate identity is not allowed
    INTERNAL = "INTERNAL"                    # a receiver defect; never expected
    # Recoverable: one ERROR frame, the channel stays aligned.
    METADATA = "METADATA"
    TENSOR_CONTRACT = "TENSOR_CONTRACT"
    BATCH_CONTRACT = "BATCH_CONTRACT"
    BATCH_RESULT = "BATCH_RESULT"
    SEQUENCE = "SEQUENCE"
    # Recoverable, beyond the 2.0 table: a malformed compact_meta header or table.
    COMPACT_METADATA = "COMPACT_METADATA"
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


TERMINAL_CODES: frozenset[ErrorCode] = frozenset({
    ErrorCode.ABI_VERSION, ErrorCode.FRAME_SIZE, ErrorCode.CHECKSUM, ErrorCode.CONNECTION_LOST,
    ErrorCode.HANDSHAKE_TIMEOUT, ErrorCode.IDLE_TIMEOUT, ErrorCode.CONNECTION_LIMIT,
    ErrorCode.PEER_REFUSED, ErrorCode.INTERNAL,
})


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

    def __init__(self, message: str, code: ErrorCode = ErrorCode.CONNECTION_LOST) -> None:
        super().__init__(code, message)


class RemoteError(Fnx2Error):
    """The peer answered with an ERROR frame."""
