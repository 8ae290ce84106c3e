from fornax.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RecordType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RECORD_TYPE_UNSPECIFIED: _ClassVar[RecordType]
    RECORD_TYPE_MODEL: _ClassVar[RecordType]
    RECORD_TYPE_CAPABILITY: _ClassVar[RecordType]
    RECORD_TYPE_MEASUREMENT: _ClassVar[RecordType]
    RECORD_TYPE_CALIBRATION: _ClassVar[RecordType]
    RECORD_TYPE_ROUTE: _ClassVar[RecordType]
    RECORD_TYPE_QUALIFICATION: _ClassVar[RecordType]

class RecordStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RECORD_STATUS_UNSPECIFIED: _ClassVar[RecordStatus]
    RECORD_STATUS_ACTIVE: _ClassVar[RecordStatus]
    RECORD_STATUS_REVOKED: _ClassVar[RecordStatus]
RECORD_TYPE_UNSPECIFIED: RecordType
RECORD_TYPE_MODEL: RecordType
RECORD_TYPE_CAPABILITY: RecordType
RECORD_TYPE_MEASUREMENT: RecordType
RECORD_TYPE_CALIBRATION: RecordType
RECORD_TYPE_ROUTE: RecordType
RECORD_TYPE_QUALIFICATION: RecordType
RECORD_STATUS_UNSPECIFIED: RecordStatus
RECORD_STATUS_ACTIVE: RecordStatus
RECORD_STATUS_REVOKED: RecordStatus

class Provenance(_message.Message):
    __slots__ = ("hardware", "backend_build", "model_snapshot", "command", "layer_range", "dtype", "shapes", "measured_by", "signer_certificate_pem", "signature")
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_BUILD_FIELD_NUMBER: _ClassVar[int]
    MODEL_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    LAYER_RANGE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPES_FIELD_NUMBER: _ClassVar[int]
    MEASURED_BY_FIELD_NUMBER: _ClassVar[int]
    SIGNER_CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    hardware: str
    backend_build: str
    model_snapshot: str
    command: str
    layer_range: _common_pb2.LayerRange
    dtype: _common_pb2.ElementType
    shapes: str
    measured_by: str
    signer_certificate_pem: str
    signature: bytes
    def __init__(self, hardware: _Optional[str] = ..., backend_build: _Optional[str] = ..., model_snapshot: _Optional[str] = ..., command: _Optional[str] = ..., layer_range: _Optional[_Union[_common_pb2.LayerRange, _Mapping]] = ..., dtype: _Optional[_Union[_common_pb2.ElementType, str]] = ..., shapes: _Optional[str] = ..., measured_by: _Optional[str] = ..., signer_certificate_pem: _Optional[str] = ..., signature: _Optional[bytes] = ...) -> None: ...

