"""Protobuf <-> domain conversions for the evidence registry. Protobuf stops here."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import TypeVar

from fornax.common.v1 import common_pb2
from fornax.evidence_registry.v1 import evidence_registry_pb2 as pb
from libs.common.proto import DTYPE_FROM_PB, DTYPE_TO_PB
from services.evidence_registry.domain import (
    BlobRef,
    EvidenceClass,
    Expectation,
    LayerRange,
    ListPage,
    ListQuery,
    Provenance,
    PutCommand,
    Record,
    RecordContent,
    RecordStatus,
    RecordType,
    Resolution,
    ResolutionReason,
    ResolveOutcome,
    RevokeCommand,
    ValidityWindow,
)
from services.evidence_registry.errors import InvalidField
from services.evidence_registry.validation import parse_sha256

RECORD_TYPES = {
    pb.RECORD_TYPE_MODEL: RecordType.MODEL,
    pb.RECORD_TYPE_CAPABILITY: RecordType.CAPABILITY,
    pb.RECORD_TYPE_MEASUREMENT: RecordType.MEASUREMENT,
    pb.RECORD_TYPE_CALIBRATION: RecordType.CALIBRATION,
    pb.RECORD_TYPE_ROUTE: RecordType.ROUTE,
    pb.RECORD_TYPE_QUALIFICATION: RecordType.QUALIFICATION,
}
STATUSES = {pb.RECORD_STATUS_ACTIVE: RecordStatus.ACTIVE, pb.RECORD_STATUS_REVOKED: RecordStatus.REVOKED}
CLASSES = {
    common_pb2.EVIDENCE_CLASS_CONTRACT: EvidenceClass.CONTRACT,
    common_pb2.EVIDENCE_CLASS_REFERENCE: EvidenceClass.REFERENCE,
    common_pb2.EVIDENCE_CLASS_PHYSICAL: EvidenceClass.PHYSICAL,
}


_Key = TypeVar("_Key")
_Value = TypeVar("_Value")


def _inverse(mapping: Mapping[_Key, _Value]) -> dict[_Value, _Key]:
    return {value: key for key, value in mapping.items()}


RECORD_TYPES_PB = _inverse(RECORD_TYPES)
STATUSES_PB = _inverse(STATUSES)
CLASSES_PB = _inverse(CLASSES)


def enum_value(field: str, number: int, mapping: dict, *, required: bool):
    """The domain value of a wire enum; None for UNSPECIFIED when not required."""
    if number == 0:
        if required:
            raise InvalidField(field, "UNSPECIFIED_ENUM", "must be set (UNSPECIFIED is rejected)")
        return None
    if number not in mapping:
        raise InvalidField(field, "UNKNOWN_ENUM", f"{number} is not a known value")
    return mapping[number]


def _provenance_from_proto(message: pb.Provenance) -> Provenance:
    layers = None
    if message.HasField("layer_range"):
        layers = LayerRange(message.layer_range.layer_start, message.layer_range.layer_end_exclusive)
    return Provenance(
        hardware=message.hardware, backend_build=message.backend_build,
        model_snapshot=message.model_snapshot, command=message.command, layer_range=layers,
        dtype=enum_value("record.provenance.dtype", message.dtype, DTYPE_FROM_PB, required=False),
        shapes=message.shapes, measured_by=message.measured_by,
        signer_certificate_pem=message.signer_certificate_pem, signature=message.signature,
    )


def content_from_proto(message: pb.Record) -> RecordContent:
    return RecordContent(
        type=enum_value("record.type", message.type, RECORD_TYPES, required=True),
        evidence_class=enum_value("record.evidence_class", message.evidence_class, CLASSES, required=True),
        validity=ValidityWindow(message.valid_from_unix_ns, message.valid_until_unix_ns),
        provenance=_provenance_from_proto(message.provenance),
        labels=tuple(sorted(message.labels.items())),
        subject=message.subject,
    )


def put_command_from_proto(request: pb.PutRecordRequest) -> PutCommand:
    if not request.HasField("record"):
        raise InvalidField("record", "MISSING_FIELD", "the record metadata is required")
    message = request.record
    if message.status not in (pb.RECORD_STATUS_UNSPECIFIED, pb.RECORD_STATUS_ACTIVE):
        raise InvalidField("record.status", "STATUS_NOT_SETTABLE", "a new record is always active")
    if message.revocation_reason or message.created_unix_ns:
        field = "record.revocation_reason" if message.revocation_reason else "record.created_unix_ns"
        raise InvalidField(field, "OUTPUT_ONLY", "set by the registry, not the caller")
    return PutCommand(
        content=content_from_proto(message), blob=request.blob, record_id=message.record_id,
        request_id=request.request_id,
        stated_sha256_hex=parse_sha256("record.blob_sha256", message.blob_sha256, required=False),
        stated_size_bytes=message.blob_size_bytes,
    )


def provenance_to_proto(provenance: Provenance) -> pb.Provenance:
    message = pb.Provenance(
        hardware=provenance.hardware, backend_build=provenance.backend_build,
        model_snapshot=provenance.model_snapshot, command=provenance.command, shapes=provenance.shapes,
        measured_by=provenance.measured_by, signer_certificate_pem=provenance.signer_certificate_pem,
        signature=provenance.signature,
    )
    if provenance.layer_range is not None:
        message.layer_range.layer_start = provenance.layer_range.layer_start
        message.layer_range.layer_end_exclusive = provenance.layer_range.layer_end
    if provenance.dtype is not None:
        message.dtype = DTYPE_TO_PB[provenance.dtype]
    return message


def content_to_proto(content: RecordContent, message: pb.Record | None = None) -> pb.Record:
    message = pb.Record() if message is None else message
    message.type = RECORD_TYPES_PB[content.type]
    message.evidence_class = CLASSES_PB[content.evidence_class]
    message.valid_from_unix_ns = content.validity.valid_from_unix_ns
    message.valid_until_unix_ns = content.validity.valid_until_unix_ns
    message.provenance.CopyFrom(provenance_to_proto(content.provenance))
    message.labels.update(dict(content.labels))
    message.subject = content.subject
    return message


def record_to_proto(record: Record) -> pb.Record:
    message = pb.Record(
        record_id=record.record_id, status=STATUSES_PB[record.status], blob_sha256=record.blob.digest,
        blob_size_bytes=record.blob.size_bytes, created_unix_ns=record.created_unix_ns,
        revocation_reason=record.revocation_reason,
    )
    return content_to_proto(record.content, message)


def record_from_proto(message: pb.Record) -> Record:
    """For clients reading a registry answer (the server never trusts these fields)."""
    return Record(
        record_id=message.record_id, content=content_from_proto(message),
        blob=BlobRef(parse_sha256("record.blob_sha256", message.blob_sha256, required=True),
                     message.blob_size_bytes),
        status=enum_value("record.status", message.status, STATUSES, required=True),
        created_unix_ns=message.created_unix_ns, revocation_reason=message.revocation_reason,
    )


def encode_page_token(after_seq: int) -> str:
    return "" if not after_seq else base64.urlsafe_b64encode(f"v1:{after_seq}".encode()).decode()


def decode_page_token(token: str) -> int:
    if not token:
        return 0
    try:
        version, _, seq = base64.urlsafe_b64decode(token.encode()).decode().partition(":")
        if version == "v1" and seq.isdigit() and int(seq) > 0:
            return int(seq)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        pass
    raise InvalidField("page_token", "INVALID_PAGE_TOKEN", "not a token this registry issued")


def list_query_from_proto(request: pb.ListRecordsRequest) -> ListQuery:
    return ListQuery(
        type=enum_value("type", request.type, RECORD_TYPES, required=False),
        evidence_class=enum_value("evidence_class", request.evidence_class, CLASSES, required=False),
        status=enum_value("status", request.status, STATUSES, required=False),
        page_size=request.page_size, after_seq=decode_page_token(request.page_token),
    )


def list_page_to_proto(page: ListPage) -> pb.ListRecordsResponse:
    return pb.ListRecordsResponse(records=[record_to_proto(r) for r in page.records],
                                  next_page_token=encode_page_token(page.next_after_seq))


def revoke_command_from_proto(request: pb.RevokeRecordRequest) -> RevokeCommand:
    return RevokeCommand(record_id=request.record_id, reason=request.reason, request_id=request.request_id)


def expectations_from_proto(request: pb.ResolveRecordsRequest) -> tuple[Expectation, ...]:
    return tuple(
        Expectation(
            record_id=item.record_id,
            expected_type=enum_value(f"expectations[{index}].expected_type", item.expected_type,
                                     RECORD_TYPES, required=True),
            expected_sha256_hex=parse_sha256(f"expectations[{index}].expected_blob_sha256",
                                             item.expected_blob_sha256, required=False),
        )
        for index, item in enumerate(request.expectations)
    )


def resolve_instant(request: pb.ResolveRecordsRequest, now_unix_ns: int) -> int:
    if request.at_unix_ns < 0:
        raise InvalidField("at_unix_ns", "INVALID_INSTANT", f"{request.at_unix_ns} is negative")
    return request.at_unix_ns or now_unix_ns


def resolution_to_proto(resolution: Resolution) -> pb.Resolution:
    message = pb.Resolution(record_id=resolution.record_id, ok=resolution.ok, detail=resolution.detail,
                            reason="" if resolution.reason is None else resolution.reason.value)
    if resolution.record is not None:
        message.record.CopyFrom(record_to_proto(resolution.record))
    return message


def resolve_outcome_to_proto(outcome: ResolveOutcome) -> pb.ResolveRecordsResponse:
    return pb.ResolveRecordsResponse(all_ok=outcome.all_ok,
                                     resolutions=[resolution_to_proto(r) for r in outcome.resolutions])


# Client side: what a caller sends and how it reads the answers back.

def expectations_to_proto(expectations, at_unix_ns: int = 0) -> pb.ResolveRecordsRequest:
    return pb.ResolveRecordsRequest(at_unix_ns=at_unix_ns, expectations=[
        pb.RecordExpectation(
            record_id=item.record_id, expected_type=RECORD_TYPES_PB[item.expected_type],
            expected_blob_sha256=f"sha256:{item.expected_sha256_hex}" if item.expected_sha256_hex else "",
        )
        for item in expectations
    ])


def _reason_from_wire(index: int, value: str) -> ResolutionReason | None:
    if not value:
        return None
    try:
        return ResolutionReason(value)
    except ValueError:
        raise InvalidField(f"resolutions[{index}].reason", "UNKNOWN_REASON",
                           f"{value!r} is not a known reason") from None


def resolve_outcome_from_proto(message: pb.ResolveRecordsResponse) -> ResolveOutcome:
    resolutions = []
    for index, item in enumerate(message.resolutions):
        reason = _reason_from_wire(index, item.reason)
        if (reason is None) != item.ok:
            raise InvalidField(f"resolutions[{index}].ok", "INCONSISTENT_RESOLUTION",
                               f"ok={item.ok} contradicts reason {item.reason!r}")
        record = record_from_proto(item.record) if item.HasField("record") else None
        resolutions.append(Resolution(item.record_id, reason, item.detail, record))
    return ResolveOutcome(tuple(resolutions))


def list_page_from_proto(message: pb.ListRecordsResponse) -> tuple[tuple[Record, ...], str]:
    return tuple(record_from_proto(r) for r in message.records), message.next_page_token
