"""The profile records `fornax profile` left in a fleet's registry, read from its store on disk.

`fornax profile` puts every signed stage and link profile into the registry of the fleet under
`--state-dir` (`<state>/hosts/<control host>/evidence_registry`); that registry validated each
record and its blob when it accepted them. The placement benchmark runs its own short-lived
fleet, so it reads those records straight from the store (the registry's own SQLite and blob
classes), the newest active record per subject, exactly as the planner's fetch selects them.
"""

from __future__ import annotations

from pathlib import Path

from services.evidence_registry.blobs import DiskBlobStore
from services.evidence_registry.domain import ListQuery, Record, RecordType
from services.evidence_registry.sqlite_store import SqliteRecordStore
from services.planner.profile_source import newest_per_subject
from services.planner.profiles import ProfileRecordInput


class NoStoredProfiles(RuntimeError):
    """No registry store, or no profile records in it."""


def registry_dir(state_dir: Path, control_host: str) -> Path:
    return Path(state_dir) / "hosts" / control_host / "evidence_registry"


def stored_records(state_dir: Path, control_host: str) -> list[ProfileRecordInput] | None:
    """The newest active profile and calibration record per subject; None when the fleet has no
    registry store. A record whose blob is missing is an error, never skipped."""
    root = registry_dir(state_dir, control_host)
    db = root / "registry.db"
    if not db.is_file():
        return None
    store, blobs = SqliteRecordStore(db), DiskBlobStore(root / "blobs")
    listed: list[Record] = []
    for kind in (RecordType.MEASUREMENT, RecordType.CALIBRATION):
        after = 0
        while True:
            page = store.list(ListQuery(type=kind, after_seq=after))
            listed += page.records
            if not page.next_after_seq:
                break
            after = page.next_after_seq
    out = []
    for record in newest_per_subject(listed):
        blob = blobs.read(record.blob.sha256_hex)
        if blob is None:
            raise NoStoredProfiles(f"record {record.record_id}'s blob is missing from {root / 'blobs'}")
        out.append(ProfileRecordInput(record.record_id, record.content.type.value, blob, record.content.labels,
                                      record.content.evidence_class.value))
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
