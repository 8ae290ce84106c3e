"""Typed BATCH and RESULT messages of FNX2 2.0 and their closed metadata field sets."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, NamedTuple

from libs.fnx2.wire.errors import MAX_ERROR_CODE_CHARS, MAX_ERROR_MESSAGE_CHARS, ErrorCode, Fnx2Error
from libs.fnx2.wire.fields import (
    UINT32_MAX,
    UINT64_MAX,
    Fields,
    canonical_json,
    canonical_sha256,
    is_uuid,
    member,
)
from libs.fnx2.wire.tensor import Tensor

MAX_SEQUENCES_PER_BATCH = 4096
MAX_ID_CHARS = 128
TRACEPARENT_CHARS = 55


def _u64(value: Any) -> bool:
    return type(value) is int and 0 <= value <= UINT64_MAX


def _u32(value: Any) -> bool:
    return type(value) is int and 0 <= value <= UINT32_MAX


def _id(value: Any, limit: int = MAX_ID_CHARS) -> bool:
    return type(value) is str and 0 < len(value) <= limit


class Kind:
    BATCH = 1
    RESULT = 2
    CREDIT = 3
    CANCEL = 4
    RELEASE = 5
    ACK = 6
    ERROR = 7
    CONTROL = 8


class Phase(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"


class SequenceStatus(StrEnum):
    OK = "ok"
    CANCELLED = "cancelled"
    DEADLINE = "deadline"
    REJECTED = "rejected"
    FAILED = "failed"


_SLICE_FIELDS = frozenset({
    "request_id", "request_sequence_no", "input_row_start", "input_row_count",
    "token_position_start", "kv_epoch", "deadline_budget_ns", "execution_lease_id",
    "trace_id", "span_id",
})
# With the negotiated lease_sequence extension a slice also names its lease's place in the
# plan generation's opening order (services.stage_worker.leases.lease_watermark).
LEASE_SEQUENCE_FIELD = "lease_sequence"
_SEQUENCED_SLICE_FIELDS = _SLICE_FIELDS | {LEASE_SEQUENCE_FIELD}


# SequenceSlice, Timings and SequenceResult are immutable named tuples rather than frozen
# dataclasses: a decode step builds dozens of them per frame, and a tuple is built in one
# C call where a frozen dataclass sets each field through object.__setattr__.
class SequenceSlice(NamedTuple):
    request_id: str
    request_sequence_no: int
    input_row_start: int
    input_row_count: int
    token_position_start: int
    kv_epoch: int
    deadline_budget_ns: int
    execution_lease_id: str
    trace_id: str
    span_id: str
    lease_sequence: int | None = None  # only on a channel that negotiated lease_sequence

    @property
    def identity(self) -> tuple[str, str]:
        return (self.request_id, self.execution_lease_id)

    def to_meta(self) -> dict[str, Any]:
        meta = {name: getattr(self, name) for name in _SLICE_FIELDS}
        if self.lease_sequence is not None:
            meta[LEASE_SEQUENCE_FIELD] = self.lease_sequence
        return meta

    @classmethod
    def from_meta(cls, meta: Any, lease_sequence: bool = False) -> SequenceSlice:
        """`lease_sequence`: the channel negotiated the extension, so a slice may carry one."""
        if lease_sequence and type(meta) is dict and LEASE_SEQUENCE_FIELD in meta:
            f = Fields(meta, ErrorCode.BATCH_CONTRACT, "sequence", _SEQUENCED_SLICE_FIELDS)
            rest = dict(meta)
            sequence = f.uint(LEASE_SEQUENCE_FIELD)
            del rest[LEASE_SEQUENCE_FIELD]
            return cls.from_meta(rest)._replace(lease_sequence=sequence)
        if type(meta) is dict and meta.keys() == _SLICE_FIELDS:  # fast path: all valid
            m = meta
            if (_u64(m["request_sequence_no"]) and _u64(m["token_position_start"])
                    and _u64(m["kv_epoch"]) and _u64(m["deadline_budget_ns"])
                    and _u32(m["input_row_start"]) and _u32(m["input_row_count"])
                    and m["input_row_count"] > 0 and is_uuid(m["request_id"])
                    and is_uuid(m["execution_lease_id"]) and _id(m["trace_id"])
                    and _id(m["span_id"])):
                return cls(m["request_id"], m["request_sequence_no"], m["input_row_start"],
                           m["input_row_count"], m["token_position_start"], m["kv_epoch"],
                           m["deadline_budget_ns"], m["execution_lease_id"], m["trace_id"],
                           m["span_id"])
        return cls._strict(meta)

    @classmethod
    def _strict(cls, meta: Any) -> SequenceSlice:
        """Field by field, naming the first offending field."""
        f = Fields(meta, ErrorCode.BATCH_CONTRACT, "sequence", _SLICE_FIELDS)
        return cls(
            request_id=f.uuid("request_id"),
            request_sequence_no=f.uint("request_sequence_no"),
            input_row_start=f.uint("input_row_start", UINT32_MAX),
            input_row_count=f.uint("input_row_count", UINT32_MAX, minimum=1),
            token_position_start=f.uint("token_position_start"),
            kv_epoch=f.uint("kv_epoch"),
            deadline_budget_ns=f.uint("deadline_budget_ns"),
            execution_lease_id=f.uuid("execution_lease_id"),
            trace_id=f.text("trace_id", MAX_ID_CHARS),
            span_id=f.text("span_id", MAX_ID_CHARS),
        )


_BATCH_FIELDS = frozenset({"batch_id", "batch_sequence_no", "phase", "input_row_count", "sequences"})


@dataclass(frozen=True, slots=True)
class BatchDescriptor:
    batch_id: str
    batch_sequence_no: int
    phase: Phase
    input_row_count: int
    sequences: tuple[SequenceSlice, ...]

    def to_meta(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "batch_sequence_no": self.batch_sequence_no,
            "phase": self.phase.value,
            "input_row_count": self.input_row_count,
            "sequences": [item.to_meta() for item in self.sequences],
        }

    def digest(self) -> str:
        return canonical_sha256(self.to_meta(), may_hold_floats=False)

    @classmethod
    def from_meta(cls, meta: Any, lease_sequence: bool = False) -> BatchDescriptor:
        f = Fields(meta, ErrorCode.BATCH_CONTRACT, "batch", _BATCH_FIELDS)
        if not is_uuid(f.raw("batch_id")):
            raise f.fail("batch_id", "must be a lower-case canonical UUID")
        if f.raw("phase") not in ("prefill", "decode"):
            raise f.fail("phase", "must be prefill or decode")
        raw = f.array("sequences", MAX_SEQUENCES_PER_BATCH)
        return cls(
            batch_id=f.raw("batch_id"),
            batch_sequence_no=f.uint("batch_sequence_no"),
            phase=Phase(f.raw("phase")),
            input_row_count=f.uint("input_row_count", UINT32_MAX, minimum=1),
            sequences=tuple(SequenceSlice.from_meta(item, lease_sequence) for item in raw),
        )


@dataclass(frozen=True, slots=True)
class Batch:
    """A BATCH frame: plan binding, batch descriptor, input tensor (+ negotiated traceparent)."""

    KIND: ClassVar[int] = Kind.BATCH
    plan_id: str
    plan_hash: str
    manifest_hash: str
    source_stage: str
    destination_stage: str
    batch: BatchDescriptor
    tensor: Tensor
    traceparent: str | None = None
    # Receiver side only, never on the wire: CRC32C of each sequence's input bytes, when
    # the transport computed them on arrival.
    input_crcs: tuple[int, ...] | None = field(default=None, compare=False, repr=False)

    def to_meta(self) -> dict[str, Any]:
        meta = self._rest_meta()
        meta["batch"] = self.batch.to_meta()
        meta["batch_digest"] = self.batch.digest()
        return meta

    def _rest_meta(self) -> dict[str, Any]:
        meta = {
            "plan_id": self.plan_id,
            "plan_hash": self.plan_hash,
            "manifest_hash": self.manifest_hash,
            "source_stage": self.source_stage,
            "destination_stage": self.destination_stage,
            "tensor": self.tensor.descriptor.to_meta(),
        }
        if self.traceparent is not None:
            meta["traceparent"] = self.traceparent
        return meta

    def encode_metadata(self, sequence_no: int) -> bytes:
        """Canonical metadata with the batch JSON serialised once: "batch" sorts first, so
        the canonical object is `{"batch":` + batch JSON + `,"batch_digest":...` + rest."""
        batch_json = canonical_json(self.batch.to_meta(), may_hold_floats=False)
        rest = self._rest_meta()
        rest["batch_digest"] = "sha256:" + hashlib.sha256(batch_json).hexdigest()
        rest["sequence_no"] = sequence_no
        return b'{"batch":' + batch_json + b"," + canonical_json(rest, may_hold_floats=False)[1:]


class SequenceError:
    """Bounded per-sequence error text: (code, message)."""

    @staticmethod
    def to_meta(code: str, message: str) -> dict[str, str]:
        return {"code": code[:MAX_ERROR_CODE_CHARS], "message": message[:MAX_ERROR_MESSAGE_CHARS]}


class Timings(NamedTuple):
    queue_ns: int = 0
    execute_ns: int = 0
    pack_ns: int = 0
    unpack_ns: int = 0

    def to_meta(self) -> dict[str, int]:
        return {"queue": self.queue_ns, "execute": self.execute_ns,
                "pack": self.pack_ns, "unpack": self.unpack_ns}


_RESULT_ITEM_FIELDS = frozenset({
    "request_id", "execution_lease_id", "request_sequence_no", "status", "input_row_start",
    "input_row_count", "output_row_start", "output_row_count", "kv_epoch_before",
    "kv_epoch_after", "error", "timings_ns",
})
_TIMING_FIELDS = frozenset({"queue", "execute", "pack", "unpack"})
_ERROR_FIELDS = frozenset({"code", "message"})


class SequenceResult(NamedTuple):
    request_id: str
    execution_lease_id: str
    request_sequence_no: int
    status: SequenceStatus
    input_row_start: int
    input_row_count: int
    output_row_start: int | None
    output_row_count: int
    kv_epoch_before: int
    kv_epoch_after: int
    error_code: str | None
    error_message: str | None
    timings: Timings

    @property
    def identity(self) -> tuple[str, str]:
        return (self.request_id, self.execution_lease_id)

    def to_meta(self) -> dict[str, Any]:
        error = None
        if self.error_code is not None:
            error = SequenceError.to_meta(self.error_code, self.error_message or self.error_code)
        return {
            "request_id": self.request_id,
            "execution_lease_id": self.execution_lease_id,
            "request_sequence_no": self.request_sequence_no,
            "status": self.status.value,
            "input_row_start": self.input_row_start,
            "input_row_count": self.input_row_count,
            "output_row_start": self.output_row_start,
            "output_row_count": self.output_row_count,
            "kv_epoch_before": self.kv_epoch_before,
            "kv_epoch_after": self.kv_epoch_after,
            "error": error,
            "timings_ns": self.timings.to_meta(),
        }

    def remapped(self, input_row_start: int, output_row_start: int | None,
                 timings: Timings) -> SequenceResult:
        """This result placed in another batch's rows (exact replay after repacking)."""
        return SequenceResult(
            self.request_id, self.execution_lease_id, self.request_sequence_no, self.status,
            input_row_start, self.input_row_count, output_row_start, self.output_row_count,
            self.kv_epoch_before, self.kv_epoch_after, self.error_code, self.error_message, timings)

    @classmethod
    def from_meta(cls, meta: Any) -> SequenceResult:
        item = cls._fast(meta) if type(meta) is dict and meta.keys() == _RESULT_ITEM_FIELDS else None
        if item is None:
            item = cls._strict(meta)
        return item  # its rules with the others' (`columns.check_results`)

    @classmethod
    def _fast(cls, m: dict[str, Any]) -> SequenceResult | None:
        """All fields valid, or None (then `_strict` names the offending one)."""
        t, error = m["timings_ns"], m["error"]
        if type(t) is not dict or t.keys() != _TIMING_FIELDS or not all(map(_u64, t.values())):
            return None
        if error is not None and not (type(error) is dict and error.keys() == _ERROR_FIELDS
                                      and _id(error["code"], MAX_ERROR_CODE_CHARS)
                                      and _id(error["message"], MAX_ERROR_MESSAGE_CHARS)):
            return None
        start = m["output_row_start"]
        if not (member(SequenceStatus, m["status"]) is not None and is_uuid(m["request_id"])
                and is_uuid(m["execution_lease_id"]) and _u64(m["request_sequence_no"])
                and _u32(m["input_row_start"]) and _u32(m["input_row_count"])
                and m["input_row_count"] > 0 and (start is None or _u32(start))
                and _u32(m["output_row_count"]) and _u64(m["kv_epoch_before"])
                and _u64(m["kv_epoch_after"])):
            return None
        return cls(m["request_id"], m["execution_lease_id"], m["request_sequence_no"],
                   SequenceStatus(m["status"]), m["input_row_start"], m["input_row_count"], start,
                   m["output_row_count"], m["kv_epoch_before"], m["kv_epoch_after"],
                   None if error is None else error["code"],
                   None if error is None else error["message"],
                   Timings(t["queue"], t["execute"], t["pack"], t["unpack"]))

    @classmethod
    def _strict(cls, meta: Any) -> SequenceResult:
        f = Fields(meta, ErrorCode.BATCH_RESULT, "result", _RESULT_ITEM_FIELDS)
        if member(SequenceStatus, f.raw("status")) is None:
            raise f.fail("status", "is not a known status")
        code = message = None
        if f.raw("error") is not None:
            e = Fields(f.raw("error"), ErrorCode.BATCH_RESULT, "result.error", _ERROR_FIELDS)
            code, message = e.text("code", MAX_ERROR_CODE_CHARS), e.text("message")
        t = Fields(f.raw("timings_ns"), ErrorCode.BATCH_RESULT, "result.timings_ns", _TIMING_FIELDS)
        item = cls(
            request_id=f.uuid("request_id"),
            execution_lease_id=f.uuid("execution_lease_id"),
            request_sequence_no=f.uint("request_sequence_no"),
            status=SequenceStatus(f.raw("status")),
            input_row_start=f.uint("input_row_start", UINT32_MAX),
            input_row_count=f.uint("input_row_count", UINT32_MAX, minimum=1),
            output_row_start=(None if f.raw("output_row_start") is None
                              else f.uint("output_row_start", UINT32_MAX)),
            output_row_count=f.uint("output_row_count", UINT32_MAX),
            kv_epoch_before=f.uint("kv_epoch_before"),
            kv_epoch_after=f.uint("kv_epoch_after"),
            error_code=code,
            error_message=message,
            timings=Timings(t.uint("queue"), t.uint("execute"), t.uint("pack"), t.uint("unpack")),
        )
        return item


