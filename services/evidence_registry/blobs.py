"""Content-addressed blob storage: on disk (atomic writes) or in memory (unit tests)."""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from services.evidence_registry.domain import BlobRef

_CHUNK_BYTES = 1 << 20


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class BlobStore(Protocol):
    def put(self, data: bytes) -> BlobRef:
        """Stores `data` under its sha256; idempotent, and repairs a damaged copy."""

    def read(self, sha256_hex: str) -> bytes | None:
        """The stored bytes as they are now, or None when absent."""

    def rehash(self, sha256_hex: str) -> str | None:
        """A fresh sha256 of the stored bytes (never a cached one), or None when absent."""


class MemoryBlobStore:
    def __init__(self) -> None:
        self._blobs: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def put(self, data: bytes) -> BlobRef:
        ref = BlobRef(sha256_hex(data), len(data))
        with self._lock:
            self._blobs[ref.sha256_hex] = bytes(data)
        return ref

    def read(self, sha256_hex: str) -> bytes | None:
        with self._lock:
            return self._blobs.get(sha256_hex)

    def rehash(self, sha256_hex: str) -> str | None:
        data = self.read(sha256_hex)
        return None if data is None else hashlib.sha256(data).hexdigest()

    def overwrite(self, sha256_hex: str, data: bytes | None) -> None:
        """Replaces (or with None deletes) stored bytes behind the registry's back."""
        with self._lock:
            if data is None:
                self._blobs.pop(sha256_hex, None)
            else:
                self._blobs[sha256_hex] = data


@dataclass(frozen=True)
class SweepReport:
    temp_files_removed: int
    unreferenced_blobs_removed: int


TEMP_PREFIX = ".tmp-"


class DiskBlobStore:
    """Blobs at `<root>/<first two hex>/<hex>`, written via temp file + fsync + rename."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def sweep(self, referenced: set[str]) -> SweepReport:
        """Removes what a crash can leave behind: half-written temp files, and blobs written
        before their record committed (a put is acknowledged only after the commit, so no
        acknowledged record loses its blob). Run before serving, never during puts."""
        temps = orphans = 0
        for path in self.root.glob("*/*"):
            if path.name.startswith(TEMP_PREFIX):
                path.unlink(missing_ok=True)
                temps += 1
            elif path.is_file() and path.name not in referenced:
                path.unlink(missing_ok=True)
                orphans += 1
        return SweepReport(temps, orphans)

    def path_of(self, sha256_hex: str) -> Path:
        return self.root / sha256_hex[:2] / sha256_hex

    def put(self, data: bytes) -> BlobRef:
        ref = BlobRef(sha256_hex(data), len(data))
        if self.rehash(ref.sha256_hex) != ref.sha256_hex:
            self._write_atomically(self.path_of(ref.sha256_hex), data)
        return ref

    def read(self, sha256_hex: str) -> bytes | None:
        try:
            return self.path_of(sha256_hex).read_bytes()
        except FileNotFoundError:
            return None

    def rehash(self, sha256_hex: str) -> str | None:
        digest = hashlib.sha256()
        try:
            with open(self.path_of(sha256_hex), "rb") as handle:
                while chunk := handle.read(_CHUNK_BYTES):
                    digest.update(chunk)
        except FileNotFoundError:
            return None
        return digest.hexdigest()

    @staticmethod
    def _write_atomically(target: Path, data: bytes) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.parent / f"{TEMP_PREFIX}{uuid.uuid4().hex}"
        try:
            with open(temp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, target)
        finally:
            temp.unlink(missing_ok=True)
        _fsync_dir(target.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
