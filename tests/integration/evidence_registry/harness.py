"""A real evidence-registry process for integration tests (also used by other services' tests).

    with running_registry(tmp_path) as address:
        with RegistryClient(address) as client:
            record = client.put_record(content, blob)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.procs import ServiceProc

MODULE = "services.evidence_registry"


def start_registry(data: Path, workdir: Path) -> tuple[ServiceProc, str]:
    """Starts a registry over `data` (database + blobs) and waits until it is SERVING."""
    workdir.mkdir(parents=True, exist_ok=True)
    proc = ServiceProc(MODULE, workdir, env={
        "FORNAX_REGISTRY_DB": str(data / "registry.db"),
        "FORNAX_REGISTRY_BLOB_DIR": str(data / "blobs"),
        "FORNAX_GRACE_PERIOD_S": "2",
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