class Record(_message.Message):
    __slots__ = ("record_id", "type", "status", "evidence_class", "blob_sha256", "blob_size_bytes", "valid_from_unix_ns", "valid_until_unix_ns", "created_unix_ns", "provenance", "labels", "revocation_reason", "subject")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RECORD_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_CLASS_FIELD_NUMBER: _ClassVar[int]
    BLOB_SHA256_FIELD_NUMBER: _ClassVar[int]
    BLOB_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    VALID_FROM_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    VALID_UNTIL_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    PROVENANCE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    REVOCATION_REASON_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    record_id: str
    type: RecordType
    status: RecordStatus
    evidence_class: _common_pb2.EvidenceClass
    blob_sha256: str
    blob_size_bytes: int
    valid_from_unix_ns: int
    valid_until_unix_ns: int
    created_unix_ns: int
    provenance: Provenance
    labels: _containers.ScalarMap[str, str]
    revocation_reason: str
    subject: str
    def __init__(self, record_id: _Optional[str] = ..., type: _Optional[_Union[RecordType, str]] = ..., status: _Optional[_Union[RecordStatus, str]] = ..., evidence_class: _Optional[_Union[_common_pb2.EvidenceClass, str]] = ..., blob_sha256: _Optional[str] = ..., blob_size_bytes: _Optional[int] = ..., valid_from_unix_ns: _Optional[int] = ..., valid_until_unix_ns: _Optional[int] = ..., created_unix_ns: _Optional[int] = ..., provenance: _Optional[_Union[Provenance, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., revocation_reason: _Optional[str] = ..., subject: _Optional[str] = ...) -> None: ...

class PutRecordRequest(_message.Message):
    __slots__ = ("request_id", "record", "blob")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    BLOB_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    record: Record
    blob: bytes
    def __init__(self, request_id: _Optional[str] = ..., record: _Optional[_Union[Record, _Mapping]] = ..., blob: _Optional[bytes] = ...) -> None: ...

class PutRecordResponse(_message.Message):
    __slots__ = ("record",)
    RECORD_FIELD_NUMBER: _ClassVar[int]
    record: Record
    def __init__(self, record: _Optional[_Union[Record, _Mapping]] = ...) -> None: ...

class GetRecordRequest(_message.Message):
    __slots__ = ("record_id", "include_blob")
    RECORD_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_BLOB_FIELD_NUMBER: _ClassVar[int]
    record_id: str
    include_blob: bool
    def __init__(self, record_id: _Optional[str] = ..., include_blob: _Optional[bool] = ...) -> None: ...

class GetRecordResponse(_message.Message):
    __slots__ = ("record", "blob")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    BLOB_FIELD_NUMBER: _ClassVar[int]
    record: Record
    blob: bytes
    def __init__(self, record: _Optional[_Union[Record, _Mapping]] = ..., blob: _Optional[bytes] = ...) -> None: ...

class ListRecordsRequest(_message.Message):
    __slots__ = ("type", "evidence_class", "status", "page_size", "page_token")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_CLASS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    type: RecordType
    evidence_class: _common_pb2.EvidenceClass
    status: RecordStatus
    page_size: int
    page_token: str
    def __init__(self, type: _Optional[_Union[RecordType, str]] = ..., evidence_class: _Optional[_Union[_common_pb2.EvidenceClass, str]] = ..., status: _Optional[_Union[RecordStatus, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRecordsResponse(_message.Message):
    __slots__ = ("records", "next_page_token")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[Record]
    next_page_token: str
    def __init__(self, records: _Optional[_Iterable[_Union[Record, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RevokeRecordRequest(_message.Message):
    __slots__ = ("request_id", "record_id", "reason")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RECORD_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    record_id: str
    reason: str
    def __init__(self, request_id: _Optional[str] = ..., record_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RevokeRecordResponse(_message.Message):
    __slots__ = ("record",)
    RECORD_FIELD_NUMBER: _ClassVar[int]
    record: Record
    def __init__(self, record: _Optional[_Union[Record, _Mapping]] = ...) -> None: ...

class RecordExpectation(_message.Message):
    __slots__ = ("record_id", "expected_type", "expected_blob_sha256")
    RECORD_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_TYPE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_BLOB_SHA256_FIELD_NUMBER: _ClassVar[int]
    record_id: str
    expected_type: RecordType
    expected_blob_sha256: str
    def __init__(self, record_id: _Optional[str] = ..., expected_type: _Optional[_Union[RecordType, str]] = ..., expected_blob_sha256: _Optional[str] = ...) -> None: ...

class ResolveRecordsRequest(_message.Message):
    __slots__ = ("expectations", "at_unix_ns")
    EXPECTATIONS_FIELD_NUMBER: _ClassVar[int]
    AT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    expectations: _containers.RepeatedCompositeFieldContainer[RecordExpectation]
    at_unix_ns: int
    def __init__(self, expectations: _Optional[_Iterable[_Union[RecordExpectation, _Mapping]]] = ..., at_unix_ns: _Optional[int] = ...) -> None: ...

class Resolution(_message.Message):
    __slots__ = ("record_id", "ok", "reason", "detail", "record")
    RECORD_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    record_id: str
    ok: bool
    reason: str
    detail: str
    record: Record
    def __init__(self, record_id: _Optional[str] = ..., ok: _Optional[bool] = ..., reason: _Optional[str] = ..., detail: _Optional[str] = ..., record: _Optional[_Union[Record, _Mapping]] = ...) -> None: ...

class ResolveRecordsResponse(_message.Message):
    __slots__ = ("all_ok", "resolutions")
    ALL_OK_FIELD_NUMBER: _ClassVar[int]
    RESOLUTIONS_FIELD_NUMBER: _ClassVar[int]
    all_ok: bool
    resolutions: _containers.RepeatedCompositeFieldContainer[Resolution]
    def __init__(self, all_ok: _Optional[bool] = ..., resolutions: _Optional[_Iterable[_Union[Resolution, _Mapping]]] = ...) -> None: ...
