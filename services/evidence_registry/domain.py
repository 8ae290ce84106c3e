"""Typed domain values of the evidence registry.

Protobuf never reaches this module; `convert.py` translates at the edge. Times are Unix
nanoseconds. A validity window is half-open, [valid_from, valid_until), and 0 on either side
means unbounded on that side.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from libs.common.kinds import DType

SHA256_PREFIX = "sha256:"


class RecordType(enum.Enum):
    MODEL = "model"
    CAPABILITY = "capability"
    MEASUREMENT = "measurement"
    CALIBRATION = "calibration"
    ROUTE = "route"
    QUALIFICATION = "qualification"


class RecordStatus(enum.Enum):
    ACTIVE = "active"
    REVOKED = "revoked"


class EvidenceClass(enum.Enum):
    CONTRACT = "contract"
    REFERENCE = "reference"
    PHYSICAL = "physical"


class ResolutionReason(enum.Enum):
    """Stable reason codes of a failed resolution (the enum value is the wire string)."""

    NOT_FOUND = "NOT_FOUND"
    WRONG_TYPE = "WRONG_TYPE"
    REVOKED = "REVOKED"
    NOT_YET_VALID = "NOT_YET_VALID"
    EXPIRED = "EXPIRED"
    HASH_MISMATCH = "HASH_MISMATCH"
    BLOB_MISMATCH = "BLOB_MISMATCH"
    BLOB_MISSING = "BLOB_MISSING"


@dataclass(frozen=True)
class LayerRange:
    """Half-open decoder layer range [layer_start, layer_end)."""

    layer_start: int
    layer_end: int


@dataclass(frozen=True)
class Provenance:
    """Who, where and how a record's content was produced. Empty string means not stated."""

    hardware: str = ""
    backend_build: str = ""
    model_snapshot: str = ""
    command: str = ""
    layer_range: LayerRange | None = None
    dtype: DType | None = None
    shapes: str = ""
    # The fleet identity that measured a physical record (spiffe://fornax/<role>/<name>), its
    # certificate, and its signature over the record (see services/evidence_registry/signatures.py).
    measured_by: str = ""
    signer_certificate_pem: str = ""
    signature: bytes = b""


@dataclass(frozen=True)
class ValidityWindow:
    valid_from_unix_ns: int = 0
    valid_until_unix_ns: int = 0


@dataclass(frozen=True)
class BlobRef:
    """A content-addressed blob: lowercase hex sha256 (no prefix) and its size."""

    sha256_hex: str
    size_bytes: int

    @property
    def digest(self) -> str:
        return SHA256_PREFIX + self.sha256_hex


@dataclass(frozen=True)
class RecordContent:
    """What the caller states about a record; everything that makes two puts the same put."""

    type: RecordType
    evidence_class: EvidenceClass
    validity: ValidityWindow = ValidityWindow()
    provenance: Provenance = Provenance()
    labels: tuple[tuple[str, str], ...] = ()
    subject: str = ""


@dataclass(frozen=True)
class Record:
    record_id: str
    content: RecordContent
    blob: BlobRef
    status: RecordStatus
    created_unix_ns: int
    revocation_reason: str = ""


@dataclass(frozen=True)
class PutCommand:
    """A validated put. `record_id` empty means derive it from the content and blob."""

    content: RecordContent
    blob: bytes
    record_id: str = ""
    request_id: str = ""
    # What the caller says the blob is; "" / 0 when unstated. Stated values must match.
    stated_sha256_hex: str = ""
    stated_size_bytes: int = 0


@dataclass(frozen=True)
class RevokeCommand:
    record_id: str
    reason: str
    request_id: str = ""


@dataclass(frozen=True)
class ListQuery:
    """Filters are optional (None = any). `after_seq` is the cursor from the previous page."""

    type: RecordType | None = None
    evidence_class: EvidenceClass | None = None
    status: RecordStatus | None = None
    page_size: int = 100
    after_seq: int = 0


@dataclass(frozen=True)
class ListPage:
    records: tuple[Record, ...]
    # Cursor for the next page; 0 when this is the last page.
    next_after_seq: int = 0


@dataclass(frozen=True)
class Expectation:
    record_id: str
    expected_type: RecordType
    # Lowercase hex sha256 the caller expects, or "" for no expectation.
    expected_sha256_hex: str = ""


@dataclass(frozen=True)
class Resolution:
    record_id: str
    reason: ResolutionReason | None
    detail: str = ""
    record: Record | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None

    @property
    def reason_code(self) -> str:
        """The stable wire reason ("" when ok)."""
        return "" if self.reason is None else self.reason.value


@dataclass(frozen=True)
class ResolveOutcome:
    resolutions: tuple[Resolution, ...] = field(default_factory=tuple)

    @property
    def all_ok(self) -> bool:
        return all(r.ok for r in self.resolutions)

    @property
    def failures(self) -> tuple[Resolution, ...]:
        return tuple(r for r in self.resolutions if not r.ok)
