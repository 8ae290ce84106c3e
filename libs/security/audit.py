"""Append-only, hash-chained audit log in JSON lines.

Each entry carries its sequence number, the hash of the entry before it and its own hash
(sha256 over the previous hash and the entry's canonical JSON). Editing an entry breaks its
hash; removing one breaks the sequence and the chain after it. Cutting entries off the end
leaves a valid shorter chain, so `verify` also reports the head for comparison with a copy
kept elsewhere.

`chain_entry` and `verify_lines` are pure; `AuditLog` is the file shell.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

GENESIS = "0" * 64
ANONYMOUS = "anonymous"


class AuditProblem(enum.Enum):
    UNPARSEABLE = "UNPARSEABLE"
    SEQUENCE_GAP = "SEQUENCE_GAP"
    CHAIN_BROKEN = "CHAIN_BROKEN"
    HASH_MISMATCH = "HASH_MISMATCH"


@dataclass(frozen=True)
class AuditEvent:
    """What happened, before it is chained."""

    time: str  # RFC 3339, UTC
    caller: str  # "<role>/<name>", or "anonymous"
    rpc: str  # full gRPC method, e.g. /fornax.stage_worker.v1.StageWorkerService/UnloadStage
    args_sha256: str
    result: str  # "OK", or "<STATUS_CODE>:<REASON>"
    service: str = ""


@dataclass(frozen=True)
class AuditEntry:
    seq: int
    prev: str
    hash: str
    event: AuditEvent

    def to_line(self) -> str:
        return json.dumps({"seq": self.seq, "prev": self.prev, "hash": self.hash, **asdict(self.event)},
                          sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class VerifyResult:
    entries: int
    head: str
    problem: AuditProblem | None = None
    line: int | None = None  # 1-based line of the first problem
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.problem is None


def _entry_hash(seq: int, prev: str, event: AuditEvent) -> str:
    body = json.dumps({"seq": seq, "prev": prev, **asdict(event)}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{prev}\n{body}".encode()).hexdigest()


def chain_entry(seq: int, prev: str, event: AuditEvent) -> AuditEntry:
    return AuditEntry(seq, prev, _entry_hash(seq, prev, event), event)


def parse_line(text: str) -> AuditEntry:
    body = json.loads(text)
    event = AuditEvent(**{k: body[k] for k in AuditEvent.__dataclass_fields__ if k in body})
    return AuditEntry(int(body["seq"]), str(body["prev"]), str(body["hash"]), event)


def verify_lines(lines: Iterable[str]) -> VerifyResult:
    prev, expected_seq, count = GENESIS, 0, 0
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            entry = parse_line(text)
        except (ValueError, KeyError, TypeError) as exc:
            return VerifyResult(count, prev, AuditProblem.UNPARSEABLE, number, str(exc))
        if entry.seq != expected_seq:
            return VerifyResult(count, prev, AuditProblem.SEQUENCE_GAP, number,
                                f"expected seq {expected_seq}, found {entry.seq}")
        if entry.prev != prev:
            return VerifyResult(count, prev, AuditProblem.CHAIN_BROKEN, number,
                                "prev does not match the hash of the entry before")
        if _entry_hash(entry.seq, entry.prev, entry.event) != entry.hash:
            return VerifyResult(count, prev, AuditProblem.HASH_MISMATCH, number, "entry was edited")
        prev, expected_seq, count = entry.hash, expected_seq + 1, count + 1
    return VerifyResult(count, prev)


class AuditLogBroken(ValueError):
    """The log on disk fails verification; appending to it would hide the damage."""


class AuditLog:
    """One service's log file. Appends are serialised and fsynced; the file is mode 600."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._seq, self._head = self._resume()

    def _resume(self) -> tuple[int, str]:
        if not self.path.exists():
            return 0, GENESIS
        result = verify_lines(self.path.read_text(encoding="utf-8").splitlines())
        if result.problem is not None:
            # Never extend a tampered chain: the damage would look like it came later.
            raise AuditLogBroken(f"audit log {self.path} fails verification at line {result.line}: "
                                 f"{result.problem.value} ({result.detail})")
        return result.entries, result.head

    def append(self, event: AuditEvent) -> AuditEntry:
        with self._lock:
            entry = chain_entry(self._seq, self._head, event)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, (entry.to_line() + "\n").encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            self._seq, self._head = self._seq + 1, entry.hash
            return entry

    def entries(self) -> list[AuditEntry]:
        return read_entries(self.path)


_OPEN_LOGS: dict[Path, AuditLog] = {}
_OPEN_LOGS_LOCK = threading.Lock()


def open_audit_log(path: str | os.PathLike) -> AuditLog:
    """The process's one AuditLog for path: two writers with their own sequence numbers
    would fork the chain."""
    key = Path(path).resolve()
    with _OPEN_LOGS_LOCK:
        if key not in _OPEN_LOGS:
            _OPEN_LOGS[key] = AuditLog(key)
        return _OPEN_LOGS[key]


def read_entries(path: str | os.PathLike) -> list[AuditEntry]:
    """Entries as written, without checking the chain (that is `verify_file`)."""
    path = Path(path)
    if not path.exists():
        return []
    return [parse_line(t) for t in path.read_text(encoding="utf-8").splitlines() if t.strip()]


def verify_file(path: str | os.PathLike) -> VerifyResult:
    return verify_lines(Path(path).read_text(encoding="utf-8").splitlines())
