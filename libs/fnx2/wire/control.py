"""Typed CREDIT, CANCEL, RELEASE, ACK, ERROR and CONTROL messages of FNX2 2.0.

Beyond 2.0 there is one negotiated addition: CONTROL `extensions` (offer) and its ACK.
A sender offers only after the plain 2.0 handshake; a plain 2.0 receiver answers the
offer with a recoverable METADATA ERROR, which the sender reads as "no extensions".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from libs.fnx2.wire.admission import (
    ACK_ADMIT_FIELDS,
    EXT_INBAND_ADMISSION,
    MAX_TOKENS,
    STAGE_KV_EPOCHS_FIELD,
    AckAdmit,
    Admission,
    read_stage_kv_epochs,
    read_uints,
    require,
)
from libs.fnx2.wire.errors import MAX_ERROR_CODE_CHARS, ErrorCode
from libs.fnx2.wire.fields import Fields, is_uuid
from libs.fnx2.wire.messages import MAX_ID_CHARS, Kind

ABI_VERSION = (2, 0)
MAX_EXTENSIONS = 16

EXT_MULTI_INFLIGHT = "multi_inflight"
EXT_TRACEPARENT = "traceparent"
EXT_TIMINGS = "timings"
# An ok sequence may answer with fewer output rows than input rows (a final stage returning
# one sampled token per sequence instead of one row per input token).
EXT_COMPACT_OUTPUT = "compact_output"
# A final stage in sampled-token mode may answer an ok sequence with one fp32 LOGITS-kind
# "sample record" row (token id, its logprob, top (id, logprob) pairs; libs.model.logprobs)
# instead of one int32 token id. Stages in between relay the rows unchanged.
EXT_SAMPLE_LOGPROBS = "sample_logprobs"
# Each sequence slice carries `lease_sequence`: its lease's place in the plan generation's
# opening order, assigned by the gateway. The receiver fences ended leases with a watermark
# (memory in proportion to live leases) instead of a tombstone per lease. Its ACK of the
# offer names `lease_sequence_next`, the lowest number above every one it has seen in this
# generation, so a sender that starts numbering there is never fenced by an earlier sender.
EXT_LEASE_SEQUENCE = "lease_sequence"
LEASE_SEQUENCE_NEXT_FIELD = "lease_sequence_next"
# BATCH and RESULT metadata may be the fixed-layout binary form of libs.fnx2.wire.compact
# instead of canonical JSON.
EXT_COMPACT_META = "compact_meta"
# CONTROL `admit` opens a lease on every stage down the chain, and ACK cancel/release name
# every stage's KV epoch (libs.fnx2.wire.admission).
KNOWN_EXTENSIONS = frozenset({EXT_MULTI_INFLIGHT, EXT_TRACEPARENT, EXT_TIMINGS, EXT_COMPACT_OUTPUT,
                              EXT_SAMPLE_LOGPROBS, EXT_COMPACT_META, EXT_LEASE_SEQUENCE,
                              EXT_INBAND_ADMISSION})

CREDIT_FIELDS = ("frames", "payload_bytes", "rows", "sequences",
                 "live_requests", "kv_bytes", "replay_bytes")
_BINDING_FIELDS = frozenset({"plan_id", "plan_hash", "manifest_hash", "stage_id",
                             "plan_generation_id"})


@dataclass(frozen=True, slots=True)
class ChannelBinding:
    """What a channel is bound to: plan, manifest, destination stage and plan generation."""

    plan_id: str
    plan_hash: str
    manifest_hash: str
    stage_id: str
    plan_generation_id: str

    def to_meta(self) -> dict[str, Any]:
        return {"plan_id": self.plan_id, "plan_hash": self.plan_hash,
                "manifest_hash": self.manifest_hash, "stage_id": self.stage_id,
                "plan_generation_id": self.plan_generation_id}

    @classmethod
    def read(cls, f: Fields) -> ChannelBinding:
        return cls(f.uuid("plan_id"), f.hash("plan_hash"), f.hash("manifest_hash"),
                   f.text("stage_id", MAX_ID_CHARS), f.uuid("plan_generation_id"))


@dataclass(frozen=True, slots=True)
class Credit:
    KIND: ClassVar[int] = Kind.CREDIT
    frames: int
    payload_bytes: int
    rows: int
    sequences: int
    live_requests: int
    kv_bytes: int
    replay_bytes: int
    # multi_inflight only: BATCH frames this receiver has read on the channel, so the
    # sender knows which of its frames in flight the vector already accounts for.
    batches_received: int | None = None

    def to_meta(self) -> dict[str, Any]:
        meta = {name: getattr(self, name) for name in CREDIT_FIELDS}
        if self.batches_received is not None:
            meta["batches_received"] = self.batches_received
        return meta

    @classmethod
    def from_meta(cls, meta: dict[str, Any], allow_extensions: bool = True) -> Credit:
        extended = allow_extensions and "batches_received" in meta
        names = frozenset(CREDIT_FIELDS) | ({"batches_received"} if extended else frozenset())
        f = Fields(meta, ErrorCode.METADATA, "CREDIT", names)
        received = f.uint("batches_received") if extended else None
        return cls(**{name: f.uint(name) for name in CREDIT_FIELDS}, batches_received=received)


_LEASE_FIELDS = _BINDING_FIELDS | {"control_id", "request_id", "execution_lease_id"}


@dataclass(frozen=True, slots=True)
class Cancel:
    KIND: ClassVar[int] = Kind.CANCEL
    control_id: str
    binding: ChannelBinding
    request_id: str
    execution_lease_id: str

    def to_meta(self) -> dict[str, Any]:
        return {"control_id": self.control_id, **self.binding.to_meta(),
                "request_id": self.request_id, "execution_lease_id": self.execution_lease_id}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> Cancel:
        f = Fields(meta, ErrorCode.METADATA, "CANCEL", _LEASE_FIELDS)
        return cls(f.uuid("control_id"), ChannelBinding.read(f), f.uuid("request_id"),
                   f.uuid("execution_lease_id"))


@dataclass(frozen=True, slots=True)
class Release:
    KIND: ClassVar[int] = Kind.RELEASE
    control_id: str
    binding: ChannelBinding
    request_id: str
    execution_lease_id: str
    expected_final_epoch: int | None
    # inband_admission only: every token the lease holds KV for, sent when the request ended
    # cleanly; each stage publishes the lease's full blocks under its admission's prefix salt
    # before releasing them. Empty (and then absent from the metadata): publish nothing more.
    publish_token_ids: tuple[int, ...] = ()

    def to_meta(self) -> dict[str, Any]:
        meta = {"control_id": self.control_id, **self.binding.to_meta(),
                "request_id": self.request_id, "execution_lease_id": self.execution_lease_id,
                "expected_final_epoch": self.expected_final_epoch}
        if self.publish_token_ids:
            meta["publish_token_ids"] = list(self.publish_token_ids)
        return meta

    @classmethod
    def from_meta(cls, meta: dict[str, Any], inband: bool = False) -> Release:
        publishes = inband and "publish_token_ids" in meta
        names = _LEASE_FIELDS | {"expected_final_epoch"} | ({"publish_token_ids"} if publishes else set())
        f = Fields(meta, ErrorCode.METADATA, "RELEASE", names)
        tokens = read_uints(f, "publish_token_ids", MAX_TOKENS) if publishes else ()
        if publishes and not tokens:
            raise f.fail("publish_token_ids", "must be absent rather than empty")
        return cls(f.uuid("control_id"), ChannelBinding.read(f), f.uuid("request_id"),
                   f.uuid("execution_lease_id"), f.optional_uint("expected_final_epoch"), tokens)


@dataclass(frozen=True, slots=True)
class Control:
    """CONTROL hello / shutdown / credit_refresh, the negotiated `extensions` offer and, with
    `inband_admission`, `admit`."""

    KIND: ClassVar[int] = Kind.CONTROL
    control: str
    control_id: str
    binding: ChannelBinding
    supported_versions: tuple[tuple[int, int], ...] = ()
    extensions: tuple[str, ...] = ()
    admission: Admission | None = None

    def to_meta(self) -> dict[str, Any]:
        meta = {"control": self.control, "control_id": self.control_id, **self.binding.to_meta()}
        if self.control == "hello":
            meta["supported_versions"] = [list(v) for v in self.supported_versions]
        elif self.control == "extensions":
            meta["extensions"] = list(self.extensions)
        elif self.control == "admit":
            if self.admission is None:
                raise ValueError("CONTROL admit carries an admission")
            meta["admission"] = self.admission.to_meta()
        return meta

    @classmethod
    def from_meta(cls, meta: dict[str, Any], allow_extensions: bool,
                  negotiated: frozenset[str] = frozenset()) -> Control:
        operation = meta.get("control")
        names = _BINDING_FIELDS | {"control", "control_id"}
        if operation == "hello":
            names = names | {"supported_versions"}
        elif operation == "extensions" and allow_extensions:
            names = names | {"extensions"}
        elif operation == "admit":
            require(EXT_INBAND_ADMISSION in negotiated, "CONTROL admit")
            names = names | {"admission"}
        elif operation not in ("shutdown", "credit_refresh"):
            raise Fields({}, ErrorCode.METADATA, "CONTROL", frozenset()).fail(
                "control", "is not a supported operation")
        f = Fields(meta, ErrorCode.METADATA, "CONTROL", names)
        versions = _read_supported_versions(f) if operation == "hello" else ()
        extensions = _read_extensions(f) if operation == "extensions" else ()
        admission = Admission.from_meta(f.raw("admission")) if operation == "admit" else None
        return cls(operation, f.uuid("control_id"), ChannelBinding.read(f), versions, extensions,
                   admission)


def _is_version(value: Any) -> bool:
    """A [major, minor] pair of JSON integers: 2.0 or true would compare equal to 2 or 1
    in Python but re-encode to other bytes."""
    return type(value) is list and len(value) == 2 and all(
        type(part) is int and 0 <= part <= 0xFFFF for part in value)


def _read_supported_versions(f: Fields) -> tuple[tuple[int, int], ...]:
    """FNX2 2.0 advertises exactly [[2,0]]: no other version, no duplicate. A later version
    would be negotiated beside it, which 2.0 has no rule for."""
    raw = f.array("supported_versions", 8)
    if not all(_is_version(v) for v in raw):
        raise f.fail("supported_versions", "must be [major, minor] integer pairs")
    if raw != [list(ABI_VERSION)]:
        raise f.fail("supported_versions", "must be exactly [[2,0]]")
    return (ABI_VERSION,)


def _read_extensions(f: Fields) -> tuple[str, ...]:
    raw = f.array("extensions", MAX_EXTENSIONS)
    if any(type(x) is not str or not 0 < len(x) <= 64 for x in raw) or len(set(raw)) != len(raw):
        raise f.fail("extensions", "must be distinct short strings")
    return tuple(raw)


_ACK_FIELDS: dict[str, frozenset[str]] = {
    "hello": _BINDING_FIELDS | {"selected_version"},
    "cancel": frozenset({"request_id", "execution_lease_id", "cancelled", "inflight",
                         "kv_mutated"}),
    "release": frozenset({"request_id", "execution_lease_id", "released", "kv_epoch",
                          "completed_results_released", "tombstone_present"}),
    "shutdown": frozenset({"stage_id"}),
    "credit_refresh": frozenset({"stage_id"}),
    "extensions": frozenset({"stage_id", "extensions"}),
    "admit": ACK_ADMIT_FIELDS,
}


@dataclass(frozen=True, slots=True)
class Ack:
    """ACK of one operation; `fields` holds that operation's closed, typed fields."""

    KIND: ClassVar[int] = Kind.ACK
    operation: str
    control_id: str
    fields: AckFields

    def to_meta(self) -> dict[str, Any]:
        return {"operation": self.operation, "control_id": self.control_id,
                **self.fields.to_meta()}

    @classmethod
    def from_meta(cls, meta: dict[str, Any], allow_extensions: bool,
                  negotiated: frozenset[str] = frozenset()) -> Ack:
        operation = meta.get("operation")
        if type(operation) is not str or operation not in _ACK_FIELDS or (
                operation == "extensions" and not allow_extensions):
            raise Fields({}, ErrorCode.METADATA, "ACK", frozenset()).fail(
                "operation", "is not a supported operation")
        inband = EXT_INBAND_ADMISSION in negotiated
        if operation == "admit":
            require(inband, "ACK admit")
        names = _ACK_FIELDS[operation] | {"operation", "control_id"}
        if operation == "extensions" and _accepts_lease_sequence(meta.get("extensions")):
            names = names | {LEASE_SEQUENCE_NEXT_FIELD}  # part of that extension, only with it
        if operation in ("cancel", "release") and inband and STAGE_KV_EPOCHS_FIELD in meta:
            names = names | {STAGE_KV_EPOCHS_FIELD}  # part of inband_admission, only with it
        f = Fields(meta, ErrorCode.METADATA, "ACK", names)
        return cls(operation, f.uuid("control_id"), _ACK_READERS[operation](f))


