"""The record store interface, the shared put/revoke decisions, and the in-memory store.

Every store gives the same answers; `sqlite_store.SqliteRecordStore` is the durable one.
Blobs live in a separate `blobs.BlobStore`; a record row only ever names a blob that was
already written, so a crash between the two leaves at most an unreferenced blob.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Protocol

from services.evidence_registry.domain import ListPage, ListQuery, Record, RecordStatus
from services.evidence_registry.errors import RecordConflict, RecordNotFound


class RecordStore(Protocol):
    def put(self, candidate: Record, request_id: str) -> Record:
        """Inserts `candidate` atomically, or returns the record an earlier identical put made.

        Raises RecordConflict when the record id or request id already names different content.
        """

    def get(self, record_id: str) -> Record | None: ...

    def list(self, query: ListQuery) -> ListPage: ...

    def revoke(self, record_id: str, reason: str) -> Record:
        """Marks a record revoked (idempotent: a revoked record is returned unchanged)."""

    def referenced_blobs(self) -> set[str]:
        """The sha256 hex of every blob some record names (revoked records included)."""

    def close(self) -> None: ...


def same_put(a: Record, b: Record) -> bool:
    return a.record_id == b.record_id and a.content == b.content and a.blob == b.blob


def decide_put(candidate: Record, request_id: str,
               by_request: Record | None, by_id: Record | None) -> Record | None:
    """The record to answer with, or None when `candidate` must be inserted."""
    if by_request is not None:
        if not same_put(by_request, candidate):
            raise RecordConflict(
                f"request_id {request_id!r} already made record {by_request.record_id!r} "
                "with different content", "REQUEST_ID_REUSED",
            )
        return by_request
    if by_id is not None:
        if not same_put(by_id, candidate):
            raise RecordConflict(
                f"record {candidate.record_id!r} already exists with different content", "RECORD_EXISTS",
            )
        return by_id
    return None


def revoked(record: Record, reason: str) -> Record:
    if record.status is RecordStatus.REVOKED:
        return record
    return dataclasses.replace(record, status=RecordStatus.REVOKED, revocation_reason=reason)


def matches(query: ListQuery, record: Record) -> bool:
    return ((query.type is None or record.content.type is query.type)
            and (query.evidence_class is None or record.content.evidence_class is query.evidence_class)
            and (query.status is None or record.status is query.status))


def not_found(record_id: str) -> RecordNotFound:
    return RecordNotFound(f"record {record_id!r} does not exist")


class MemoryRecordStore:
    """Thread-safe, process-local; for unit tests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, tuple[int, Record]] = {}
        self._requests: dict[str, str] = {}
        self._next_seq = 1

    def put(self, candidate: Record, request_id: str) -> Record:
        with self._lock:
            by_request = self._get(self._requests[request_id]) if request_id in self._requests else None
            existing = decide_put(candidate, request_id, by_request, self._get(candidate.record_id))
            record = existing or candidate
            if existing is None:
                self._records[candidate.record_id] = (self._next_seq, candidate)
                self._next_seq += 1
            if request_id:
                self._requests.setdefault(request_id, record.record_id)
            return record

    def get(self, record_id: str) -> Record | None:
        with self._lock:
            return self._get(record_id)

    def _get(self, record_id: str) -> Record | None:
        entry = self._records.get(record_id)
        return None if entry is None else entry[1]

    def list(self, query: ListQuery) -> ListPage:
        with self._lock:
            rows = sorted((seq, rec) for seq, rec in self._records.values()
                          if seq > query.after_seq and matches(query, rec))
        page = rows[:query.page_size]
        more = len(rows) > query.page_size
        return ListPage(tuple(rec for _, rec in page), page[-1][0] if more else 0)

    def revoke(self, record_id: str, reason: str) -> Record:
        with self._lock:
            entry = self._records.get(record_id)
            if entry is None:
                raise not_found(record_id)
            seq, record = entry
            updated = revoked(record, reason)
            self._records[record_id] = (seq, updated)
            return updated

    def referenced_blobs(self) -> set[str]:
        with self._lock:
            return {record.blob.sha256_hex for _, record in self._records.values()}

    def close(self) -> None:
        pass
