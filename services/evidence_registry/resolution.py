"""Pure resolution of one expectation against what the store and a fresh re-hash say.

Checks run in a fixed order and the first failure is the reported reason: existence, type,
status, validity window, the caller's expected digest, then the freshly re-hashed blob.
"""

from __future__ import annotations

from services.evidence_registry.domain import (
    Expectation,
    Record,
    RecordStatus,
    Resolution,
    ResolutionReason,
    ValidityWindow,
)


def window_failure(window: ValidityWindow, at_unix_ns: int) -> tuple[ResolutionReason, str] | None:
    """Half-open window [from, until); 0 means unbounded on that side."""
    if window.valid_from_unix_ns and at_unix_ns < window.valid_from_unix_ns:
        return (ResolutionReason.NOT_YET_VALID,
                f"valid from {window.valid_from_unix_ns} ns, evaluated at {at_unix_ns} ns")
    if window.valid_until_unix_ns and at_unix_ns >= window.valid_until_unix_ns:
        return (ResolutionReason.EXPIRED,
                f"valid until {window.valid_until_unix_ns} ns, evaluated at {at_unix_ns} ns")
    return None


def _first_failure(
    expectation: Expectation, record: Record, fresh_sha256_hex: str | None, at_unix_ns: int,
) -> tuple[ResolutionReason, str] | None:
    if record.content.type is not expectation.expected_type:
        return (ResolutionReason.WRONG_TYPE,
                f"expected {expectation.expected_type.value}, record is {record.content.type.value}")
    if record.status is RecordStatus.REVOKED:
        return ResolutionReason.REVOKED, f"revoked: {record.revocation_reason}"
    window = window_failure(record.content.validity, at_unix_ns)
    if window is not None:
        return window
    if expectation.expected_sha256_hex and expectation.expected_sha256_hex != record.blob.sha256_hex:
        return (ResolutionReason.HASH_MISMATCH,
                f"caller expects sha256:{expectation.expected_sha256_hex}, record holds {record.blob.digest}")
    if fresh_sha256_hex is None:
        return ResolutionReason.BLOB_MISSING, f"stored blob {record.blob.digest} is missing"
    if fresh_sha256_hex != record.blob.sha256_hex:
        return (ResolutionReason.BLOB_MISMATCH,
                f"stored blob re-hashes to sha256:{fresh_sha256_hex}, record holds {record.blob.digest}")
    return None


def resolve_one(
    expectation: Expectation,
    record: Record | None,
    fresh_sha256_hex: str | None,
    at_unix_ns: int,
) -> Resolution:
    """`fresh_sha256_hex` is the digest of the stored blob bytes as re-read now (None if absent)."""
    if record is None:
        return Resolution(expectation.record_id, ResolutionReason.NOT_FOUND, "no such record")
    failure = _first_failure(expectation, record, fresh_sha256_hex, at_unix_ns)
    if failure is None:
        return Resolution(expectation.record_id, None, "", record)
    reason, detail = failure
    return Resolution(expectation.record_id, reason, detail, record)
