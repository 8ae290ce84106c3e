"""Registry behaviour, run identically over the in-memory and the SQLite stores."""

from __future__ import annotations

import dataclasses

import pytest

from services.evidence_registry.blobs import DiskBlobStore, MemoryBlobStore, sha256_hex
from services.evidence_registry.domain import (
    EvidenceClass,
    Expectation,
    ListQuery,
    RecordStatus,
    RecordType,
    ResolutionReason,
    RevokeCommand,
)
from services.evidence_registry.errors import BlobDamaged, InvalidField, RecordConflict, RecordNotFound
from services.evidence_registry.registry import (
    EvidenceRegistry,
    RegistryLimits,
    canonical_content,
    derive_record_id,
)
from services.evidence_registry.sqlite_store import SqliteRecordStore
from services.evidence_registry.store import MemoryRecordStore
from tests.unit.evidence_registry.factories import T0, physical, put, window


@pytest.fixture(params=["memory", "sqlite"])
def registry(request, tmp_path):
    if request.param == "memory":
        reg = EvidenceRegistry(MemoryRecordStore(), MemoryBlobStore())
    else:
        reg = EvidenceRegistry(SqliteRecordStore(tmp_path / "registry.db"), DiskBlobStore(tmp_path / "blobs"))
    yield reg
    reg.records.close()


def tamper(registry: EvidenceRegistry, sha_hex: str, data: bytes | None) -> None:
    blobs = registry.blobs
    if isinstance(blobs, MemoryBlobStore):
        blobs.overwrite(sha_hex, data)
    elif data is None:
        blobs.path_of(sha_hex).unlink()
    else:
        blobs.path_of(sha_hex).write_bytes(data)


def resolve(registry, record_id, expected_type=RecordType.MEASUREMENT, sha="", at=T0):
    outcome = registry.resolve((Expectation(record_id, expected_type, sha),), at)
    return outcome.resolutions[0]


def test_put_is_content_addressed_and_round_trips(registry):
    record = registry.put(put(blob=b"abc"), T0)
    assert record.blob.sha256_hex == sha256_hex(b"abc")
    assert record.blob.size_bytes == 3
    assert record.status is RecordStatus.ACTIVE
    assert record.record_id.startswith("measurement-")
    fetched, blob = registry.get(record.record_id, include_blob=True)
    assert fetched == record
    assert blob == b"abc"


def test_identical_puts_give_one_record_and_different_content_a_new_one(registry):
    first = registry.put(put(blob=b"x"), T0)
    again = registry.put(put(blob=b"x"), T0 + 5)
    other = registry.put(put(blob=b"y"), T0 + 9)
    assert again == first
    assert other.record_id != first.record_id
    assert len(registry.list(ListQuery()).records) == 2


def test_request_id_makes_put_idempotent_and_refuses_reuse(registry):
    first = registry.put(put(blob=b"one", request_id="req-1"), T0)
    assert registry.put(put(blob=b"one", request_id="req-1"), T0 + 1) == first
    with pytest.raises(RecordConflict) as err:
        registry.put(put(blob=b"two", request_id="req-1"), T0 + 2)
    assert err.value.reason == "REQUEST_ID_REUSED"


def test_explicit_record_id_conflict(registry):
    registry.put(put(blob=b"one", record_id="node-a-cap"), T0)
    with pytest.raises(RecordConflict) as err:
        registry.put(put(blob=b"two", record_id="node-a-cap"), T0)
    assert err.value.reason == "RECORD_EXISTS"


def test_stated_hash_and_size_must_match(registry):
    bad_hash = dataclasses.replace(put(blob=b"abc"), stated_sha256_hex="0" * 64)
    with pytest.raises(InvalidField) as err:
        registry.put(bad_hash, T0)
    assert (err.value.field, err.value.reason) == ("record.blob_sha256", "BLOB_HASH_MISMATCH")
    bad_size = dataclasses.replace(put(blob=b"abc"), stated_size_bytes=4)
    with pytest.raises(InvalidField) as err:
        registry.put(bad_size, T0)
    assert err.value.field == "record.blob_size_bytes"


def test_blob_size_limit(tmp_path):
    reg = EvidenceRegistry(MemoryRecordStore(), MemoryBlobStore(), RegistryLimits(max_blob_bytes=4))
    with pytest.raises(InvalidField) as err:
        reg.put(put(blob=b"12345"), T0)
    assert (err.value.field, err.value.reason) == ("blob", "BLOB_TOO_LARGE")


def test_get_missing_is_not_found(registry):
    with pytest.raises(RecordNotFound):
        registry.get("nope")


def test_list_filters_and_pages(registry):
    ids = []
    for index in range(7):
        kind = RecordType.MEASUREMENT if index % 2 == 0 else RecordType.ROUTE
        ids.append((kind, registry.put(put(blob=b"%d" % index, type=kind), T0).record_id))
    registry.put(put(blob=b"phys", record_content=physical()), T0)
    registry.revoke(RevokeCommand(ids[0][1], "superseded"))

    seen, after = [], 0
    while True:
        page = registry.list(ListQuery(type=RecordType.MEASUREMENT, page_size=2, after_seq=after))
        seen.extend(page.records)
        after = page.next_after_seq
        if not after:
            break
    expected = [rid for kind, rid in ids if kind is RecordType.MEASUREMENT]
    assert [r.record_id for r in seen][:len(expected)] == expected
    assert len(seen) == len(expected) + 1  # plus the physical measurement
    active = registry.list(ListQuery(type=RecordType.MEASUREMENT, status=RecordStatus.ACTIVE)).records
    assert ids[0][1] not in {r.record_id for r in active}
    physical_only = registry.list(ListQuery(evidence_class=EvidenceClass.PHYSICAL)).records
    assert [r.content.evidence_class for r in physical_only] == [EvidenceClass.PHYSICAL]


