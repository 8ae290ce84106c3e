"""Durable record store: SQLite in WAL mode, one connection per thread, safe across processes.

Writers take the database lock up front (BEGIN IMMEDIATE) so that a read-then-write decision
cannot interleave with another writer, and wait on a held lock through busy_timeout rather
than failing. synchronous=FULL makes every committed put survive a power cut.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from libs.common.kinds import DType
from services.evidence_registry.domain import (
    BlobRef,
    EvidenceClass,
    LayerRange,
    ListPage,
    ListQuery,
    Provenance,
    Record,
    RecordContent,
    RecordStatus,
    RecordType,
    ValidityWindow,
)
from services.evidence_registry.store import decide_put, not_found, revoked

SCHEMA_VERSION = 2
_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    record_id TEXT NOT NULL UNIQUE,
    type TEXT NOT NULL,
    evidence_class TEXT NOT NULL,
    status TEXT NOT NULL,
    blob_sha256_hex TEXT NOT NULL,
    blob_size_bytes INTEGER NOT NULL,
    valid_from_unix_ns INTEGER NOT NULL,
    valid_until_unix_ns INTEGER NOT NULL,
    created_unix_ns INTEGER NOT NULL,
    revocation_reason TEXT NOT NULL,
    subject TEXT NOT NULL,
    hardware TEXT NOT NULL,
    backend_build TEXT NOT NULL,
    model_snapshot TEXT NOT NULL,
    command TEXT NOT NULL,
    layer_start INTEGER,
    layer_end_exclusive INTEGER,
    dtype TEXT,
    shapes TEXT NOT NULL,
    labels_json TEXT NOT NULL,
    measured_by TEXT NOT NULL DEFAULT '',
    signer_certificate_pem TEXT NOT NULL DEFAULT '',
    signature BLOB NOT NULL DEFAULT x''
);
CREATE INDEX IF NOT EXISTS records_filter ON records (type, evidence_class, status, seq);
CREATE TABLE IF NOT EXISTS requests (
    request_id TEXT PRIMARY KEY,
    record_id TEXT NOT NULL
);
"""
_COLUMNS = (
    "record_id", "type", "evidence_class", "status", "blob_sha256_hex", "blob_size_bytes",
    "valid_from_unix_ns", "valid_until_unix_ns", "created_unix_ns", "revocation_reason", "subject",
    "hardware", "backend_build", "model_snapshot", "command", "layer_start", "layer_end_exclusive",
    "dtype", "shapes", "labels_json", "measured_by", "signer_certificate_pem", "signature",
)
# Version 1 databases gain the signature columns in place.
_MIGRATE_1_TO_2 = (
    "ALTER TABLE records ADD COLUMN measured_by TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE records ADD COLUMN signer_certificate_pem TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE records ADD COLUMN signature BLOB NOT NULL DEFAULT x''",
)
_SELECT = f"SELECT seq, {', '.join(_COLUMNS)} FROM records"


def _to_row(record: Record) -> tuple:
    content, prov = record.content, record.content.provenance
    layers = prov.layer_range
    return (
        record.record_id, content.type.value, content.evidence_class.value, record.status.value,
        record.blob.sha256_hex, record.blob.size_bytes,
        content.validity.valid_from_unix_ns, content.validity.valid_until_unix_ns,
        record.created_unix_ns, record.revocation_reason, content.subject,
        prov.hardware, prov.backend_build, prov.model_snapshot, prov.command,
        None if layers is None else layers.layer_start,
        None if layers is None else layers.layer_end,
        None if prov.dtype is None else prov.dtype.value, prov.shapes,
        json.dumps([list(pair) for pair in content.labels]),
        prov.measured_by, prov.signer_certificate_pem, prov.signature,
    )


