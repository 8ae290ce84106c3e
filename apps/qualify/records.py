"""The gate's registry records: one measurement per run, the route's calibration (the shared
schema's `Calibration`) and the qualification verdict, each physical and signed by a fleet
identity. Building the contents is pure; `put_signed` signs and stores them."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from apps.qualify.gate import RunOutcome, Verdict
from libs.common.kinds import DType
from libs.profiles import schema
from libs.security.identity import Identity
from libs.security.store import CertStore
from services.evidence_registry.blobs import sha256_hex
from services.evidence_registry.client import RegistryClient
from services.evidence_registry.domain import (
    EvidenceClass,
    LayerRange,
    Provenance,
    Record,
    RecordContent,
    RecordType,
    ValidityWindow,
)
from services.evidence_registry.signatures import sign_content

QUALIFICATION_SCHEMA = "fornax.qualification/1"
RUN_MEASUREMENT_SCHEMA = "fornax.qualify-run/1"
LABEL_QUALIFY_RUN = "qualify_run"


@dataclass(frozen=True)
class MeasuredOn:
    """Provenance shared by every record of one qualification."""

    hardware: str  # every host: CPU model, quota, cpuset, memory limit
    backend_build: str  # every stage's backend build, in stage order
    model_snapshot: str
    command: str
    measured_unix_ns: int
    valid_for_s: int
    layer_range: LayerRange  # every layer of the route
    dtype: DType  # of the boundary activations
    shapes: str  # prompts, decode rows per microbatch, hidden size

    def provenance(self) -> Provenance:
        return Provenance(hardware=self.hardware, backend_build=self.backend_build,
                          model_snapshot=self.model_snapshot, command=self.command, layer_range=self.layer_range,
                          dtype=self.dtype, shapes=self.shapes)

    def validity(self) -> ValidityWindow:
        return ValidityWindow(self.measured_unix_ns, self.measured_unix_ns + self.valid_for_s * 10**9)


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _labels(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """Sorted by key, as the registry stores them: the signature covers this order."""
    return tuple(sorted(labels.items()))


def run_measurement(outcome: RunOutcome, route_key: str, on: MeasuredOn) -> tuple[RecordContent, bytes]:
    blob = _json({"schema": RUN_MEASUREMENT_SCHEMA, "route_key": route_key, **asdict(outcome)})
    content = RecordContent(
        type=RecordType.MEASUREMENT, evidence_class=EvidenceClass.PHYSICAL, validity=on.validity(),
        provenance=on.provenance(),
        labels=_labels({LABEL_QUALIFY_RUN: str(outcome.run), schema.LABEL_ROUTE_KEY: route_key}),
        subject=f"qualify-run:{route_key}#{outcome.run}")
    return content, blob


def calibration_record(verdict: Verdict, on: MeasuredOn) -> tuple[RecordContent, bytes]:
    c = verdict.calibration
    content = RecordContent(
        type=RecordType.CALIBRATION, evidence_class=EvidenceClass.PHYSICAL, validity=on.validity(),
        provenance=on.provenance(),
        labels=_labels({schema.LABEL_ROUTE_KEY: c.route_key, schema.LABEL_PURPOSE: c.purpose,
                        schema.LABEL_PASSED: str(c.passed and c.purpose == schema.GATE).lower()}),
        subject=f"{'calibration' if c.purpose == schema.GATE else c.purpose}:{c.route_key}")
    return content, schema.to_json(c)


def qualification_record(artifact: dict, verdict: Verdict, on: MeasuredOn) -> tuple[RecordContent, bytes]:
    c = verdict.calibration
    blob = _json({"schema": QUALIFICATION_SCHEMA, **artifact})
    content = RecordContent(
        type=RecordType.QUALIFICATION, evidence_class=EvidenceClass.PHYSICAL, validity=on.validity(),
        provenance=on.provenance(),
        labels=_labels({schema.LABEL_ROUTE_KEY: c.route_key, schema.LABEL_PASSED: str(c.passed).lower()}),
        subject=f"qualification:{c.route_key}")
    return content, blob


def put_signed(client: RegistryClient, contents: list[tuple[RecordContent, bytes]], signer: Identity,
               state_dir: Path) -> list[Record]:
    """Signs each record as `signer` (its certificate and key from the fleet's store) and puts it."""
    material = CertStore(state_dir).paths_for(signer).read()
    if material.cert_pem is None or material.key_pem is None:
        raise FileNotFoundError(f"no certificate and key for {signer.uri} under {state_dir}")
    return [client.put_record(sign_content(content, sha256_hex(blob), signer, material.cert_pem, material.key_pem),
                              blob) for content, blob in contents]
