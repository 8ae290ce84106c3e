"""The SQLite store: WAL mode, durable across reopen, safe under concurrent threads and processes."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from services.evidence_registry.blobs import DiskBlobStore, sha256_hex
from services.evidence_registry.domain import (
    Expectation,
    ListQuery,
    RecordStatus,
    RecordType,
    RevokeCommand,
)
from services.evidence_registry.registry import EvidenceRegistry
from services.evidence_registry.sqlite_store import SqliteRecordStore
from tests.unit.evidence_registry.factories import T0, physical, put

PUTS_PER_WORKER = 12


def open_registry(root: Path) -> EvidenceRegistry:
    return EvidenceRegistry(SqliteRecordStore(root / "registry.db"), DiskBlobStore(root / "blobs"))


def all_records(registry: EvidenceRegistry):
    return registry.list(ListQuery(page_size=1000)).records


def test_store_runs_in_wal_mode(tmp_path):
    store = SqliteRecordStore(tmp_path / "r.db")
    assert store.journal_mode() == "wal"
    store.close()


def test_records_blobs_and_revocations_survive_reopen(tmp_path):
    registry = open_registry(tmp_path)
    kept = registry.put(put(blob=b"kept", request_id="req-a"), T0)
    gone = registry.put(put(blob=b"gone", record_id="node-a-route", type=RecordType.ROUTE), T0)
    phys = registry.put(put(blob=b"phys", record_content=physical()), T0)
    registry.revoke(RevokeCommand(gone.record_id, "link replaced"))
    registry.records.close()

    reopened = open_registry(tmp_path)
    assert reopened.get(kept.record_id) == (kept, None)
    assert reopened.get(phys.record_id)[0] == phys
    revoked, blob = reopened.get(gone.record_id, include_blob=True)
    assert revoked.status is RecordStatus.REVOKED and revoked.revocation_reason == "link replaced"
    assert blob == b"gone"
    # The request id is remembered too: a retry after restart returns the original record.
    assert reopened.put(put(blob=b"kept", request_id="req-a"), T0 + 99) == kept
    assert reopened.resolve((Expectation(kept.record_id, RecordType.MEASUREMENT),), T0).all_ok
    assert len(all_records(reopened)) == 3
    reopened.records.close()


def test_blob_files_are_content_addressed_without_leftover_temp_files(tmp_path):
    registry = open_registry(tmp_path)
    record = registry.put(put(blob=b"payload"), T0)
    path = registry.blobs.path_of(record.blob.sha256_hex)
    assert path.read_bytes() == b"payload"
    assert path.name == sha256_hex(b"payload")
    assert not list((tmp_path / "blobs").rglob(".tmp-*"))
    registry.records.close()


def test_concurrent_puts_from_threads(tmp_path):
    registry = open_registry(tmp_path)

    def worker(index: int):
        made = []
        for n in range(PUTS_PER_WORKER):
            made.append(registry.put(put(blob=f"w{index}-{n}".encode()), T0).record_id)
            # Every worker also races on one shared record and one shared request id.
            made.append(registry.put(put(blob=b"shared"), T0).record_id)
            made.append(registry.put(put(blob=b"req", request_id="shared-req"), T0).record_id)
        return made

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(worker, range(8)))
    records = all_records(registry)
    assert len(records) == 8 * PUTS_PER_WORKER + 2
    shared_ids = {ids[1] for ids in results} | {ids[2] for ids in results}
    assert len(shared_ids) == 2
    assert len({r.record_id for r in records}) == len(records)
    registry.records.close()


def _process_worker(root: str, index: int, barrier) -> None:
    registry = open_registry(Path(root))
    barrier.wait()
    for n in range(PUTS_PER_WORKER):
        registry.put(put(blob=f"p{index}-{n}".encode(), request_id=f"p{index}-{n}"), T0)
        registry.put(put(blob=b"shared", request_id=f"shared-{index}-{n}"), T0)
    registry.records.close()


def test_concurrent_puts_from_processes(tmp_path):
    context = multiprocessing.get_context("spawn")
    workers = 4
    barrier = context.Barrier(workers)
    procs = [context.Process(target=_process_worker, args=(str(tmp_path), i, barrier)) for i in range(workers)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in procs] == [0] * workers

    registry = open_registry(tmp_path)
    records = all_records(registry)
    assert len(records) == workers * PUTS_PER_WORKER + 1
    outcome = registry.resolve(tuple(Expectation(r.record_id, RecordType.MEASUREMENT) for r in records), T0)
    assert outcome.all_ok, [f.detail for f in outcome.failures]
    assert os.path.exists(tmp_path / "registry.db-wal")
    registry.records.close()


def test_a_newer_schema_is_refused_not_rewritten(tmp_path):
    import sqlite3

    import pytest

    SqliteRecordStore(tmp_path / "r.db").close()
    with sqlite3.connect(tmp_path / "r.db") as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(RuntimeError, match="schema version 99"):
        SqliteRecordStore(tmp_path / "r.db")
