"""Signatures by fleet identities over evidence: ECDSA-SHA256 with the signer's leaf key,
checked against the fleet CA. Pure: the caller passes the time and the bytes."""

from __future__ import annotations

import datetime as dt

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from libs.security.certs import CertificateError, ec_public_key, load_ec_private_key, verify_leaf
from libs.security.identity import Identity, Role

# Who measures: a service, a stage worker, or a host. People and API clients do not.
SIGNER_ROLES = frozenset({Role.SERVICE, Role.STAGE, Role.HOST})


def sign(payload: bytes, key_pem: bytes) -> bytes:
    return load_ec_private_key(key_pem).sign(payload, ec.ECDSA(hashes.SHA256()))


def verify_signature(payload: bytes, signature: bytes, cert_pem: bytes, ca_pem: bytes,
                     now: dt.datetime, claimed_uri: str) -> Identity:
    """The signer if cert_pem is a fleet signer named claimed_uri and signature verifies."""
    identity = verify_leaf(cert_pem, ca_pem, now)
    if identity.uri != claimed_uri:
        raise CertificateError(f"signed by {identity.uri}, but the record names {claimed_uri or 'nobody'}",
                               "SIGNER_MISMATCH")
    if identity.role not in SIGNER_ROLES:
        raise CertificateError(f"{identity} may not sign measurements", "SIGNER_ROLE_NOT_ALLOWED")
    public_key = ec_public_key(x509.load_pem_x509_certificate(cert_pem))
    try:
        public_key.verify(signature, payload, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError) as exc:
        raise CertificateError("the signature does not match the record", "SIGNATURE_INVALID") from exc
    return identity
