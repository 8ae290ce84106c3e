"""The latest valid stage and link profiles in the evidence registry, for planning from evidence.

Only active, physical measurement records inside their validity window count (the registry
verified each one's signature when it was put). Per host the newest stage profile of the model
snapshot wins; per ordered host pair the newest link profile. `select_latest` is the pure part.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import NamedTuple, Protocol

from libs.profiles.schema import (
    LABEL_FROM_HOST,
    LABEL_HOST,
    LABEL_PROFILE,
    LABEL_TO_HOST,
    LinkProfile,
    StageProfile,
    link_profile_from_json,
    stage_profile_from_json,
)
from services.evidence_registry.domain import EvidenceClass, Record, RecordStatus, RecordType
from services.evidence_registry.profile_records import LABEL_SNAPSHOT


class RecordSource(Protocol):
    """What `latest_profiles` needs of a registry client (services.evidence_registry.client)."""

    def iter_records(self, **filters) -> Iterable[Record]: ...

    def get_record(self, record_id: str, include_blob: bool = False) -> tuple[Record, bytes | None]: ...


class Profiles(NamedTuple):
    stages: dict[str, StageProfile]  # host -> its newest stage profile of the snapshot
    links: dict[tuple[str, str], LinkProfile]  # (from_host, to_host) -> newest link profile
    record_ids: dict[str, str]  # record subject ("stage-profile:<host>", "link-profile:<a>-><b>") -> record id


def _valid_at(record: Record, now_ns: int) -> bool:
    window = record.content.validity
    return (record.status is RecordStatus.ACTIVE and record.content.evidence_class is EvidenceClass.PHYSICAL
            and record.content.type is RecordType.MEASUREMENT
            and (not window.valid_from_unix_ns or window.valid_from_unix_ns <= now_ns)
            and (not window.valid_until_unix_ns or now_ns < window.valid_until_unix_ns))


def select_latest(records: Iterable[Record], model_snapshot: str, now_ns: int) -> tuple[dict[str, Record],
                                                                                       dict[tuple[str, str], Record]]:
    """Newest valid stage record per host (of this snapshot) and link record per host pair."""
    stages: dict[str, Record] = {}
    links: dict[tuple[str, str], Record] = {}
    for record in records:
        if not _valid_at(record, now_ns):
            continue
        labels = dict(record.content.labels)
        kind = labels.get(LABEL_PROFILE)
        if kind == "stage" and labels.get(LABEL_SNAPSHOT) == model_snapshot and labels.get(LABEL_HOST):
            _keep_newest(stages, labels[LABEL_HOST], record)
        elif kind == "link" and labels.get(LABEL_FROM_HOST) and labels.get(LABEL_TO_HOST):
            _keep_newest(links, (labels[LABEL_FROM_HOST], labels[LABEL_TO_HOST]), record)
    return stages, links


def _keep_newest(table: dict, key, record: Record) -> None:
    held = table.get(key)
    newest = (record.content.validity.valid_from_unix_ns, record.created_unix_ns)
    if held is None or newest > (held.content.validity.valid_from_unix_ns, held.created_unix_ns):
        table[key] = record


def latest_profiles(registry: RecordSource, model_snapshot: str, now_unix_ns: int | None = None) -> Profiles:
    """The newest valid profiles in `registry` (a RegistryClient): stage profiles of
    `model_snapshot` by host, link profiles by (from_host, to_host), and their record ids."""
    now = time.time_ns() if now_unix_ns is None else now_unix_ns
    records = registry.iter_records(type=RecordType.MEASUREMENT, evidence_class=EvidenceClass.PHYSICAL,
                                    status=RecordStatus.ACTIVE)
    stage_records, link_records = select_latest(records, model_snapshot, now)
    ids: dict[str, str] = {}
    stages = {host: stage_profile_from_json(_blob(registry, r, ids)) for host, r in stage_records.items()}
    links = {pair: link_profile_from_json(_blob(registry, r, ids)) for pair, r in link_records.items()}
    return Profiles(stages, links, ids)


def by_worker(stages: dict[str, StageProfile]) -> dict[str, StageProfile]:
    """Stage profiles keyed by the measuring worker's fleet identity (GetCapabilities.identity)."""
    return {profile.worker: profile for profile in stages.values()}


def _blob(registry: RecordSource, record: Record, ids: dict[str, str]) -> bytes:
    _, blob = registry.get_record(record.record_id, include_blob=True)
    if blob is None:
        raise LookupError(f"record {record.record_id} came back without its blob")
    ids[record.content.subject] = record.record_id
    return blob