@dataclass(frozen=True, slots=True)
class AckHello:
    binding: ChannelBinding
    selected_version: tuple[int, int] = ABI_VERSION

    def to_meta(self) -> dict[str, Any]:
        return {**self.binding.to_meta(), "selected_version": list(self.selected_version)}


@dataclass(frozen=True, slots=True)
class AckCancel:
    request_id: str
    execution_lease_id: str
    cancelled: bool
    inflight: bool
    kv_mutated: bool
    # inband_admission only: each stage's KV epoch, this stage first.
    stage_kv_epochs: tuple[int, ...] | None = None

    def to_meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "request_id": self.request_id, "execution_lease_id": self.execution_lease_id,
            "cancelled": self.cancelled, "inflight": self.inflight, "kv_mutated": self.kv_mutated}
        if self.stage_kv_epochs is not None:
            meta[STAGE_KV_EPOCHS_FIELD] = list(self.stage_kv_epochs)
        return meta


@dataclass(frozen=True, slots=True)
class AckRelease:
    request_id: str
    execution_lease_id: str
    released: bool
    kv_epoch: int | None
    completed_results_released: int
    tombstone_present: bool
    # inband_admission only: each stage's KV epoch, this stage first.
    stage_kv_epochs: tuple[int, ...] | None = None

    def to_meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "request_id": self.request_id, "execution_lease_id": self.execution_lease_id,
            "released": self.released, "kv_epoch": self.kv_epoch,
            "completed_results_released": self.completed_results_released,
            "tombstone_present": self.tombstone_present}
        if self.stage_kv_epochs is not None:
            meta[STAGE_KV_EPOCHS_FIELD] = list(self.stage_kv_epochs)
        return meta


