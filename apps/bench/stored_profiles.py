"""The profile records `fornax profile` left in a fleet's registry, read from its store on disk.

`fornax profile` puts every signed stage and link profile into the registry of the fleet under
`--state-dir` (`<state>/hosts/<control host>/evidence_registry`); that registry validated each
record and its blob when it accepted them.

Why not the registry's client: when the placement benchmark runs, no registry service holds
those records. The fleet `fornax profile` ran is gone, and the benchmark starts its own
short-lived fleet in a scratch state directory, whose registry is empty. So it opens the stored
registry in this process, read only, through the registry's own API (`EvidenceRegistry.list` and
`.get`, the code behind ListRecords and GetRecord: a blob comes back only if it still hashes to
its record's digest), and picks the newest active record per subject exactly as the planner's
fetch over the channel does (`newest_per_subject`). It never opens the store for serving, which
would sweep its blobs.
"""

from __future__ import annotations

from pathlib import Path

from services.evidence_registry.blobs import DiskBlobStore
from services.evidence_registry.domain import ListQuery, Record, RecordStatus, RecordType
from services.evidence_registry.errors import BlobDamaged
from services.evidence_registry.registry import EvidenceRegistry
from services.evidence_registry.sqlite_store import SqliteRecordStore
from services.planner.profile_source import newest_per_subject
from services.planner.profiles import ProfileRecordInput


class NoStoredProfiles(RuntimeError):
    """No registry store, or no profile records in it, or a record whose blob is damaged."""


def registry_dir(state_dir: Path, control_host: str) -> Path:
    return Path(state_dir) / "hosts" / control_host / "evidence_registry"


def _active_records(registry: EvidenceRegistry, kind: RecordType) -> list[Record]:
    listed: list[Record] = []
    after = 0
    while True:
        page = registry.list(ListQuery(type=kind, status=RecordStatus.ACTIVE, after_seq=after))
        listed += page.records
        if not page.next_after_seq:
            return listed
        after = page.next_after_seq


def stored_records(state_dir: Path, control_host: str) -> list[ProfileRecordInput] | None:
    """The newest active profile and calibration record per subject; None when the fleet has no
    registry store. A record whose blob is missing or damaged is an error, never skipped."""
    root = registry_dir(state_dir, control_host)
    db = root / "registry.db"
    if not db.is_file():
        return None
    registry = EvidenceRegistry(SqliteRecordStore(db), DiskBlobStore(root / "blobs"))
    try:
        listed = [r for kind in (RecordType.MEASUREMENT, RecordType.CALIBRATION)
                  for r in _active_records(registry, kind)]
        out = []
        for record in newest_per_subject(listed):
            try:
                _, blob = registry.get(record.record_id, include_blob=True)
            except BlobDamaged as exc:
                raise NoStoredProfiles(f"{exc} (store {root})") from exc
            out.append(ProfileRecordInput(record.record_id, record.content.type.value, blob or b"",
                                          record.content.labels, record.content.evidence_class.value))
    finally:
        registry.records.close()
    return out


def stored_profile_records(state_dir: Path, control_host: str) -> list[ProfileRecordInput]:
    out = stored_records(state_dir, control_host)
    db = registry_dir(state_dir, control_host) / "registry.db"
    if out is None:
        raise NoStoredProfiles(f"no registry store at {db}: run `fornax profile --fleet FILE --checkpoint DIR "
                               f"--state-dir {state_dir}` first")
    if not any(dict(r.labels).get("profile") == "stage" for r in out):
        raise NoStoredProfiles(f"no stage profile records in {db}: run `fornax profile` on this fleet first")
    return out
