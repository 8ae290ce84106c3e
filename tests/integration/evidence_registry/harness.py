"""A real evidence-registry process for integration tests (also used by other services' tests).

    with running_registry(tmp_path) as address:
        with RegistryClient(address) as client:
            record = client.put_record(content, blob)
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from libs.security.identity import Identity, Role
from libs.security.store import CertStore
from services.evidence_registry.blobs import sha256_hex
from services.evidence_registry.domain import RecordContent
from services.evidence_registry.signatures import sign_content
from tests.support.procs import ServiceProc

MODULE = "services.evidence_registry"
# The host identity that "measured" the physical records these tests store.
MEASURING_HOST = Identity(Role.HOST, "bench-host")


def evidence_pki(data: Path) -> CertStore:
    """The fleet CA the registry over `data` checks physical signatures against."""
    store = CertStore(data.parent / "pki")
    if not store.has_ca():
        store.init(dt.datetime.now(dt.UTC))
    return store


def signed(data: Path, content: RecordContent, blob: bytes) -> RecordContent:
    """content signed by MEASURING_HOST, as a measuring service would sign it."""
    material = evidence_pki(data).ensure(MEASURING_HOST, dt.datetime.now(dt.UTC)).read()
    return sign_content(content, sha256_hex(blob), MEASURING_HOST, material.cert_pem, material.key_pem)


def start_registry(data: Path, workdir: Path) -> tuple[ServiceProc, str]:
    """Starts a registry over `data` (database + blobs) and waits until it is SERVING."""
    workdir.mkdir(parents=True, exist_ok=True)
    proc = ServiceProc(MODULE, workdir, env={
        "FORNAX_REGISTRY_DB": str(data / "registry.db"),
        "FORNAX_REGISTRY_BLOB_DIR": str(data / "blobs"),
        "FORNAX_GRACE_PERIOD_S": "2",
        "FORNAX_EVIDENCE_CA": str(evidence_pki(data).ca_cert),
    })
    try:
        return proc, proc.wait_serving()
    except BaseException:
        proc.stop()
        raise


@contextmanager
def running_registry(root: Path) -> Iterator[str]:
    """Yields the gRPC address of a registry storing under `root/registry-data`."""
    proc, address = start_registry(root / "registry-data", root / "registry-run")
    try:
        yield address
    finally:
        proc.stop()
