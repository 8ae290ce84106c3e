"""`fornax bench … --record`: the report lands in a real registry as a signed physical measurement."""

from __future__ import annotations

import datetime as dt
import hashlib
import json

import pytest

from apps.cli.main import main
from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from libs.security.identity import Identity, Role
from services.evidence_registry.blobs import sha256_hex
from services.evidence_registry.client import RegistryClient
from services.evidence_registry.domain import EvidenceClass, RecordType
from services.evidence_registry.signatures import verify_content
from tests.integration.evidence_registry.harness import evidence_pki, start_registry

pytestmark = pytest.mark.integration

SIGNER = Identity(Role.HOST, "bench-host")


@pytest.fixture
def registry(tmp_path):
    proc, address = start_registry(tmp_path / "registry-data", tmp_path / "registry-run")
    try:
        yield address, tmp_path / "pki"
    finally:
        proc.stop()


def _stage_bench(checkpoint, address, state_dir, *extra):
    return main(["bench", "stage", "--checkpoint", str(checkpoint), "--backends", "numpy", "--layers", "1",
                 "--repeats", "1", "--record", "--registry", address, "--state-dir", str(state_dir), *extra])


def test_record_stores_a_verifiable_signed_measurement_holding_every_figure(tmp_path, registry, capsys):
    address, state_dir = registry
    store = evidence_pki(tmp_path / "registry-data")
    store.ensure(SIGNER, dt.datetime.now(dt.UTC))
    checkpoint = write_checkpoint(CheckpointRequest("tiny", tmp_path / "tiny", seed=1)).out_dir

    assert _stage_bench(checkpoint, address, state_dir, "--sign-as", "host/bench-host") == 0
    out = capsys.readouterr()
    printed = json.loads(out.out)
    record_id = out.err.split("recorded ", 1)[1].split()[0]

    with RegistryClient(address) as client:
        record, blob = client.get_record(record_id, include_blob=True)
    content = record.content
    assert content.type is RecordType.MEASUREMENT and content.evidence_class is EvidenceClass.PHYSICAL
    assert verify_content(content, sha256_hex(blob), store.ca_cert.read_bytes(),
                          dt.datetime.now(dt.UTC)) == SIGNER
    stored = json.loads(blob)
    assert stored["figures"] == printed  # every figure the bench printed, unchanged
    config_sha = hashlib.sha256((checkpoint / "config.json").read_bytes()).hexdigest()
    provenance = content.provenance
    assert provenance.model_snapshot == f"sha256:{config_sha}" == stored["model_snapshot"]
    assert "quota:" in provenance.hardware and "cgroup cpu.max" in provenance.hardware
    assert provenance.backend_build.startswith("numpy ")
    assert provenance.command.startswith("fornax bench stage --checkpoint ") and "--record" in provenance.command
    assert "layers=1" in provenance.shapes and "repeats=1" in provenance.shapes
    assert provenance.layer_range is not None and provenance.layer_range.layer_start == 0
    assert dict(content.labels)["bench"] == "stage"


def test_record_without_a_signing_certificate_fails_closed_and_stores_nothing(tmp_path, registry, capsys):
    address, state_dir = registry
    checkpoint = write_checkpoint(CheckpointRequest("tiny", tmp_path / "tiny", seed=1)).out_dir

    assert _stage_bench(checkpoint, address, state_dir, "--sign-as", "host/nobody") == 2
    assert "NO_SIGNING_IDENTITY" in capsys.readouterr().err
    with RegistryClient(address) as client:
        assert list(client.iter_records()) == []