def _from_row(row: sqlite3.Row) -> Record:
    layers = None if row["layer_start"] is None else LayerRange(row["layer_start"], row["layer_end_exclusive"])
    provenance = Provenance(
        hardware=row["hardware"], backend_build=row["backend_build"],
        model_snapshot=row["model_snapshot"], command=row["command"], layer_range=layers,
        dtype=None if row["dtype"] is None else DType(row["dtype"]), shapes=row["shapes"],
        measured_by=row["measured_by"], signer_certificate_pem=row["signer_certificate_pem"],
        signature=bytes(row["signature"]),
    )
    content = RecordContent(
        type=RecordType(row["type"]), evidence_class=EvidenceClass(row["evidence_class"]),
        validity=ValidityWindow(row["valid_from_unix_ns"], row["valid_until_unix_ns"]),
        provenance=provenance,
        labels=tuple((key, value) for key, value in json.loads(row["labels_json"])),
        subject=row["subject"],
    )
    return Record(
        record_id=row["record_id"], content=content,
        blob=BlobRef(row["blob_sha256_hex"], row["blob_size_bytes"]),
        status=RecordStatus(row["status"]), created_unix_ns=row["created_unix_ns"],
        revocation_reason=row["revocation_reason"],
    )


class SqliteRecordStore:
    def __init__(self, path: Path, busy_timeout_ms: int = 30_000) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._busy_timeout_ms = busy_timeout_ms
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        with self._write() as conn:
            found = conn.execute("PRAGMA user_version").fetchone()[0]
            if found > SCHEMA_VERSION:
                raise RuntimeError(f"{self.path} has schema version {found}; this build reads up to {SCHEMA_VERSION}")
            if found == 1:
                for statement in _MIGRATE_1_TO_2:
                    conn.execute(statement)
            for statement in filter(str.strip, _SCHEMA.split(";")):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=self._busy_timeout_ms / 1000,
                                   check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @staticmethod
    def _get(conn: sqlite3.Connection, record_id: str) -> Record | None:
        row = conn.execute(f"{_SELECT} WHERE record_id = ?", (record_id,)).fetchone()
        return None if row is None else _from_row(row)

    def journal_mode(self) -> str:
        return self._conn().execute("PRAGMA journal_mode").fetchone()[0]

    def put(self, candidate: Record, request_id: str) -> Record:
        with self._write() as conn:
            by_request = None
            if request_id:
                row = conn.execute("SELECT record_id FROM requests WHERE request_id = ?", (request_id,)).fetchone()
                by_request = None if row is None else self._get(conn, row["record_id"])
            existing = decide_put(candidate, request_id, by_request, self._get(conn, candidate.record_id))
            if existing is None:
                placeholders = ", ".join("?" for _ in _COLUMNS)
                conn.execute(f"INSERT INTO records ({', '.join(_COLUMNS)}) VALUES ({placeholders})",
                             _to_row(candidate))
            record = existing or candidate
            if request_id:
                conn.execute("INSERT OR IGNORE INTO requests (request_id, record_id) VALUES (?, ?)",
                             (request_id, record.record_id))
            return record

    def get(self, record_id: str) -> Record | None:
        return self._get(self._conn(), record_id)

    def list(self, query: ListQuery) -> ListPage:
        clauses, params = ["seq > ?"], [query.after_seq]
        for column, value in (("type", query.type), ("evidence_class", query.evidence_class),
                              ("status", query.status)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value.value)
        sql = f"{_SELECT} WHERE {' AND '.join(clauses)} ORDER BY seq LIMIT ?"
        rows = self._conn().execute(sql, (*params, query.page_size + 1)).fetchall()
        page = rows[:query.page_size]
        records = tuple(_from_row(row) for row in page)
        more = len(rows) > query.page_size
        return ListPage(records, page[-1]["seq"] if more else 0)

    def revoke(self, record_id: str, reason: str) -> Record:
        with self._write() as conn:
            record = self._get(conn, record_id)
            if record is None:
                raise not_found(record_id)
            updated = revoked(record, reason)
            if updated is not record:
                conn.execute("UPDATE records SET status = ?, revocation_reason = ? WHERE record_id = ?",
                             (updated.status.value, updated.revocation_reason, record_id))
            return updated

    def referenced_blobs(self) -> set[str]:
        rows = self._conn().execute("SELECT DISTINCT blob_sha256_hex FROM records").fetchall()
        return {row[0] for row in rows}

    def close(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()
        self._local = threading.local()
