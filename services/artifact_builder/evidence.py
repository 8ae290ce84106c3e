"""The checkpoint snapshot as an evidence registry `model` record.

The record is contract-class evidence: it states content hashes, not a measurement. Its blob
is the canonical JSON of the snapshot (paths excluded), so the same snapshot always yields the
same blob and, with an empty record id, the same registry record.
"""

from __future__ import annotations

import dataclasses

from libs.artifacts.manifest import canonical_json
from libs.service.channels import ChannelConfig
from services.artifact_builder.snapshot import CheckpointSnapshot
from services.evidence_registry.domain import EvidenceClass, Provenance, RecordContent, RecordType

BLOB_SCHEMA = "fornax.checkpoint_snapshot.v1"


def snapshot_blob(snapshot: CheckpointSnapshot) -> bytes:
    document = dataclasses.asdict(snapshot)
    document.pop("checkpoint_dir")
    document["schema"] = BLOB_SCHEMA
    return canonical_json(document)


def snapshot_record(snapshot: CheckpointSnapshot) -> tuple[RecordContent, bytes]:
    labels = {"weight_dtype": snapshot.weight_dtype, "source": snapshot.source, "revision": snapshot.revision}
    content = RecordContent(
        type=RecordType.MODEL,
        evidence_class=EvidenceClass.CONTRACT,
        provenance=Provenance(model_snapshot=snapshot.snapshot_id),
        labels=tuple(sorted((k, v) for k, v in labels.items() if v)),
        subject=snapshot.snapshot_id,
    )
    return content, snapshot_blob(snapshot)


def register_snapshot(address: str, snapshot: CheckpointSnapshot, channel: ChannelConfig = ChannelConfig()) -> str:
    """Put the snapshot's model record; returns its record id (idempotent for one snapshot)."""
    from services.evidence_registry.client import ClientOptions, RegistryClient

    content, blob = snapshot_record(snapshot)
    with RegistryClient(address, ClientOptions(channel=channel)) as registry:
        return registry.put_record(content, blob).record_id
