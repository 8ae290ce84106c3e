"""kill -9 of the evidence registry during concurrent writes: every acknowledged record
survives intact, and the restart removes what the kills left half-written."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
from pathlib import Path

import pytest

from services.evidence_registry.client import (
    ClientOptions,
    RegistryCallFailed,
    RegistryClient,
)
from tests.integration.evidence_registry.harness import start_registry
from tests.unit.evidence_registry.factories import content

pytestmark = [pytest.mark.integration]
ROUNDS = 3
WRITERS = 4
ACKS_BEFORE_KILL = 40
# Retries of UNAVAILABLE are harmless: a put is idempotent, and a dead registry acknowledges nothing.
WRITER_OPTIONS = ClientOptions(timeout_s=10.0)


def _blob(writer: int, index: int, round_no: int) -> bytes:
    # Sizes up to ~1 MiB, so a kill often lands mid-write of a blob file.
    seed = f"{round_no}:{writer}:{index}".encode()
    return hashlib.sha256(seed).digest() * (1 + (index * 997) % 32768)


def _write_until_killed(address: str, round_no: int, acked: dict, lock: threading.Lock,
                        enough: threading.Event) -> None:
    def writer(w: int) -> None:
        with RegistryClient(address, WRITER_OPTIONS) as client:
            for index in range(100_000):
                blob = _blob(w, index, round_no)
                try:
                    record = client.put_record(content(subject=f"r{round_no}-w{w}-{index}"), blob)
                except RegistryCallFailed:
                    return  # the registry is gone: this write was never acknowledged
                with lock:
                    acked[record.record_id] = hashlib.sha256(blob).hexdigest()
                    if len(acked) >= ACKS_BEFORE_KILL * (round_no + 1):
                        enough.set()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
    for thread in threads:
        thread.start()
    return threads


def _blob_files(blob_dir: Path) -> list[Path]:
    return [p for p in blob_dir.glob("*/*") if p.is_file()]


def test_kill_9_during_writes_loses_no_acknowledged_record(tmp_path):
    data = tmp_path / "data"
    acked: dict[str, str] = {}
    lock = threading.Lock()
    for round_no in range(ROUNDS):
        proc, address = start_registry(data, tmp_path / f"run{round_no}")
        enough = threading.Event()
        threads = _write_until_killed(address, round_no, acked, lock, enough)
        assert enough.wait(120), "writers made no progress"
        os.kill(proc.process.pid, signal.SIGKILL)
        for thread in threads:
            thread.join(60)
            assert not thread.is_alive()
        proc.stop()
    # Debris a crash can leave, planted so the sweep has something to prove itself on.
    blob_dir = data / "blobs"
    (blob_dir / "ab").mkdir(parents=True, exist_ok=True)
    (blob_dir / "ab" / ".tmp-halfwritten").write_bytes(b"partial")
    orphan = hashlib.sha256(b"never committed").hexdigest()
    (blob_dir / orphan[:2]).mkdir(parents=True, exist_ok=True)
    (blob_dir / orphan[:2] / orphan).write_bytes(b"never committed")

    proc, address = start_registry(data, tmp_path / "final")
    try:
        with RegistryClient(address) as client:
            for record_id, digest in acked.items():
                record, blob = client.get_record(record_id, include_blob=True)
                assert hashlib.sha256(blob).hexdigest() == digest == record.blob.sha256_hex
            referenced = {r.blob.sha256_hex for r in client.iter_records(page_size=500)}
    finally:
        proc.stop()
    files = _blob_files(blob_dir)
    assert not [p for p in files if p.name.startswith(".tmp-")]
    assert {p.name for p in files} == referenced  # no unreferenced blob survives the start
    assert len(acked) >= ACKS_BEFORE_KILL * ROUNDS


def test_the_registry_client_reads_back_an_8_mib_blob(tmp_path):
    proc, address = start_registry(tmp_path / "data", tmp_path / "run")
    blob = os.urandom(8 << 20)
    try:
        with RegistryClient(address) as client:
            record = client.put_record(content(subject="big"), blob)
            _, fetched = client.get_record(record.record_id, include_blob=True)
    finally:
        proc.stop()
    assert fetched == blob
