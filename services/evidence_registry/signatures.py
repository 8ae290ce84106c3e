"""Physical evidence is signed by the identity that measured it.

The payload is the record's canonical content without the signature (but with `measured_by`
and the signer's certificate), then the blob's sha256: changing any stated fact, the blob, or
the claimed signer breaks the signature. Pure apart from the clock the caller passes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from libs.security.certs import CertificateError
from libs.security.identity import Identity
from libs.security.signing import sign, verify_signature
from libs.service.errors import FailedPrecondition, PermissionDenied
from services.evidence_registry.domain import EvidenceClass, RecordContent
from services.evidence_registry.registry import canonical_content


def signing_payload(content: RecordContent, blob_sha256_hex: str) -> bytes:
    unsigned = dataclasses.replace(content, provenance=dataclasses.replace(content.provenance, signature=b""))
    return canonical_content(unsigned) + b"\0" + blob_sha256_hex.encode()


def sign_content(content: RecordContent, blob_sha256_hex: str, signer: Identity,
                 cert_pem: bytes, key_pem: bytes) -> RecordContent:
    """content with measured_by, the signer's certificate and the signature filled in."""
    claimed = dataclasses.replace(content.provenance, measured_by=signer.uri,
                                  signer_certificate_pem=cert_pem.decode(), signature=b"")
    unsigned = dataclasses.replace(content, provenance=claimed)
    signature = sign(signing_payload(unsigned, blob_sha256_hex), key_pem)
    return dataclasses.replace(unsigned, provenance=dataclasses.replace(claimed, signature=signature))


def verify_content(content: RecordContent, blob_sha256_hex: str, ca_pem: bytes, now: dt.datetime) -> Identity:
    """The signer of a physical record, or PermissionDenied with a stable reason."""
    provenance = content.provenance
    if not (provenance.signature and provenance.signer_certificate_pem and provenance.measured_by):
        raise PermissionDenied("a physical record must be signed by the identity that measured it "
                               "(provenance.measured_by, signer_certificate_pem, signature)",
                               reason="UNSIGNED_PHYSICAL_RECORD", field="record.provenance.signature")
    try:
        return verify_signature(signing_payload(content, blob_sha256_hex), provenance.signature,
                                provenance.signer_certificate_pem.encode(), ca_pem, now,
                                provenance.measured_by)
    except CertificateError as exc:
        raise PermissionDenied(str(exc), reason=f"EVIDENCE_{exc.reason}",
                               field="record.provenance.signature") from exc


class SignaturePolicy:
    """What the registry applies on put: physical records must verify against the fleet CA."""

    def __init__(self, ca_pem: bytes | None):
        self._ca_pem = ca_pem

    def __call__(self, content: RecordContent, blob_sha256_hex: str) -> None:
        if content.evidence_class is not EvidenceClass.PHYSICAL:
            return
        if self._ca_pem is None:
            raise FailedPrecondition("this registry has no fleet CA to check physical evidence against "
                                     "(set FORNAX_TLS_CA or FORNAX_EVIDENCE_CA)", reason="NO_TRUST_ANCHOR")
        verify_content(content, blob_sha256_hex, self._ca_pem, dt.datetime.now(dt.UTC))
