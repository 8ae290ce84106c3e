"""Small builders for evidence-registry tests."""

from __future__ import annotations

import dataclasses

from libs.common.kinds import DType
from services.evidence_registry.domain import (
    EvidenceClass,
    LayerRange,
    Provenance,
    PutCommand,
    RecordContent,
    RecordType,
    ValidityWindow,
)

T0 = 1_700_000_000_000_000_000

PHYSICAL_PROVENANCE = Provenance(
    hardware="2x Xeon 8480, 512 GiB",
    backend_build="max 26.7.0",
    model_snapshot="sha256:" + "ab" * 32,
    command="fornax bench stage --layers 0:4",
    layer_range=LayerRange(0, 4),
    dtype=DType.BF16,
    shapes="[8, 2048]",
)


def content(
    type: RecordType = RecordType.MEASUREMENT,
    evidence_class: EvidenceClass = EvidenceClass.REFERENCE,
    **changes,
) -> RecordContent:
    base = RecordContent(type=type, evidence_class=evidence_class, subject="node-a",
                         labels=(("node", "a"),))
    return dataclasses.replace(base, **changes)


def physical(type: RecordType = RecordType.MEASUREMENT, **changes) -> RecordContent:
    changes.setdefault("provenance", PHYSICAL_PROVENANCE)
    return content(type, EvidenceClass.PHYSICAL, **changes)


def put(blob: bytes = b"tokens_per_s=41.5", record_id: str = "", request_id: str = "",
        record_content: RecordContent | None = None, **content_changes) -> PutCommand:
    return PutCommand(content=record_content or content(**content_changes), blob=blob,
                      record_id=record_id, request_id=request_id)


def window(start: int, end: int) -> ValidityWindow:
    return ValidityWindow(start, end)
