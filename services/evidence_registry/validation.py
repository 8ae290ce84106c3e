"""Pure input checks. Each failure names the field path and a stable reason code."""

from __future__ import annotations

import re

from services.evidence_registry.domain import (
    EvidenceClass,
    Expectation,
    PutCommand,
    RecordContent,
    RecordType,
    RevokeCommand,
)
from services.evidence_registry.errors import InvalidField

RECORD_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$")
SHA256_HEX_PATTERN = re.compile(r"^[0-9a-f]{64}$")
LABEL_KEY_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._/\-]{0,62}$")
MAX_LABELS = 64
MAX_TEXT_CHARS = 4096
MAX_EXPECTATIONS = 1024

# Provenance a physical record must name, in the order they are reported.
PHYSICAL_REQUIRED = ("hardware", "backend_build", "model_snapshot", "command")
# Physical figures of executed layers must also say which layers ran, in what dtype and shapes.
EXECUTION_TYPES = (RecordType.MEASUREMENT, RecordType.CALIBRATION)
# A link measurement (label profile=link) moves frames and executes no layers: it names a
# dtype and shapes, but no layer range.
TRANSPORT_MEASUREMENT = ("profile", "link")


def parse_sha256(field: str, value: str, *, required: bool) -> str:
    """Accepts "sha256:<hex>" (lowercase hex, 64 digits); returns the bare hex or ""."""
    if not value:
        if required:
            raise InvalidField(field, "MISSING_FIELD", "a sha256 digest is required")
        return ""
    if not value.startswith("sha256:") or not SHA256_HEX_PATTERN.match(value[7:]):
        raise InvalidField(field, "INVALID_SHA256", f"expected 'sha256:<64 lowercase hex>', got {value[:80]!r}")
    return value[7:]


def check_record_id(field: str, record_id: str, *, required: bool) -> None:
    if not record_id:
        if required:
            raise InvalidField(field, "MISSING_FIELD", "a record id is required")
        return
    if not RECORD_ID_PATTERN.match(record_id):
        raise InvalidField(
            field, "INVALID_RECORD_ID",
            f"{record_id[:80]!r} must match {RECORD_ID_PATTERN.pattern}",
        )


def check_content(content: RecordContent, prefix: str = "record") -> None:
    window = content.validity
    for name, value in (("valid_from_unix_ns", window.valid_from_unix_ns),
                        ("valid_until_unix_ns", window.valid_until_unix_ns)):
        if value < 0:
            raise InvalidField(f"{prefix}.{name}", "INVALID_VALIDITY_WINDOW", f"{value} is negative")
    if window.valid_from_unix_ns and window.valid_until_unix_ns \
            and window.valid_until_unix_ns <= window.valid_from_unix_ns:
        raise InvalidField(
            f"{prefix}.valid_until_unix_ns", "INVALID_VALIDITY_WINDOW",
            f"valid_until {window.valid_until_unix_ns} is not after valid_from {window.valid_from_unix_ns}",
        )
    _check_text(f"{prefix}.subject", content.subject)
    _check_labels(content, prefix)
    _check_provenance(content, prefix)


def _check_text(field: str, value: str) -> None:
    if len(value) > MAX_TEXT_CHARS:
        raise InvalidField(field, "TOO_LONG", f"{len(value)} characters exceeds {MAX_TEXT_CHARS}")


def _check_labels(content: RecordContent, prefix: str) -> None:
    if len(content.labels) > MAX_LABELS:
        raise InvalidField(f"{prefix}.labels", "TOO_MANY_LABELS", f"{len(content.labels)} > {MAX_LABELS}")
    for key, value in content.labels:
        if not LABEL_KEY_PATTERN.match(key):
            raise InvalidField(f"{prefix}.labels", "INVALID_LABEL_KEY",
                               f"key {key[:80]!r} must match {LABEL_KEY_PATTERN.pattern}")
        _check_text(f"{prefix}.labels[{key}]", value)


def _check_provenance(content: RecordContent, prefix: str) -> None:
    provenance = content.provenance
    for name in (*PHYSICAL_REQUIRED, "shapes"):
        _check_text(f"{prefix}.provenance.{name}", getattr(provenance, name))
    layers = provenance.layer_range
    if layers is not None and not 0 <= layers.layer_start < layers.layer_end:
        raise InvalidField(
            f"{prefix}.provenance.layer_range", "INVALID_LAYER_RANGE",
            f"[{layers.layer_start}, {layers.layer_end}) is empty or negative",
        )
    if content.evidence_class is not EvidenceClass.PHYSICAL:
        return
    for name in PHYSICAL_REQUIRED:
        if not getattr(provenance, name).strip():
            raise InvalidField(
                f"{prefix}.provenance.{name}", "MISSING_PROVENANCE",
                f"a physical record must name its {name.replace('_', ' ')}",
            )
    if content.type not in EXECUTION_TYPES:
        return
    transport = content.type is RecordType.MEASUREMENT and TRANSPORT_MEASUREMENT in content.labels
    for name, missing in (("layer_range", layers is None and not transport), ("dtype", provenance.dtype is None),
                          ("shapes", not provenance.shapes.strip())):
        if missing:
            raise InvalidField(
                f"{prefix}.provenance.{name}", "MISSING_PROVENANCE",
                f"a physical {content.type.value} record must name its {name.replace('_', ' ')}",
            )


def check_put(command: PutCommand, max_blob_bytes: int) -> None:
    check_record_id("record.record_id", command.record_id, required=False)
    _check_text("request_id", command.request_id)
    if not command.blob:
        raise InvalidField("blob", "EMPTY_BLOB", "a record must carry a non-empty blob")
    if len(command.blob) > max_blob_bytes:
        raise InvalidField("blob", "BLOB_TOO_LARGE", f"{len(command.blob)} bytes exceeds {max_blob_bytes}")
    check_content(command.content)


def check_revoke(command: RevokeCommand) -> None:
    check_record_id("record_id", command.record_id, required=True)
    if not command.reason.strip():
        raise InvalidField("reason", "MISSING_FIELD", "a revocation must state its reason")
    _check_text("reason", command.reason)
    _check_text("request_id", command.request_id)


def check_expectations(expectations: tuple[Expectation, ...]) -> None:
    if not expectations:
        raise InvalidField("expectations", "MISSING_FIELD", "at least one expectation is required")
    if len(expectations) > MAX_EXPECTATIONS:
        raise InvalidField("expectations", "TOO_MANY_EXPECTATIONS",
                           f"{len(expectations)} > {MAX_EXPECTATIONS}")
    for index, expectation in enumerate(expectations):
        check_record_id(f"expectations[{index}].record_id", expectation.record_id, required=True)
