"""`fornax evidence put|get|list|revoke|resolve|verify`: talk to an evidence registry over gRPC.

The address comes from `--registry`, else from the local fleet's fleet.json. `resolve` exits 1
when any record fails to resolve (fail closed), 0 when every record resolves; errors exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime

from libs.common.kinds import DType
from libs.service.errors import FornaxError

TYPES = ("model", "capability", "measurement", "calibration", "route", "qualification")
CLASSES = ("contract", "reference", "physical")
STATUSES = ("active", "revoked")
PROVENANCE_HELP = ("provenance: a physical record needs hardware, backend build, model snapshot and command; "
                   "a physical measurement or calibration also --layers, --dtype and --shapes")


class UsageError(Exception):
    pass


def parse_instant_ns(text: str) -> int:
    """Unix nanoseconds from an integer or an ISO 8601 time with a zone (e.g. 2026-12-01T00:00:00Z)."""
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"{text!r} is neither Unix nanoseconds nor an ISO 8601 time") from None
    if moment.tzinfo is None:
        raise UsageError(f"{text!r} has no time zone; add Z or an offset")
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


def parse_labels(items: list[str]) -> tuple[tuple[str, str], ...]:
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--label {item!r} must be KEY=VALUE")
        labels[key] = value
    return tuple(sorted(labels.items()))


def parse_layers(text: str):
    from services.evidence_registry.domain import LayerRange

    start, sep, end = text.partition(":")
    if not sep or not start.isdigit() or not end.isdigit():
        raise UsageError(f"--layers {text!r} must be START:END (half-open)")
    return LayerRange(int(start), int(end))


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--registry", help="registry gRPC address (default: .fornax/fleet.json)")
    parser.add_argument("--state-dir", default=".fornax", help="where fleet.json lives")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _add_put(verbs) -> None:
    put = verbs.add_parser("put", help="store a record and its blob")
    _add_common(put)
    put.add_argument("--type", required=True, choices=TYPES)
    put.add_argument("--class", dest="evidence_class", required=True, choices=CLASSES)
    put.add_argument("--blob", required=True, help="file holding the blob, or - for stdin")
    put.add_argument("--record-id", default="", help="explicit id (default: derived from the content)")
    put.add_argument("--request-id", help="idempotency key (default: generated)")
    put.add_argument("--subject", default="")
    put.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    put.add_argument("--valid-from", help="Unix ns or ISO 8601 (default: unbounded)")
    put.add_argument("--valid-until", help="Unix ns or ISO 8601, exclusive (default: unbounded)")
    for name in ("hardware", "backend-build", "model-snapshot", "command", "shapes"):
        put.add_argument(f"--{name}", default="", help=PROVENANCE_HELP)
    put.add_argument("--layers", help="provenance layer range START:END (half-open)")
    put.add_argument("--dtype", choices=[d.value for d in DType])
    put.add_argument("--sign-as", metavar="ROLE/NAME",
                     help="sign as this measuring identity (host/..., service/..., stage/...) with its "
                          "certificate under <state dir>/certs; physical records must be signed")
    put.set_defaults(func=cmd_put)


def register(commands, benches) -> None:
    evidence = commands.add_parser("evidence", help="evidence registry records")
    verbs = evidence.add_subparsers(dest="evidence_verb", metavar="VERB", required=True)
    _add_put(verbs)
    get = verbs.add_parser("get", help="show one record")
    _add_common(get)
    get.add_argument("record_id")
    get.add_argument("--blob-out", help="also write the blob to this file")
    get.set_defaults(func=cmd_get)
    listing = verbs.add_parser("list", help="list records, filtered")
    _add_common(listing)
    listing.add_argument("--type", choices=TYPES)
    listing.add_argument("--class", dest="evidence_class", choices=CLASSES)
    listing.add_argument("--status", choices=STATUSES)
    listing.add_argument("--page-size", type=int, default=100)
    listing.set_defaults(func=cmd_list)
    revoke = verbs.add_parser("revoke", help="revoke a record")
    _add_common(revoke)
    revoke.add_argument("record_id")
    revoke.add_argument("--reason", required=True)
    revoke.set_defaults(func=cmd_revoke)
    resolve = verbs.add_parser("resolve", help="check records resolve (type, status, window, re-hash)")
    _add_common(resolve)
    resolve.add_argument("record_ids", nargs="+", metavar="RECORD_ID")
    resolve.add_argument("--type", required=True, choices=TYPES, help="the type every record must have")
    resolve.add_argument("--sha256", default="", help="expected sha256:<hex> (only with one RECORD_ID)")
    resolve.add_argument("--at", help="evaluation instant, Unix ns or ISO 8601 (default: now)")
    resolve.set_defaults(func=cmd_resolve)
    verify = verbs.add_parser("verify", help="re-check a physical record's signature against the fleet CA")
    _add_common(verify)
    verify.add_argument("record_ids", nargs="+", metavar="RECORD_ID")
    verify.add_argument("--ca", help="fleet CA certificate (default <state dir>/certs/ca.pem)")
    verify.set_defaults(func=cmd_verify)


def _client(args):
    from libs.security.cli_credentials import cli_channel
    from services.evidence_registry.client import ClientOptions, RegistryClient, address_from_fleet

    address = args.registry or address_from_fleet(args.state_dir)
    if not address:
        raise UsageError(f"no --registry given and no evidence_registry in {args.state_dir}/fleet.json")
    return RegistryClient(address, ClientOptions(channel=cli_channel(args.state_dir)))


def _run(args, action) -> int:
    try:
        with _client(args) as client:
            return action(client)
    except UsageError as exc:
        print(f"fornax evidence: {exc}", file=sys.stderr)
        return 2
    except FornaxError as exc:
        print(f"fornax evidence: {exc}", file=sys.stderr)
        return 2


def record_summary(record) -> dict:
    """The printed form of a record (output only)."""
    content, provenance = record.content, record.content.provenance
    layers = provenance.layer_range
    return {
        "record_id": record.record_id, "type": content.type.value,
        "evidence_class": content.evidence_class.value, "status": record.status.value,
        "blob_sha256": record.blob.digest, "blob_size_bytes": record.blob.size_bytes,
        "valid_from_unix_ns": content.validity.valid_from_unix_ns,
        "valid_until_unix_ns": content.validity.valid_until_unix_ns,
        "created_unix_ns": record.created_unix_ns, "subject": content.subject,
        "labels": dict(content.labels), "revocation_reason": record.revocation_reason,
        "provenance": {
            "hardware": provenance.hardware, "backend_build": provenance.backend_build,
            "model_snapshot": provenance.model_snapshot, "command": provenance.command,
            "layer_range": None if layers is None else [layers.layer_start, layers.layer_end],
            "dtype": None if provenance.dtype is None else provenance.dtype.value, "shapes": provenance.shapes,
            "measured_by": provenance.measured_by, "signed": bool(provenance.signature),
        },
    }


def _print_records(records, as_json: bool) -> None:
    if as_json:
        print(json.dumps([record_summary(r) for r in records], indent=2))
        return
    print(f"{'RECORD_ID':<44} {'TYPE':<13} {'CLASS':<9} {'STATUS':<7} {'SIZE':>9}  BLOB")
    for r in records:
        print(f"{r.record_id:<44} {r.content.type.value:<13} {r.content.evidence_class.value:<9} "
              f"{r.status.value:<7} {r.blob.size_bytes:>9}  {r.blob.digest[:23]}")


def _read_blob(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise UsageError(f"--blob {path!r}: {exc.strerror}") from None


def build_content(args):
    from services.evidence_registry.domain import EvidenceClass, Provenance, RecordContent, RecordType, ValidityWindow

    provenance = Provenance(
        hardware=args.hardware, backend_build=args.backend_build, model_snapshot=args.model_snapshot,
        command=args.command, shapes=args.shapes,
        layer_range=parse_layers(args.layers) if args.layers else None,
        dtype=DType(args.dtype) if args.dtype else None,
    )
    window = ValidityWindow(parse_instant_ns(args.valid_from) if args.valid_from else 0,
                            parse_instant_ns(args.valid_until) if args.valid_until else 0)
    return RecordContent(type=RecordType(args.type), evidence_class=EvidenceClass(args.evidence_class),
                         validity=window, provenance=provenance, labels=parse_labels(args.label),
                         subject=args.subject)


def _signed(args, content, blob: bytes):
    from libs.security.identity import Identity, IdentityError
    from libs.security.store import CertStore
    from libs.security.tls import TlsConfigError
    from services.evidence_registry.blobs import sha256_hex
    from services.evidence_registry.signatures import sign_content

    try:
        signer = Identity.parse(args.sign_as)
        material = CertStore(args.state_dir).paths_for(signer).read()
    except (IdentityError, TlsConfigError) as exc:
        raise UsageError(f"--sign-as {args.sign_as!r}: {exc}") from None
    if material.cert_pem is None or material.key_pem is None:
        raise UsageError(f"--sign-as {args.sign_as!r}: no certificate and key in {args.state_dir}")
    return sign_content(content, sha256_hex(blob), signer, material.cert_pem, material.key_pem)


def cmd_put(args) -> int:
    def action(client) -> int:
        blob, content = _read_blob(args.blob), build_content(args)
        if args.sign_as:
            content = _signed(args, content, blob)
        record = client.put_record(content, blob, record_id=args.record_id, request_id=args.request_id)
        _print_records([record], args.json)
        return 0
    return _run(args, action)


def cmd_get(args) -> int:
    def action(client) -> int:
        record, blob = client.get_record(args.record_id, include_blob=bool(args.blob_out))
        if args.blob_out:
            with open(args.blob_out, "wb") as handle:
                handle.write(blob or b"")
        print(json.dumps(record_summary(record), indent=2))
        return 0
    return _run(args, action)


def cmd_list(args) -> int:
    from services.evidence_registry.domain import EvidenceClass, RecordStatus, RecordType

    def action(client) -> int:
        records = list(client.iter_records(
            type=RecordType(args.type) if args.type else None,
            evidence_class=EvidenceClass(args.evidence_class) if args.evidence_class else None,
            status=RecordStatus(args.status) if args.status else None, page_size=args.page_size))
        _print_records(records, args.json)
        return 0
    return _run(args, action)


def cmd_revoke(args) -> int:
    def action(client) -> int:
        _print_records([client.revoke_record(args.record_id, args.reason)], args.json)
        return 0
    return _run(args, action)


def cmd_resolve(args) -> int:
    from services.evidence_registry.domain import Expectation, RecordType

    def action(client) -> int:
        if args.sha256 and len(args.record_ids) != 1:
            raise UsageError("--sha256 applies to exactly one RECORD_ID")
        sha = args.sha256.removeprefix("sha256:")
        expectations = [Expectation(rid, RecordType(args.type), sha) for rid in args.record_ids]
        outcome = client.resolve_records(expectations, parse_instant_ns(args.at) if args.at else 0)
        rows = [{"record_id": r.record_id, "ok": r.ok, "reason": r.reason.value if r.reason else "",
                 "detail": r.detail} for r in outcome.resolutions]
        if args.json:
            print(json.dumps({"all_ok": outcome.all_ok, "resolutions": rows}, indent=2))
        else:
            for row in rows:
                print(f"{row['record_id']:<44} {'OK' if row['ok'] else row['reason']:<14} {row['detail']}")
        return 0 if outcome.all_ok else 1
    return _run(args, action)


def _verify_one(client, record_id: str, ca_pem: bytes) -> dict:
    import datetime as dt

    from services.evidence_registry.blobs import sha256_hex
    from services.evidence_registry.domain import EvidenceClass
    from services.evidence_registry.signatures import verify_content

    record, blob = client.get_record(record_id, include_blob=True)
    if record.content.evidence_class is not EvidenceClass.PHYSICAL:
        return {
            "record_id": record_id,
            "ok": True,
            "reason": "",
            "detail": f"{record.content.evidence_class.value}: not signed",
        }
    if sha256_hex(blob or b"") != record.blob.sha256_hex:
        return {
            "record_id": record_id,
            "ok": False,
            "reason": "BLOB_MISMATCH",
            "detail": "blob does not hash to the record",
        }
    try:
        signer = verify_content(record.content, record.blob.sha256_hex, ca_pem, dt.datetime.now(dt.UTC))
    except FornaxError as exc:
        return {"record_id": record_id, "ok": False, "reason": exc.reason, "detail": exc.message}
    return {"record_id": record_id, "ok": True, "reason": "", "detail": f"signed by {signer.uri}"}


def cmd_verify(args) -> int:
    from pathlib import Path

    ca_path = Path(args.ca) if args.ca else Path(args.state_dir) / "certs" / "ca.pem"

    def action(client) -> int:
        try:
            ca_pem = ca_path.read_bytes()
        except OSError as exc:
            raise UsageError(f"fleet CA {ca_path}: {exc.strerror}") from None
        rows = [_verify_one(client, record_id, ca_pem) for record_id in args.record_ids]
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            for row in rows:
                print(f"{row['record_id']:<44} {'OK' if row['ok'] else row['reason']:<28} {row['detail']}")
        return 0 if all(row["ok"] for row in rows) else 1
    return _run(args, action)