def _accepts_lease_sequence(extensions: Any) -> bool:
    return type(extensions) is list and EXT_LEASE_SEQUENCE in extensions


@dataclass(frozen=True, slots=True)
class AckStage:
    """ACK of shutdown, credit_refresh or extensions (the accepted extension list, and with
    `lease_sequence` accepted, the receiver's next unseen lease number)."""

    stage_id: str
    extensions: tuple[str, ...] | None = None
    lease_sequence_next: int | None = None

    def to_meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"stage_id": self.stage_id}
        if self.extensions is not None:
            meta["extensions"] = list(self.extensions)
            if EXT_LEASE_SEQUENCE in self.extensions:
                if self.lease_sequence_next is None:
                    raise ValueError("an ACK accepting lease_sequence names lease_sequence_next")
                meta[LEASE_SEQUENCE_NEXT_FIELD] = self.lease_sequence_next
        return meta


AckFields = AckHello | AckCancel | AckRelease | AckStage | AckAdmit


def _read_hello(f: Fields) -> AckHello:
    selected = f.raw("selected_version")
    if not _is_version(selected) or selected != list(ABI_VERSION):
        raise f.fail("selected_version", "must be [2,0]")
    return AckHello(ChannelBinding.read(f))


_ACK_READERS: dict[str, Callable[[Fields], AckFields]] = {
    "hello": _read_hello,
    "cancel": lambda f: AckCancel(f.uuid("request_id"), f.uuid("execution_lease_id"),
                                  f.boolean("cancelled"), f.boolean("inflight"),
                                  f.boolean("kv_mutated"), _stage_epochs(f)),
    "release": lambda f: AckRelease(f.uuid("request_id"), f.uuid("execution_lease_id"),
                                    f.boolean("released"), f.optional_uint("kv_epoch"),
                                    f.uint("completed_results_released"),
                                    f.boolean("tombstone_present"), _stage_epochs(f)),
    "admit": AckAdmit.read,
    "shutdown": lambda f: AckStage(f.text("stage_id", MAX_ID_CHARS)),
    "credit_refresh": lambda f: AckStage(f.text("stage_id", MAX_ID_CHARS)),
    "extensions": lambda f: _read_extensions_ack(f),
}


def _stage_epochs(f: Fields) -> tuple[int, ...] | None:
    return read_stage_kv_epochs(f) if f.has(STAGE_KV_EPOCHS_FIELD) else None


def _read_extensions_ack(f: Fields) -> AckStage:
    accepted = _read_extensions(f)
    next_number = f.uint(LEASE_SEQUENCE_NEXT_FIELD) if EXT_LEASE_SEQUENCE in accepted else None
    return AckStage(f.text("stage_id", MAX_ID_CHARS), accepted, next_number)


@dataclass(frozen=True, slots=True)
class ErrorMessage:
    """An ERROR frame. `control_id` names the control or batch it answers, when known."""

    KIND: ClassVar[int] = Kind.ERROR
    code: str
    message: str
    control_id: str | None

    def to_meta(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "control_id": self.control_id}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> ErrorMessage:
        f = Fields(meta, ErrorCode.METADATA, "ERROR", frozenset({"code", "message", "control_id"}))
        control_id = f.raw("control_id")
        if control_id is not None and not is_uuid(control_id):
            raise f.fail("control_id", "must be a UUID or null")
        return cls(f.text("code", MAX_ERROR_CODE_CHARS), f.text("message"), control_id)
