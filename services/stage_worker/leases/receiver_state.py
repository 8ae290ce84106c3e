"""A stage's FNX2 session rules as a pure core: credits, leases, KV epochs, replay, tombstones.

The rules check each slice's KV epoch against `epochs` (`epochs.py`): in a stage worker that is
the KV store itself, so a stage process keeps one epoch per lease.

The stage worker hands one `ReceiverState` to its `Fnx2Receiver`, which asks it about every
frame through `libs.fnx2.channel.session.SessionRules`; the records they trade
(`BatchAdmission`, `Outcome`, `Entry`) are declared there.
No sockets and no clock reads: callers pass `now_ns` from their own monotonic clock.
One `ReceiverState` belongs to one stage and is shared by all of its inbound channels.
Exact replay is keyed on the semantic identity (plan, manifest, request, lease, step,
phase, position, epoch) plus an input identity (small inputs byte for byte, large ones
by CRC32C); the same identity with other input is SEQUENCE_CONFLICT.
Admission checks and reservations happen in one synchronous call, so they are atomic
with respect to the event loop.
"""

from __future__ import annotations

import collections
import operator
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from libs.fnx2.channel.session import BatchAdmission, Entry, Outcome, Rejection, ReplayHit
from libs.fnx2.wire.control import AckCancel, AckRelease, ChannelBinding, Credit
from libs.fnx2.wire.errors import ErrorCode, Fnx2Error
from libs.fnx2.wire.leases import derive_execution_lease_id, local_deadline
from libs.fnx2.wire.messages import Batch, Phase, SequenceResult, SequenceSlice, SequenceStatus, Timings
from libs.fnx2.wire.tensor import crc32c
from services.stage_worker.leases.epochs import CommittedSteps, LeaseEpochs
from services.stage_worker.leases.lease_watermark import LeaseWatermark
from services.stage_worker.leases.tombstones import Tombstone, TombstoneTable


@dataclass(frozen=True, slots=True)
class ReceiverLimits:
    """The stage's credit vector limits and bookkeeping bounds."""

    frames: int = 1
    payload_bytes: int = 256 * 1024 * 1024
    rows: int = 65536
    sequences: int = 1024
    live_requests: int = 1024
    kv_bytes: int = 1 << 40
    replay_bytes: int = 1 << 30
    kv_bytes_per_row: int = 0
    replay_bytes_per_row: int = 0
    tombstone_capacity: int = 65536
    # How long an ended lease stays fenced: far beyond any frame's transit or a sender's
    # retry window, yet short enough that tombstones scale with the request rate, not
    # with every request of a plan generation.
    tombstone_ttl_ns: int = 60 * 10**9
    # A lease that no frame touched for this long expires even before its deadline, so KV
    # orphaned by a sender that vanished (a restarted orchestrator sends no release, and
    # requests without a deadline carry a day-long budget) is freed within this TTL.
    lease_idle_ttl_ns: int = 15 * 60 * 10**9
    # Leases numbered by the negotiated lease_sequence extension are fenced by a watermark:
    # at most this many skipped numbers are remembered (each for lease_idle_ttl_ns), and
    # the end reasons (RELEASED or DEADLINE) of this many recently ended leases, so a
    # stale frame gets the exact code; older ones get RELEASED ("lease ended").
    lease_sequence_gaps: int = 4096
    recent_end_reasons: int = 1024
    # Prefix reuse: a lease may open at a multiple of this many tokens (a prefix of whole KV
    # blocks the stage pinned at admission; its KV store refuses a prefix it does not hold).
    # 0: every lease opens at position 0.
    prefix_block_tokens: int = 0


_TOMBSTONE_CODES = {Tombstone.RELEASED: ErrorCode.RELEASED, Tombstone.EXPIRED: ErrorCode.DEADLINE}


_EXACT_INPUT_BYTES = 64 * 1024


