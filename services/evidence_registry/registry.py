"""The registry's behaviour over a record store and a blob store. No clocks: callers pass times."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass

from services.evidence_registry.blobs import BlobStore, sha256_hex
from services.evidence_registry.domain import (
    Expectation,
    ListPage,
    ListQuery,
    PutCommand,
    Record,
    RecordContent,
    RecordStatus,
    ResolveOutcome,
    RevokeCommand,
)
from services.evidence_registry.errors import BlobDamaged, InvalidField
from services.evidence_registry.resolution import resolve_one
from services.evidence_registry.store import RecordStore, not_found
from services.evidence_registry.validation import check_expectations, check_put, check_revoke


@dataclass(frozen=True)
class RegistryLimits:
    max_blob_bytes: int = 64 << 20
    default_page_size: int = 100
    max_page_size: int = 1000


_SIGNATURE_FIELDS = ("measured_by", "signer_certificate_pem", "signature")


def canonical_content(content: RecordContent, *, with_signature: bool = True) -> bytes:
    """Stable JSON of content; unsigned content hashes as it did before records were signed."""
    body = dataclasses.asdict(content)
    layers = body["provenance"]["layer_range"]
    if layers is not None:  # the stored name, which record ids and signatures cover
        layers["layer_end_exclusive"] = layers.pop("layer_end")
    for name in _SIGNATURE_FIELDS:
        if not with_signature or not body["provenance"][name]:
            body["provenance"].pop(name)
    return json.dumps(body, sort_keys=True, separators=(",", ":"),
                      default=lambda value: value.hex() if isinstance(value, bytes) else value.value).encode()


def _canonical(content: RecordContent) -> bytes:
    return canonical_content(content)


def derive_record_id(content: RecordContent, blob_sha256_hex: str) -> str:
    """Same content and blob give the same id, so a repeated put is idempotent by content."""
    digest = hashlib.sha256(_canonical(content) + b"\0" + blob_sha256_hex.encode()).hexdigest()
    return f"{content.type.value}-{digest[:32]}"


class EvidenceRegistry:
    def __init__(self, records: RecordStore, blobs: BlobStore,
                 limits: RegistryLimits = RegistryLimits(),
                 check_signature: Callable[[RecordContent, str], None] | None = None) -> None:
        self.records = records
        self.blobs = blobs
        self.limits = limits
        # Raises when a physical record's signature does not hold (see signatures.py).
        self.check_signature = check_signature

    def put(self, command: PutCommand, now_unix_ns: int) -> Record:
        check_put(command, self.limits.max_blob_bytes)
        blob_hex = sha256_hex(command.blob)
        if command.stated_sha256_hex and command.stated_sha256_hex != blob_hex:
            raise InvalidField("record.blob_sha256", "BLOB_HASH_MISMATCH",
                               f"stated sha256:{command.stated_sha256_hex}, blob is sha256:{blob_hex}")
        if command.stated_size_bytes and command.stated_size_bytes != len(command.blob):
            raise InvalidField("record.blob_size_bytes", "BLOB_SIZE_MISMATCH",
                               f"stated {command.stated_size_bytes} bytes, blob is {len(command.blob)}")
        if self.check_signature is not None:
            self.check_signature(command.content, blob_hex)
        record_id = command.record_id or derive_record_id(command.content, blob_hex)
        # Blob first: a record row never names bytes that are not yet on disk.
        blob = self.blobs.put(command.blob)
        candidate = Record(record_id=record_id, content=command.content, blob=blob,
                           status=RecordStatus.ACTIVE, created_unix_ns=now_unix_ns)
        return self.records.put(candidate, command.request_id)

    def get(self, record_id: str, include_blob: bool = False) -> tuple[Record, bytes | None]:
        if not record_id:
            raise InvalidField("record_id", "MISSING_FIELD", "a record id is required")
        record = self.records.get(record_id)
        if record is None:
            raise not_found(record_id)
        if not include_blob:
            return record, None
        blob = self.blobs.read(record.blob.sha256_hex)
        # Never hand out bytes that are not the ones the record names.
        if blob is None:
            raise BlobDamaged(f"record {record_id!r}: stored blob {record.blob.digest} is missing",
                              reason="BLOB_MISSING")
        if sha256_hex(blob) != record.blob.sha256_hex:
            raise BlobDamaged(f"record {record_id!r}: stored blob no longer hashes to {record.blob.digest}",
                              reason="BLOB_MISMATCH")
        return record, blob

    def list(self, query: ListQuery) -> ListPage:
        if query.page_size < 0:
            raise InvalidField("page_size", "INVALID_PAGE_SIZE", f"{query.page_size} is negative")
        size = min(query.page_size or self.limits.default_page_size, self.limits.max_page_size)
        return self.records.list(dataclasses.replace(query, page_size=size))

    def revoke(self, command: RevokeCommand) -> Record:
        check_revoke(command)
        return self.records.revoke(command.record_id, command.reason)

    def resolve(self, expectations: tuple[Expectation, ...], at_unix_ns: int) -> ResolveOutcome:
        check_expectations(expectations)
        resolutions = []
        for expectation in expectations:
            record = self.records.get(expectation.record_id)
            fresh = None if record is None else self.blobs.rehash(record.blob.sha256_hex)
            resolutions.append(resolve_one(expectation, record, fresh, at_unix_ns))
        return ResolveOutcome(tuple(resolutions))
