"""Fetches the newest profile and calibration records from the evidence registry.

Thin I/O around a pure choice: among active records, the newest stage profile per host, link
profile per (from, to) and calibration per route key (a max host's newest per block-format
activations mode: the planner takes the one its node runs). Expired records are kept (the planner
names them in a refusal); revoked ones are not listed. Label conventions: `libs.profiles.schema`.
"""

from __future__ import annotations

from collections.abc import Iterable

from libs.profiles import schema
from services.evidence_registry.client import ClientOptions, RegistryClient
from services.evidence_registry.domain import Record, RecordStatus, RecordType
from services.planner.profiles import ProfileRecordInput


def subject_of(record: Record) -> str | None:
    """What a record profiles ("stage:<host>", a max host's "stage:<host>@<activations>",
    "link:<a>-><b>", "calibration:<key>", a profile's "serving-window:<key>", which a later gate of
    the route does not shadow), None if not a profile."""
    labels = dict(record.content.labels)
    if record.content.type is RecordType.CALIBRATION and labels.get(schema.LABEL_ROUTE_KEY):
        kind = "calibration" if labels.get(schema.LABEL_PURPOSE, schema.GATE) == schema.GATE else schema.SERVING_WINDOW
        return f"{kind}:{labels[schema.LABEL_ROUTE_KEY]}"
    if record.content.type is not RecordType.MEASUREMENT:
        return None
    if labels.get(schema.LABEL_PROFILE) == "stage" and labels.get(schema.LABEL_HOST):
        return f"stage:{labels[schema.LABEL_HOST]}" + _activations_subject(labels)
    if labels.get(schema.LABEL_PROFILE) == "link" and labels.get(schema.LABEL_FROM_HOST):
        return f"link:{labels[schema.LABEL_FROM_HOST]}->{labels.get(schema.LABEL_TO_HOST, '')}"
    return None


def _activations_subject(labels: dict[str, str]) -> str:
    """A max stage profile's mode (unlabelled: int8, as every max profile before the label timed):
    a profile of one mode does not shadow the host's newest of the other."""
    if labels.get(schema.LABEL_BACKEND) != schema.MAX_BACKEND:
        return ""
    return f"@{labels.get(schema.LABEL_MAX_ACTIVATIONS) or schema.DEFAULT_MAX_ACTIVATIONS}"


def newest_per_subject(records: Iterable[Record]) -> list[Record]:
    newest: dict[str, Record] = {}
    for record in records:
        subject = subject_of(record)
        if subject is None or record.status is not RecordStatus.ACTIVE:
            continue
        held = newest.get(subject)
        if held is None or record.created_unix_ns > held.created_unix_ns:
            newest[subject] = record
    return [newest[k] for k in sorted(newest)]


def fetch_profile_records(address: str, options: ClientOptions = ClientOptions()) -> list[ProfileRecordInput]:
    """Blocking: the CLI calls it directly, the orchestrator from a worker thread."""
    with RegistryClient(address, options) as client:
        listed = [r for kind in (RecordType.MEASUREMENT, RecordType.CALIBRATION)
                  for r in client.iter_records(type=kind, status=RecordStatus.ACTIVE)]
        out = []
        for record in newest_per_subject(listed):
            _, blob = client.get_record(record.record_id, include_blob=True)
            out.append(ProfileRecordInput(record.record_id, record.content.type.value, blob or b"",
                                          record.content.labels, record.content.evidence_class.value))
    return out
