"""What a receiving channel asks of its stage's session rules, and the records they trade.

The channel moves frames; whether a BATCH's sequences execute, replay or are refused, and
what the credit vector holds, is decided by the stage's lease and KV epoch rules (leases,
replay, tombstones, deadlines). Those belong to the stage runtime
(`services.stage_worker.leases.ReceiverState` implements them); the channel is handed one
`SessionRules`, shared by all channels of the stage, and never builds its own. Pure
declarations: no sockets, no clocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from libs.fnx2.wire.control import AckCancel, AckRelease, Credit
from libs.fnx2.wire.errors import ErrorCode
from libs.fnx2.wire.messages import Batch, SequenceResult, SequenceSlice, SequenceStatus, Timings


# The per-sequence records below are immutable named tuples, not frozen dataclasses: every
# frame builds several per sequence, and a tuple is built in one C call.
class Rejection(NamedTuple):
    """A sequence refused at admission, with its per-sequence status and code."""

    slice: SequenceSlice
    status: SequenceStatus
    code: ErrorCode
    message: str


class ReplayHit(NamedTuple):
    """A retry of the last executed step: its earlier result and output rows, sent again."""

    slice: SequenceSlice
    result: SequenceResult
    rows: np.ndarray | None
    kind: tuple | None


@dataclass(frozen=True, slots=True)
class BatchAdmission:
    """What to do with each sequence of one batch; `execute` goes to the backend."""

    batch: Batch
    execute: tuple[SequenceSlice, ...]
    replayed: tuple[ReplayHit, ...]
    rejected: tuple[Rejection, ...]
    kv_reserved: int


class Outcome(NamedTuple):
    """The backend's verdict for one executed sequence."""

    ok: bool
    rows: np.ndarray | None = None
    code: str | None = None  # an ErrorCode, or a later stage's code relayed as it was sent
    message: str | None = None
    kind: tuple | None = None  # (TensorKind, DType) of the rows


class Entry(NamedTuple):
    """One sequence's result, with its output rows and their (kind, dtype) when ok."""

    result: SequenceResult
    rows: np.ndarray | None
    kind: tuple | None


class SessionRules(Protocol):
    """The stage's credit, lease and KV epoch rules. Every call is synchronous, so a check and
    its reservation are atomic with respect to the event loop; times are the caller's
    monotonic `now_ns`."""

    @property
    def frame_limit(self) -> int:
        """BATCH frames the stage executes at once (the credit vector's `frames`)."""
        ...

    @property
    def live_requests(self) -> int:
        """Leases open now; the channel keeps expiring them while any lives."""
        ...

    @property
    def lease_sequence_next(self) -> int:
        """The lowest lease number above every one seen (the `lease_sequence` ACK field)."""
        ...

    def credit(self, frames_cap: int | None = None, batches_received: int | None = None) -> Credit:
        """The credit vector, its frames bounded by `frames_cap` (a channel's own limit)."""
        ...

    def admit(self, batch: Batch, now_ns: int) -> BatchAdmission:
        """Credit, then each sequence's verdict, reserved atomically; raises `Fnx2Error`
        (CREDIT) for a batch the credit cannot hold."""
        ...

    def complete(self, admission: BatchAdmission, outcomes: dict[tuple[str, str], Outcome],
                 timings: Timings) -> list[Entry]:
        """Apply the backend's outcomes and give the batch's credit back; every sequence's
        entry, in request identity order."""
        ...

    def cancel(self, request_id: str, lease_id: str) -> AckCancel: ...

    def release(self, request_id: str, lease_id: str, expected_final_epoch: int | None,
                now_ns: int | None = None) -> AckRelease:
        """Free the lease; raises `Fnx2Error` (REQUEST_INFLIGHT, STALE_KV, ...) to refuse."""
        ...

    def sweep(self, now_ns: int) -> list[tuple[str, str]]:
        """Expire leases past their deadline; the (request, lease) ids freed."""
        ...
