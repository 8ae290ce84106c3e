"""The placement benchmark reads a stopped fleet's stored profiles through the registry's own API:
the newest active record per subject, a damaged blob refused, a missing store named."""

from __future__ import annotations

import pytest

from apps.bench.stored_profiles import NoStoredProfiles, registry_dir, stored_profile_records
from libs.profiles.schema import Figure, HostFacts, LayerKindProfile, LinkProfile, StageProfile
from services.evidence_registry.blobs import DiskBlobStore
from services.evidence_registry.domain import PutCommand, RevokeCommand
from services.evidence_registry.profile_records import link_profile_record, stage_profile_record
from services.evidence_registry.registry import EvidenceRegistry
from services.evidence_registry.sqlite_store import SqliteRecordStore

NS = 10**9


def _stage(host: str, measured_s: int) -> StageProfile:
    dense = LayerKindProfile("dense", {16: Figure.of([1e-4, 2e-4, 1.5e-4], "s/token")},
                             {1: Figure.of([3e-3, 4e-3, 5e-3], "s/microbatch")}, 1024, 192)
    return StageProfile(HostFacts(host, "AMD EPYC", 0.5, "1", 3 << 30), f"spiffe://fornax/stage/{host}", "numpy",
                        "numpy 2.4", "cpu", "sha256:" + "a" * 64, "fp32", 512, 32, (dense,),
                        "fornax profile --runs 3", measured_s * NS, 3600)


def _store(state, host: str = "alpha") -> EvidenceRegistry:
    root = registry_dir(state, host)
    return EvidenceRegistry(SqliteRecordStore(root / "registry.db"), DiskBlobStore(root / "blobs"))


def _put(registry: EvidenceRegistry, made: tuple, record_id: str, at_s: int) -> None:
    content, blob = made
    registry.put(PutCommand(content, blob, record_id=record_id), at_s * NS)


def test_the_newest_active_record_of_each_subject_is_read(tmp_path):
    registry = _store(tmp_path)
    _put(registry, stage_profile_record(_stage("beta", 1000), (0, 2), "hidden 64"), "old", 1000)
    _put(registry, stage_profile_record(_stage("beta", 2000), (0, 2), "hidden 64"), "new", 2000)
    _put(registry, stage_profile_record(_stage("beta", 3000), (0, 2), "hidden 64"), "revoked", 3000)
    registry.revoke(RevokeCommand("revoked", "test"))
    link = LinkProfile("alpha", "beta", Figure.of([1e-3, 2e-3, 3e-3], "s"), Figure.of([1e8, 1.1e8, 1.2e8], "B/s"),
                       "fnx2+tls", "fornax profile", 1000 * NS, 3600)
    _put(registry, link_profile_record(link, "alpha host", "fnx2 2.0", "8 rows"), "ab", 1000)
    registry.records.close()

    records = stored_profile_records(tmp_path, "alpha")

    assert sorted(r.record_id for r in records) == ["ab", "new"]
    new = next(r for r in records if r.record_id == "new")
    assert new.blob == stage_profile_record(_stage("beta", 2000), (0, 2), "hidden 64")[1]
    assert dict(new.labels)["profile"] == "stage" and new.record_type == "measurement"


def test_a_blob_that_no_longer_hashes_to_its_record_is_refused(tmp_path):
    registry = _store(tmp_path)
    _put(registry, stage_profile_record(_stage("beta", 1000), (0, 2), "hidden 64"), "only", 1000)
    stored = registry.records.get("only")
    registry.records.close()
    digest = stored.blob.sha256_hex
    (registry_dir(tmp_path, "alpha") / "blobs" / digest[:2] / digest).write_bytes(b"tampered")

    with pytest.raises(NoStoredProfiles, match="no longer hashes"):
        stored_profile_records(tmp_path, "alpha")


def test_no_store_and_no_stage_profile_each_say_to_run_fornax_profile(tmp_path):
    with pytest.raises(NoStoredProfiles, match="fornax profile"):
        stored_profile_records(tmp_path, "alpha")
    _store(tmp_path).records.close()  # an empty store
    with pytest.raises(NoStoredProfiles, match="no stage profile records"):
        stored_profile_records(tmp_path, "alpha")
