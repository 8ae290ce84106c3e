"""Rebuild and check the public FNX2 2.0 golden vector (a contract figure)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from libs.fnx2.wire.codec import decode_frame, encode_frame
from libs.fnx2.wire.fields import canonical_sha256
from libs.fnx2.wire.leases import derive_execution_lease_id
from libs.fnx2.wire.messages import Batch, BatchDescriptor
from libs.fnx2.wire.tensor import Tensor

GOLDEN_SOURCE_STAGE = "gateway"


@dataclass(frozen=True)
class GoldenCheck:
    frame: bytes
    expected_bytes: int
    expected_sha256: str
    lease_ids_match: bool
    decoded_equal: bool

    @property
    def sha256(self) -> str:
        return "sha256:" + hashlib.sha256(self.frame).hexdigest()

    @property
    def ok(self) -> bool:
        return (len(self.frame) == self.expected_bytes and self.sha256 == self.expected_sha256
                and self.lease_ids_match and self.decoded_equal)


def manifest_hash(manifest: dict[str, Any]) -> str:
    return canonical_sha256(manifest)


def golden_batch(fixture: dict[str, Any]) -> tuple[Batch, int]:
    manifest = fixture["manifests"][0]
    prefill = fixture["prefill"]
    raw_tensor = prefill["tensor"]
    values = np.asarray(raw_tensor["values"], dtype=np.int32).reshape(raw_tensor["shape"])
    tensor = Tensor.from_array(raw_tensor["kind"], raw_tensor["dtype"], values)
    batch = Batch(
        plan_id=manifest["plan_id"],
        plan_hash=manifest["plan_hash"],
        manifest_hash=manifest_hash(manifest),
        source_stage=GOLDEN_SOURCE_STAGE,
        destination_stage=manifest["stage_id"],
        batch=BatchDescriptor.from_meta(prefill["batch"]),
        tensor=tensor,
    )
    return batch, int(prefill["wire_sequence_no"])


def check_golden(path: Path) -> GoldenCheck:
    fixture = json.loads(Path(path).read_text())
    batch, sequence_no = golden_batch(fixture)
    frame = encode_frame(batch, sequence_no).to_bytes()
    decoded = decode_frame(frame, allow_extensions=False)
    same = (decoded.sequence_no == sequence_no and isinstance(decoded.message, Batch)
            and decoded.message.batch == batch.batch
            and np.array_equal(decoded.message.tensor.array, batch.tensor.array)
            and decoded.message.manifest_hash == batch.manifest_hash)
    manifest = fixture["manifests"][0]
    leases_ok = all(
        derive_execution_lease_id(fixture["plan_generation_id"], manifest["plan_id"],
                                  manifest["plan_hash"], item["request_id"])
        == item["execution_lease_id"]
        for item in [*fixture["requests"], *prefill_sequences(fixture)]
    )
    wire = fixture["expected"]["wire"]
    return GoldenCheck(frame, int(wire["bytes"]), wire["sha256"], leases_ok, same)


def prefill_sequences(fixture: dict[str, Any]) -> list[dict[str, Any]]:
    return list(fixture["prefill"]["batch"]["sequences"])