# The per-sequence records below are immutable named tuples, not frozen dataclasses: every
# frame builds several per sequence, and a tuple is built in one C call.
class InputIdentity(NamedTuple):
    """What a retry's input must match: small inputs (decode steps) byte for byte, large
    ones (prefill chunks) by length and CRC32C, so no frame buffer stays pinned."""

    kind: tuple
    nbytes: int
    exact: bytes | None
    crc: int | None

    @classmethod
    def of(cls, batch: Batch, item: SequenceSlice, known_crc: int | None = None) -> InputIdentity:
        d = batch.tensor.descriptor
        rows = batch.tensor.rows(item.input_row_start, item.input_row_count)
        kind, nbytes = (d.kind, d.dtype, d.width), rows.nbytes
        if nbytes <= _EXACT_INPUT_BYTES:
            return cls(kind, nbytes, np.ascontiguousarray(rows).tobytes(), None)
        if known_crc is None:
            known_crc = crc32c(np.ascontiguousarray(rows).reshape(-1).view(np.uint8))
        return cls(kind, nbytes, None, known_crc)

    @property
    def retained_bytes(self) -> int:
        return len(self.exact or b"")


class _SmallInputs(NamedTuple):
    """A small batch's whole input as bytes, copied once: each sequence's exact input
    identity is a slice of it (what `InputIdentity.of` builds, without a numpy copy per
    sequence)."""

    kind: tuple
    row_bytes: int
    data: bytes

    @classmethod
    def of(cls, batch: Batch) -> _SmallInputs | None:
        d = batch.tensor.descriptor
        if d.payload_bytes > _EXACT_INPUT_BYTES:  # a slice may be large: by CRC, per sequence
            return None
        return cls((d.kind, d.dtype, d.width), d.row_bytes, batch.tensor.array.tobytes())

    def identity(self, item: SequenceSlice) -> InputIdentity:
        start = item.input_row_start * self.row_bytes
        nbytes = item.input_row_count * self.row_bytes
        return InputIdentity(self.kind, nbytes, self.data[start:start + nbytes], None)


class _ReplayEntry(NamedTuple):
    """The last executed step of a lease: identity, input identity, result, output rows,
    and the bytes it keeps (its exact input and its rows)."""

    key: tuple
    inputs: InputIdentity
    result: SequenceResult
    rows: np.ndarray | None
    kind: tuple | None
    retained_bytes: int

    def same_input(self, batch: Batch, item: SequenceSlice) -> bool:
        return InputIdentity.of(batch, item) == self.inputs  # rare: only on a retry


@dataclass(slots=True)
class _Lease:
    request_id: str
    lease_id: str
    deadline_ns: int
    last_active_ns: int = 0
    next_sequence_no: int = 0
    next_position: int = 0
    decoded: bool = False
    cancelled: bool = False
    inflight: bool = False
    kv_bytes: int = 0
    replay: _ReplayEntry | None = None
    sequence: int | None = None  # the lease_sequence extension's number, if it came with one


_NO_OUTCOME = Outcome(False, None, ErrorCode.FAILED, "no outcome")