def test_negative_page_size_is_rejected(registry):
    with pytest.raises(InvalidField) as err:
        registry.list(ListQuery(page_size=-1))
    assert err.value.field == "page_size"


def test_revoke_is_idempotent_and_keeps_first_reason(registry):
    record = registry.put(put(), T0)
    first = registry.revoke(RevokeCommand(record.record_id, "bad cable"))
    second = registry.revoke(RevokeCommand(record.record_id, "other"))
    assert first.status is RecordStatus.REVOKED
    assert second == first
    assert second.revocation_reason == "bad cable"
    with pytest.raises(RecordNotFound):
        registry.revoke(RevokeCommand("missing", "x"))


def test_resolve_ok(registry):
    record = registry.put(put(validity=window(T0 - 10, T0 + 10)), T0)
    resolution = resolve(registry, record.record_id, sha=record.blob.sha256_hex)
    assert resolution.ok, resolution.detail
    assert resolution.record == record


def test_resolve_not_found(registry):
    assert resolve(registry, "ghost").reason is ResolutionReason.NOT_FOUND


def test_resolve_revoked(registry):
    record = registry.put(put(), T0)
    registry.revoke(RevokeCommand(record.record_id, "superseded"))
    resolution = resolve(registry, record.record_id)
    assert resolution.reason is ResolutionReason.REVOKED
    assert "superseded" in resolution.detail


def test_resolve_expired_and_not_yet_valid(registry):
    record = registry.put(put(validity=window(T0, T0 + 100)), T0)
    assert resolve(registry, record.record_id, at=T0 + 100).reason is ResolutionReason.EXPIRED
    assert resolve(registry, record.record_id, at=T0 - 1).reason is ResolutionReason.NOT_YET_VALID
    assert resolve(registry, record.record_id, at=T0).ok
    assert resolve(registry, record.record_id, at=T0 + 99).ok


def test_resolve_wrong_type(registry):
    record = registry.put(put(type=RecordType.ROUTE), T0)
    resolution = resolve(registry, record.record_id, expected_type=RecordType.CAPABILITY)
    assert resolution.reason is ResolutionReason.WRONG_TYPE


def test_resolve_hash_mismatch_with_callers_expectation(registry):
    record = registry.put(put(), T0)
    assert resolve(registry, record.record_id, sha="f" * 64).reason is ResolutionReason.HASH_MISMATCH


def test_resolve_tampered_and_missing_blob(registry):
    record = registry.put(put(blob=b"honest"), T0)
    tamper(registry, record.blob.sha256_hex, b"forged")
    resolution = resolve(registry, record.record_id)
    assert resolution.reason is ResolutionReason.BLOB_MISMATCH
    assert sha256_hex(b"forged") in resolution.detail
    with pytest.raises(BlobDamaged) as err:
        registry.get(record.record_id, include_blob=True)
    assert err.value.reason == "BLOB_MISMATCH"
    assert registry.get(record.record_id)[0] == record
    tamper(registry, record.blob.sha256_hex, None)
    assert resolve(registry, record.record_id).reason is ResolutionReason.BLOB_MISSING
    with pytest.raises(BlobDamaged) as err:
        registry.get(record.record_id, include_blob=True)
    assert err.value.reason == "BLOB_MISSING"
    # Putting the same bytes again repairs the stored copy.
    registry.put(put(blob=b"honest"), T0)
    assert resolve(registry, record.record_id).ok


def test_resolve_reports_each_record(registry):
    good = registry.put(put(blob=b"g"), T0)
    bad = registry.put(put(blob=b"b"), T0)
    registry.revoke(RevokeCommand(bad.record_id, "x"))
    outcome = registry.resolve((Expectation(good.record_id, RecordType.MEASUREMENT),
                                Expectation(bad.record_id, RecordType.MEASUREMENT),
                                Expectation("gone", RecordType.MODEL)), T0)
    assert not outcome.all_ok
    assert [(r.record_id, r.reason) for r in outcome.failures] == [
        (bad.record_id, ResolutionReason.REVOKED), ("gone", ResolutionReason.NOT_FOUND)]


def test_resolve_needs_expectations(registry):
    with pytest.raises(InvalidField) as err:
        registry.resolve((), T0)
    assert err.value.field == "expectations"
    with pytest.raises(InvalidField) as err:
        registry.resolve((Expectation("", RecordType.MODEL),), T0)
    assert err.value.field == "expectations[0].record_id"


def test_record_ids_cover_the_stored_name_of_the_layer_range_end():
    """Record ids and signatures hash `layer_end_exclusive`, the name records were stored under."""
    record = physical()
    assert b'"layer_range":{"layer_end_exclusive":4,"layer_start":0}' in canonical_content(record)
    assert derive_record_id(record, "ab" * 32) == "measurement-0abcc3bd2a294994dfd858bb90e55561"
