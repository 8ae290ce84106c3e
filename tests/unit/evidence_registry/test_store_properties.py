"""Model-based check: the SQLite store answers exactly like the in-memory store, page by page."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from services.evidence_registry.blobs import DiskBlobStore, MemoryBlobStore
from services.evidence_registry.domain import (
    EvidenceClass,
    Expectation,
    ListQuery,
    RecordStatus,
    RecordType,
    RevokeCommand,
)
from services.evidence_registry.errors import RecordConflict, RecordNotFound
from services.evidence_registry.registry import EvidenceRegistry
from services.evidence_registry.sqlite_store import SqliteRecordStore
from services.evidence_registry.store import MemoryRecordStore
from tests.unit.evidence_registry.factories import T0, put

puts = st.builds(
    lambda blob, kind, cls, rid, req: ("put", put(blob=bytes([blob]), type=kind, evidence_class=cls,
                                                  record_id=rid, request_id=req)),
    st.integers(0, 5), st.sampled_from(list(RecordType)),
    st.sampled_from([EvidenceClass.CONTRACT, EvidenceClass.REFERENCE]),
    st.sampled_from(["", "", "fixed-a", "fixed-b"]), st.sampled_from(["", "", "req-1", "req-2"]),
)
revokes = st.builds(lambda n: ("revoke", n), st.integers(0, 10))
queries = st.builds(
    ListQuery,
    type=st.none() | st.sampled_from(list(RecordType)),
    evidence_class=st.none() | st.sampled_from([EvidenceClass.CONTRACT, EvidenceClass.REFERENCE]),
    status=st.none() | st.sampled_from(list(RecordStatus)),
    page_size=st.integers(1, 4),
)


def apply(registry: EvidenceRegistry, operations) -> list:
    answers, made = [], []
    for kind, arg in operations:
        try:
            if kind == "put":
                record = registry.put(arg, T0)
                made.append(record.record_id)
                answers.append(record)
            else:
                target = made[arg % len(made)] if made else "none"
                answers.append(registry.revoke(RevokeCommand(target, f"reason {arg}")))
        except (RecordConflict, RecordNotFound) as error:
            answers.append((type(error).__name__, error.reason))
    return answers


def all_pages(registry: EvidenceRegistry, query: ListQuery) -> list:
    pages, after = [], 0
    while True:
        page = registry.list(ListQuery(query.type, query.evidence_class, query.status, query.page_size, after))
        pages.append(page.records)
        after = page.next_after_seq
        if not after:
            return pages


@settings(max_examples=40, deadline=None)
@given(operations=st.lists(st.one_of(puts, revokes), max_size=14), query=queries)
def test_sqlite_store_matches_memory_store(operations, query):
    memory = EvidenceRegistry(MemoryRecordStore(), MemoryBlobStore())
    with tempfile.TemporaryDirectory() as root:
        sqlite = EvidenceRegistry(SqliteRecordStore(Path(root) / "r.db"), DiskBlobStore(Path(root) / "b"))
        try:
            assert apply(sqlite, operations) == apply(memory, operations)
            memory_pages, sqlite_pages = all_pages(memory, query), all_pages(sqlite, query)
            assert sqlite_pages == memory_pages
            listed = [r for page in memory_pages for r in page]
            assert all(len(page) <= query.page_size for page in memory_pages)
            assert len({r.record_id for r in listed}) == len(listed)
            everything = memory.list(ListQuery(page_size=1000)).records
            expected = [r for r in everything if (query.type in (None, r.content.type))
                        and (query.evidence_class in (None, r.content.evidence_class))
                        and (query.status in (None, r.status))]
            assert listed == expected
            expectations = tuple(Expectation(r.record_id, r.content.type) for r in everything) or (
                Expectation("none", RecordType.MODEL),)
            assert sqlite.resolve(expectations, T0) == memory.resolve(expectations, T0)
        finally:
            sqlite.records.close()