@dataclass
class ReceiverState:
    binding: ChannelBinding
    limits: ReceiverLimits = field(default_factory=ReceiverLimits)
    # Each lease's KV epoch: the stage's KV store, or a count of steps where nothing keeps KV.
    epochs: LeaseEpochs = field(default_factory=CommittedSteps)
    _leases: dict[str, _Lease] = field(default_factory=dict)
    _tombstones: TombstoneTable = field(init=False)
    _watermark: LeaseWatermark = field(init=False)
    _end_reasons: collections.OrderedDict[str, Tombstone] = field(init=False)
    _busy_frames: int = 0
    _busy_payload: int = 0
    _busy_rows: int = 0
    _busy_sequences: int = 0
    _kv_used: int = 0
    _replay_used: int = 0

    def __post_init__(self) -> None:
        self._tombstones = TombstoneTable(self.limits.tombstone_ttl_ns)
        self._watermark = LeaseWatermark(self.limits.lease_sequence_gaps, self.limits.lease_idle_ttl_ns)
        self._end_reasons = collections.OrderedDict()

    # -- credits -------------------------------------------------------------------------
    def credit(self, frames_cap: int | None = None, batches_received: int | None = None) -> Credit:
        """The credit vector; `frames_cap` bounds its frames (a channel's own frame limit),
        `batches_received` goes with it (a channel's multi_inflight count)."""
        lim = self.limits
        frames = lim.frames - self._busy_frames
        if frames_cap is not None:
            frames = min(frames, frames_cap)
        return Credit(
            frames=max(0, frames),
            payload_bytes=max(0, lim.payload_bytes - self._busy_payload),
            rows=max(0, lim.rows - self._busy_rows),
            sequences=max(0, lim.sequences - self._busy_sequences),
            live_requests=max(0, lim.live_requests - len(self._leases)),
            kv_bytes=max(0, lim.kv_bytes - self._kv_used),
            replay_bytes=max(0, lim.replay_bytes - self._replay_used),
            batches_received=batches_received,
        )

    def _kv_free(self) -> int:
        return max(0, self.limits.kv_bytes - self._kv_used)

    @property
    def frame_limit(self) -> int:
        return self.limits.frames

    @property
    def live_requests(self) -> int:
        return len(self._leases)

    @property
    def tombstones(self) -> int:
        return len(self._tombstones)

    @property
    def lease_sequence_next(self) -> int:
        """The lowest lease number above every one opened or ended here (lease_sequence)."""
        return self._watermark.watermark

    @property
    def fence_entries(self) -> int:
        """Everything kept to fence ended leases: per-lease tombstones (plain 2.0 peers),
        watermark gaps and recent end reasons (lease_sequence peers)."""
        return len(self._tombstones) + self._watermark.gaps + len(self._end_reasons)

    def epoch_of(self, request_id: str) -> int | None:
        lease = self._leases.get(request_id)
        return None if lease is None else self.epochs.epoch_of(lease.request_id, lease.lease_id)

    # -- admission -----------------------------------------------------------------------
    def admit(self, batch: Batch, now_ns: int) -> BatchAdmission:
        """Step 6: credit, then per sequence lease, replay, deadline, epoch; reserve atomically."""
        self._tombstones.evict(now_ns)
        lim = self.limits
        need = (1, batch.tensor.descriptor.payload_bytes, batch.batch.input_row_count,
                len(batch.batch.sequences))
        have = (max(0, lim.frames - self._busy_frames), max(0, lim.payload_bytes - self._busy_payload),
                max(0, lim.rows - self._busy_rows), max(0, lim.sequences - self._busy_sequences))
        if need[0] > have[0] or need[1] > have[1] or need[2] > have[2] or need[3] > have[3]:
            raise Fnx2Error(ErrorCode.CREDIT, f"batch needs {need}, receiver has {have}")
        execute: list[SequenceSlice] = []
        replayed: list[ReplayHit] = []
        rejected: list[Rejection] = []
        kv_reserved = 0
        for item in batch.batch.sequences:
            verdict = self._decide(batch, item, now_ns, kv_reserved)
            if isinstance(verdict, int):  # the KV bytes reserved for it: execute
                kv_reserved += verdict
                execute.append(item)
            elif isinstance(verdict, Rejection):
                rejected.append(verdict)
            else:
                replayed.append(verdict)
        for item in execute:
            self._leases[item.request_id].inflight = True
        self._kv_used += kv_reserved
        self._reserve(1, need[1], need[2], need[3])
        return BatchAdmission(batch, tuple(execute), tuple(replayed), tuple(rejected),
                         kv_reserved)

    def _reserve(self, frames: int, payload: int, rows: int, sequences: int) -> None:
        self._busy_frames += frames
        self._busy_payload += payload
        self._busy_rows += rows
        self._busy_sequences += sequences

    def _decide(self, batch: Batch, item: SequenceSlice, now_ns: int,
                kv_reserved: int) -> Rejection | ReplayHit | int:
        tomb = self._tombstones.get(item.execution_lease_id)
        if tomb is not None:
            status = SequenceStatus.DEADLINE if tomb is Tombstone.EXPIRED else SequenceStatus.REJECTED
            return _reject(item, _TOMBSTONE_CODES[tomb], f"lease is tombstoned ({tomb.value})", status)
        lease = self._leases.get(item.request_id)
        if lease is None or lease.lease_id != item.execution_lease_id:
            expected = derive_execution_lease_id(self.binding.plan_generation_id, batch.plan_id,
                                                 batch.plan_hash, item.request_id)
            if item.execution_lease_id != expected:
                return _reject(item, ErrorCode.UNKNOWN_LEASE, "lease is not of this plan generation")
            if item.lease_sequence is not None and self._watermark.ended(item.lease_sequence):
                ended = self._end_reasons.get(item.execution_lease_id, Tombstone.RELEASED)
                status = SequenceStatus.DEADLINE if ended is Tombstone.EXPIRED else SequenceStatus.REJECTED
                return _reject(item, _TOMBSTONE_CODES[ended], f"lease ended ({ended.value}; "
                               "below the lease-sequence watermark)", status)
        if lease is not None and lease.inflight:
            return _reject(item, ErrorCode.REQUEST_INFLIGHT, "request is already executing")
        if (lease is not None and lease.replay is not None  # a retry repeats its step number
                and lease.replay.result.request_sequence_no == item.request_sequence_no
                and lease.replay.key == _replay_key(_replay_prefix(batch), item)):
            if not lease.replay.same_input(batch, item):
                return _reject(item, ErrorCode.SEQUENCE_CONFLICT, "same identity, different input")
            return ReplayHit(item, lease.replay.result, lease.replay.rows, lease.replay.kind)
        deadline = local_deadline(now_ns, item.deadline_budget_ns,
                                  None if lease is None else lease.deadline_ns)
        if item.deadline_budget_ns == 0 or now_ns >= deadline:
            return self._expire_on_arrival(item, lease)
        if lease is not None:
            lease.deadline_ns = deadline
            lease.last_active_ns = now_ns
            return self._continue_lease(batch, item, lease, kv_reserved)
        return self._open_lease(batch, item, (now_ns, deadline), kv_reserved)

    def _expire_on_arrival(self, item: SequenceSlice, lease: _Lease | None) -> Rejection:
        if lease is not None:
            self._retire(lease, Tombstone.EXPIRED)
        elif item.lease_sequence is not None:  # fenced by the watermark, no tombstone
            self._watermark.consume(item.lease_sequence, self._latest_ns)
            self._remember_end(item.execution_lease_id, Tombstone.EXPIRED)
        elif len(self._tombstones) < self.limits.tombstone_capacity:
            self._tombstones.add(item.execution_lease_id, Tombstone.EXPIRED)
        else:
            return _reject(item, ErrorCode.TOMBSTONE_CAPACITY, "tombstone table is full")
        return _reject(item, ErrorCode.DEADLINE, "deadline budget exhausted", SequenceStatus.DEADLINE)

    def _continue_lease(self, batch: Batch, item: SequenceSlice, lease: _Lease,
                        kv_reserved: int) -> Rejection | int:
        if lease.lease_id != item.execution_lease_id:
            return _reject(item, ErrorCode.LEASE_CONFLICT, "request holds a different lease")
        if lease.cancelled:
            return _reject(item, ErrorCode.CANCELLED, "request was cancelled", SequenceStatus.CANCELLED)
        if item.request_sequence_no != lease.next_sequence_no:
            return _reject(item, ErrorCode.SEQUENCE, f"expected request_sequence_no {lease.next_sequence_no}")
        epoch = self.epochs.epoch_of(lease.request_id, lease.lease_id)
        if item.kv_epoch != epoch:
            return _reject(item, ErrorCode.STALE_KV, f"stage KV epoch is {epoch}")
        if batch.batch.phase is Phase.PREFILL and lease.decoded:
            return _reject(item, ErrorCode.PHASE, "prefill after decode")
        if item.token_position_start != lease.next_position:
            return _reject(item, ErrorCode.POSITION, f"expected token position {lease.next_position}")
        kv = item.input_row_count * self.limits.kv_bytes_per_row
        if kv > self._kv_free() - kv_reserved:  # per decode row: no whole Credit vector
            return _reject(item, ErrorCode.ADMISSION, "no KV credit")
        return kv

    def _open_lease(self, batch: Batch, item: SequenceSlice, times: tuple[int, int],
                    kv_reserved: int) -> Rejection | int:
        if item.request_sequence_no != 0:
            return _reject(item, ErrorCode.UNKNOWN_LEASE, "no live lease for a continuing request")
        if batch.batch.phase is not Phase.PREFILL:
            return _reject(item, ErrorCode.PHASE, "a lease starts with prefill")
        block = self.limits.prefix_block_tokens
        if item.token_position_start != 0 and not (block and item.token_position_start % block == 0):
            allowed = f"0 or a multiple of {block} (a reused prefix)" if block else "0"
            return _reject(item, ErrorCode.POSITION, f"a lease starts at token position {allowed}")
        if item.kv_epoch != 0:
            return _reject(item, ErrorCode.STALE_KV, "a lease starts at KV epoch 0")
        if item.lease_sequence is None and (len(self._leases) + len(self._tombstones)
                                            >= self.limits.tombstone_capacity):
            return _reject(item, ErrorCode.TOMBSTONE_CAPACITY, "tombstone table is full")
        credit = self.credit()
        kv = item.input_row_count * self.limits.kv_bytes_per_row
        replay = item.input_row_count * self.limits.replay_bytes_per_row
        if credit.live_requests < 1 or kv > credit.kv_bytes - kv_reserved or replay > credit.replay_bytes:
            return _reject(item, ErrorCode.ADMISSION, "no live-request, KV or replay credit")
        now_ns, deadline = times
        if item.lease_sequence is not None:
            self._watermark.consume(item.lease_sequence, now_ns)
        self._leases[item.request_id] = _Lease(item.request_id, item.execution_lease_id, deadline,
                                               now_ns, next_position=item.token_position_start,
                                               sequence=item.lease_sequence)
        return kv

    # -- completion ----------------------------------------------------------------------
    def complete(self, admission: BatchAdmission, outcomes: dict[tuple[str, str], Outcome],
                 timings: Timings) -> list[Entry]:
        """Apply the backend's outcomes; returns (result, output rows) in identity order."""
        batch = admission.batch
        self._reserve(-1, -batch.tensor.descriptor.payload_bytes, -batch.batch.input_row_count,
                      -len(batch.batch.sequences))
        self._kv_used -= admission.kv_reserved
        entries: list[Entry] = []
        crcs = batch.input_crcs
        index = {s.identity: i for i, s in enumerate(batch.batch.sequences)} if crcs else {}
        inputs = _SmallInputs.of(batch)
        replay_key = _replay_prefix(batch)
        for item in admission.execute:
            identity = (item.request_id, item.execution_lease_id)
            outcome = outcomes.get(identity) or _NO_OUTCOME
            known = crcs[index[identity]] if crcs else None
            entries.append(self._apply(admission, item, outcome, timings, known, inputs, replay_key))
        for hit in admission.replayed:
            entries.append(Entry(hit.result, hit.rows, hit.kind))
        for r in admission.rejected:
            entries.append(Entry(_failed(r.slice, r.status, r.code.value, r.message, timings),
                                 None, None))
        entries.sort(key=_ENTRY_IDENTITY)
        return entries

    def _apply(self, admission: BatchAdmission, item: SequenceSlice, outcome: Outcome,
               timings: Timings, known_crc: int | None, inputs: _SmallInputs | None = None,
               replay_prefix: tuple | None = None) -> Entry:
        lease = self._leases.get(item.request_id)
        if lease is None:  # expired or released while executing; nothing to update
            return Entry(_failed(item, SequenceStatus.FAILED, ErrorCode.RELEASED, "lease ended", timings),
                         None, None)
        lease.inflight = False
        if not outcome.ok or outcome.rows is None:
            return Entry(_failed(item, SequenceStatus.FAILED, outcome.code or ErrorCode.FAILED,
                                 outcome.message or "backend failure", timings), None, None)
        batch = admission.batch
        kv = item.input_row_count * self.limits.kv_bytes_per_row
        lease.kv_bytes += kv
        self._kv_used += kv
        self.epochs.step_committed(lease.request_id, lease.lease_id)
        lease.next_sequence_no += 1
        lease.next_position += item.input_row_count
        lease.decoded = lease.decoded or batch.batch.phase is Phase.DECODE
        result = SequenceResult(
            item.request_id, item.execution_lease_id, item.request_sequence_no, SequenceStatus.OK,
            item.input_row_start, item.input_row_count, 0, len(outcome.rows),
            item.kv_epoch, item.kv_epoch + 1, None, None, timings)
        rows = np.array(outcome.rows)  # the backend may reuse its output buffer
        if lease.replay is not None:
            self._replay_used -= lease.replay.retained_bytes
        identity = (inputs.identity(item) if inputs is not None
                    else InputIdentity.of(batch, item, known_crc))
        retained = (0 if identity.exact is None else len(identity.exact)) + rows.nbytes
        prefix = replay_prefix if replay_prefix is not None else _replay_prefix(batch)
        lease.replay = _ReplayEntry(_replay_key(prefix, item), identity, result, rows,
                                    outcome.kind, retained)
        self._replay_used += retained
        return Entry(result, rows, outcome.kind)

    # -- cancel, release, expiry ---------------------------------------------------------
    def cancel(self, request_id: str, lease_id: str) -> AckCancel:
        lease = self._leases.get(request_id)
        if lease is None or lease.lease_id != lease_id:
            return AckCancel(request_id, lease_id, False, False, False)
        lease.cancelled = True
        return AckCancel(request_id, lease_id, True, lease.inflight, False)

    def release(self, request_id: str, lease_id: str, expected_final_epoch: int | None,
                now_ns: int | None = None) -> AckRelease:
        """`now_ns` (the caller's monotonic clock) dates the tombstone; without it, the
        latest time this state has seen."""
        self._tombstones.evict(now_ns)
        if lease_id in self._tombstones or lease_id in self._end_reasons:
            return AckRelease(request_id, lease_id, False, None, 0, True)
        lease = self._leases.get(request_id)
        if lease is None or lease.lease_id != lease_id:
            if len(self._leases) + len(self._tombstones) >= self.limits.tombstone_capacity:
                raise Fnx2Error(ErrorCode.TOMBSTONE_CAPACITY, "tombstone table is full")
            self._tombstones.add(lease_id, Tombstone.RELEASED)
            return AckRelease(request_id, lease_id, False, None, 0, True)
        if lease.inflight:
            raise Fnx2Error(ErrorCode.REQUEST_INFLIGHT, "request is executing")
        epoch = self.epochs.epoch_of(request_id, lease_id)
        if expected_final_epoch is not None and expected_final_epoch != epoch:
            raise Fnx2Error(ErrorCode.STALE_KV, f"stage KV epoch is {epoch}")
        released_results = 1 if lease.replay is not None else 0
        self._retire(lease, Tombstone.RELEASED)
        return AckRelease(request_id, lease_id, True, epoch, released_results, True)

    def sweep(self, now_ns: int) -> list[tuple[str, str]]:
        """Expire idle leases past their local deadline and forget tombstones past their
        time; returns the (request, lease) ids freed."""
        self._tombstones.evict(now_ns)
        self._watermark.evict(now_ns)
        expired = [lease for lease in self._leases.values()
                   if not lease.inflight and (now_ns >= lease.deadline_ns or now_ns
                                              - lease.last_active_ns >= self.limits.lease_idle_ttl_ns)]
        for lease in expired:
            self._retire(lease, Tombstone.EXPIRED)
        return [(lease.request_id, lease.lease_id) for lease in expired]

    def _retire(self, lease: _Lease, reason: Tombstone) -> None:
        """Free KV and replay state; room for the tombstone was reserved at admission."""
        self._leases.pop(lease.request_id, None)
        self.epochs.forget(lease.request_id, lease.lease_id)
        self._kv_used -= lease.kv_bytes
        if lease.replay is not None:
            self._replay_used -= lease.replay.retained_bytes
        lease.replay = None
        if lease.sequence is None:
            self._tombstones.add(lease.lease_id, reason)
        else:  # its number is below the watermark and not a gap: fenced with no tombstone
            self._remember_end(lease.lease_id, reason)

    def _remember_end(self, lease_id: str, reason: Tombstone) -> None:
        self._end_reasons[lease_id] = reason
        while len(self._end_reasons) > self.limits.recent_end_reasons:
            self._end_reasons.popitem(last=False)

    @property
    def _latest_ns(self) -> int:
        return self._tombstones.latest_ns


def _replay_prefix(batch: Batch) -> tuple:
    """What every sequence of `batch` shares in its replay identity."""
    return (batch.plan_hash, batch.manifest_hash, batch.batch.phase)


def _replay_key(prefix: tuple, item: SequenceSlice) -> tuple:
    return (prefix, item.request_id, item.execution_lease_id, item.request_sequence_no,
            item.token_position_start, item.kv_epoch)


_ENTRY_IDENTITY = operator.attrgetter("result.request_id", "result.execution_lease_id")


def _reject(item: SequenceSlice, code: ErrorCode, why: str,
            status: SequenceStatus = SequenceStatus.REJECTED) -> Rejection:
    return Rejection(item, status, code, why)


def _failed(item: SequenceSlice, status: SequenceStatus, code: str, message: str,
            timings: Timings) -> SequenceResult:
    return SequenceResult(item.request_id, item.execution_lease_id, item.request_sequence_no,
                          status, item.input_row_start, item.input_row_count, None, 0,
                          item.kv_epoch, item.kv_epoch, code, message, timings)
