"""`fornax bench … --record`: a bench's JSON report stored as a signed physical measurement.

Pure core: `measurement_record` turns a report and the facts of the run (host, quota, backend
build, model snapshot, command, the bench's own sizing arguments) into a registry record
(type measurement, class physical) and its blob, the canonical JSON of every figure the bench
printed. The I/O shell (`record_report`) gathers those facts on this host, signs the record with
a fleet identity's certificate from the state dir, and puts it in the evidence registry.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import socket
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from libs.common.kinds import DType
from services.evidence_registry.domain import (
    EvidenceClass,
    LayerRange,
    Provenance,
    Record,
    RecordContent,
    RecordType,
)

BLOB_SCHEMA = "fornax.bench.measurement/1"
# Arguments that steer recording or output, not the measurement: left out of the stated shapes.
NOT_SHAPES = frozenset({"func", "command", "bench", "json", "record", "sign_as", "registry", "state_dir",
                        "record_dir"})
# Which package version states each backend's build.
BACKEND_PACKAGES = {"numpy": "numpy", "max": "max", "transformers": "transformers", "torch": "torch"}


class RecordError(Exception):
    """A report that cannot be recorded; `reason` is a stable code."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class RunFacts:
    """Where and how a bench ran, as the record's provenance states it."""

    bench: str
    host: str
    hardware: str
    quota: str
    backend_build: str
    model_snapshot: str
    num_layers: int
    shapes: str
    command: str
    dtype: DType = DType.FP32


def measurement_record(report: dict[str, Any], facts: RunFacts) -> tuple[RecordContent, bytes]:
    """The unsigned physical measurement record of `report`, and its blob (every figure)."""
    if not isinstance(report, dict) or not report:
        raise RecordError("EMPTY_REPORT", f"bench {facts.bench} produced no figures to record")
    if facts.num_layers < 1:
        raise RecordError("NO_MODEL_LAYERS", f"bench {facts.bench}: the model has no layers to name")
    blob = json.dumps({"schema": BLOB_SCHEMA, "bench": facts.bench, "host": facts.host, "quota": facts.quota,
                       "backend_build": facts.backend_build, "model_snapshot": facts.model_snapshot,
                       "command": facts.command, "figures": report},
                      sort_keys=True, separators=(",", ":")).encode()
    provenance = Provenance(
        hardware=f"host {facts.host}: {facts.hardware}; quota: {facts.quota}",
        backend_build=facts.backend_build, model_snapshot=facts.model_snapshot, command=facts.command,
        layer_range=LayerRange(0, facts.num_layers), dtype=facts.dtype, shapes=facts.shapes)
    labels = tuple(sorted({"bench": facts.bench, "host": facts.host, "quota": facts.quota,
                           "blob_schema": BLOB_SCHEMA}.items()))
    content = RecordContent(type=RecordType.MEASUREMENT, evidence_class=EvidenceClass.PHYSICAL,
                            provenance=provenance, labels=labels, subject=f"fornax bench {facts.bench}")
    return content, blob


def shapes_of(args: argparse.Namespace) -> str:
    """The bench's sizing arguments (prompt length, concurrency, repeats, ...), sorted."""
    items = sorted((k, v) for k, v in vars(args).items() if k not in NOT_SHAPES and v not in (None, False))
    return "bench arguments: " + " ".join(f"{k}={v}" for k, v in items)


def backend_build_of(args: argparse.Namespace) -> str:
    names = [getattr(args, "backend", None) or "",
             *(getattr(args, "backends", None) or "").split(",")]
    parts = []
    for name in dict.fromkeys(n.strip() for n in names if n and n.strip()):
        package = BACKEND_PACKAGES.get(name)
        if package is None:
            raise RecordError("UNKNOWN_BACKEND", f"no build is known for backend {name!r}")
        parts.append(f"{name} {metadata.version(package)}")
    if not parts:
        parts.append(f"numpy {metadata.version('numpy')} (no backend argument; the serving core's default)")
    return ", ".join([*parts, f"python {platform.python_version()}"])


def checkpoint_of(args: argparse.Namespace) -> Path:
    """The checkpoint the bench ran: --checkpoint, else the preset dir it generated."""
    from apps.bench.cli import DEFAULT_CHECKPOINT

    if getattr(args, "checkpoint", None):
        return Path(args.checkpoint)
    if args.bench == "stage":
        from apps.bench.stage_layers import default_checkpoint

        return Path(default_checkpoint())
    return DEFAULT_CHECKPOINT.parent / (getattr(args, "preset", None) or "small")


def run_facts(args: argparse.Namespace, command: str) -> RunFacts:
    from libs.model.config import load_config
    from libs.service.affinity import usable_cpus
    from libs.service.host import cpu_name
    from libs.service.host_quota import quota_label

    checkpoint = checkpoint_of(args)
    config = checkpoint / "config.json"
    if not config.is_file():
        raise RecordError("NO_MODEL_SNAPSHOT",
                          f"bench {args.bench}: no checkpoint at {checkpoint} to name as the model snapshot")
    return RunFacts(
        bench=args.bench, host=socket.gethostname(),
        hardware=f"{cpu_name() or platform.machine()}, {len(usable_cpus())} usable CPUs",
        quota=quota_label(), backend_build=backend_build_of(args),
        model_snapshot="sha256:" + hashlib.sha256(config.read_bytes()).hexdigest(),
        num_layers=load_config(str(checkpoint)).num_hidden_layers, shapes=shapes_of(args), command=command)


def signer_identity(text: str | None):
    from libs.security.identity import Identity, Role

    if text:
        return Identity.parse(text)
    return Identity(Role.HOST, socket.gethostname().split(".")[0].lower())


def record_report(args: argparse.Namespace, report: dict[str, Any], command: str) -> Record:
    """Signs the report's record as the --sign-as identity and puts it in the registry."""
    from libs.security.cli_credentials import cli_channel
    from libs.security.identity import IdentityError
    from libs.security.store import CertStore
    from libs.security.tls import TlsConfigError
    from services.evidence_registry.blobs import sha256_hex
    from services.evidence_registry.client import ClientOptions, RegistryClient, address_from_fleet
    from services.evidence_registry.signatures import sign_content

    content, blob = measurement_record(report, run_facts(args, command))
    try:
        signer = signer_identity(args.sign_as)
        material = CertStore(args.state_dir).paths_for(signer).read()
    except (IdentityError, TlsConfigError) as exc:
        raise RecordError("NO_SIGNING_IDENTITY", f"--sign-as {args.sign_as!r}: {exc}") from None
    if material.cert_pem is None or material.key_pem is None:
        raise RecordError("NO_SIGNING_IDENTITY",
                          f"no certificate and key for {signer} under {args.state_dir}/certs "
                          f"(issue one: fornax certs issue {signer} --state-dir {args.state_dir})")
    signed = sign_content(content, sha256_hex(blob), signer, material.cert_pem, material.key_pem)
    address = args.registry or address_from_fleet(args.state_dir)
    if not address:
        raise RecordError("NO_REGISTRY", f"no --registry given and no evidence_registry in "
                                         f"{args.state_dir}/fleet.json")
    with RegistryClient(address, ClientOptions(channel=cli_channel(args.state_dir))) as client:
        return client.put_record(signed, blob)