@dataclass(frozen=True, slots=True)
class Result:
    """A RESULT frame: one result per sequence, output rows of the ok ones, compacted."""

    KIND: ClassVar[int] = Kind.RESULT
    batch_id: str
    batch_sequence_no: int
    manifest_hash: str
    results: tuple[SequenceResult, ...]
    tensor: Tensor | None

    def to_meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "batch_id": self.batch_id,
            "batch_sequence_no": self.batch_sequence_no,
            "manifest_hash": self.manifest_hash,
            "results": [item.to_meta() for item in self.results],
        }
        if self.tensor is not None:
            meta["tensor"] = self.tensor.descriptor.to_meta()
        return meta

    def check(self) -> None:
        fail = lambda why: Fnx2Error(ErrorCode.BATCH_RESULT, why)  # noqa: E731
        if not self.results:
            raise fail("a result names at least one sequence")
        identities = [item.identity for item in self.results]
        if identities != sorted(identities) or len(set(identities)) != len(identities):
            raise fail("sequence results must be unique and in request identity order")
        cursor = 0
        for item in self.results:
            if item.status is SequenceStatus.OK:
                if item.output_row_start != cursor:
                    raise fail("ok output ranges must be compact and contiguous")
                cursor += item.output_row_count
        rows = 0 if self.tensor is None else self.tensor.descriptor.rows
        if rows != cursor:
            raise fail("output tensor rows must equal the ok sequences' output rows")

    def rows_for(self, item: SequenceResult) -> Any:
        """The output rows of one ok sequence (a numpy view)."""
        if self.tensor is None or item.output_row_start is None:
            return None
        return self.tensor.rows(item.output_row_start, item.output_row_count)

    def check_against(self, batch: Batch, compact_output: bool = False) -> None:
        """Exact, bijective correlation with the BATCH this RESULT answers.

        With the negotiated compact_output extension an ok sequence may return between one
        row and as many rows as it sent; otherwise exactly as many.
        """
        fail = lambda why: Fnx2Error(ErrorCode.BATCH_RESULT, why)  # noqa: E731
        if (self.batch_id, self.batch_sequence_no, self.manifest_hash) != (
            batch.batch.batch_id, batch.batch.batch_sequence_no, batch.manifest_hash
        ):
            raise fail("result does not correlate with its batch")
        sources = {s.identity: s for s in batch.batch.sequences}
        if len(sources) != len(self.results):
            raise fail("result sequence count differs from the batch")
        for item in self.results:
            source = sources.get(item.identity)
            if source is None or (item.request_sequence_no, item.input_row_start,
                                  item.input_row_count) != (
                source.request_sequence_no, source.input_row_start, source.input_row_count
            ):
                raise fail("result identity or input mapping differs from the batch")
            expected_after = source.kv_epoch + (1 if item.status is SequenceStatus.OK else 0)
            if item.kv_epoch_before != source.kv_epoch or item.kv_epoch_after != expected_after:
                raise fail("result KV epochs do not follow from the batch")
            if item.status is SequenceStatus.OK:
                rows_ok = (1 <= item.output_row_count <= source.input_row_count if compact_output
                           else item.output_row_count == source.input_row_count)
                if not rows_ok:
                    raise fail("ok output rows differ from input rows")
