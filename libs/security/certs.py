"""Fleet CA and leaf certificates, built and checked with `cryptography`. Pure: the caller
passes the time; nothing here touches files.

Every leaf carries exactly one identity URI SAN (see `identity`), its hosts as DNS/IP SANs,
and both TLS usages: a service is a server to its callers and a client of its peers.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from libs.security.identity import Identity, IdentityError

CA_VALIDITY = dt.timedelta(days=3650)
LEAF_VALIDITY = dt.timedelta(days=90)
# Clock skew between hosts that a fresh certificate must survive.
BACKDATE = dt.timedelta(minutes=5)
DEFAULT_HOSTS = ("localhost", "127.0.0.1")


class CertificateError(ValueError):
    """A certificate that is not a valid, trusted Fornax identity."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class CertKeyPair:
    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    @property
    def private_key(self) -> ec.EllipticCurvePrivateKey:
        return load_ec_private_key(self.key_pem)


def load_ec_private_key(key_pem: bytes) -> ec.EllipticCurvePrivateKey:
    """The fleet's keys are ECDSA P-256; any other kind of key is refused."""
    key = serialization.load_pem_private_key(key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertificateError(f"expected an EC private key, got {type(key).__name__}", "UNSUPPORTED_KEY")
    return key


def ec_public_key(cert: x509.Certificate) -> ec.EllipticCurvePublicKey:
    key = cert.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise CertificateError(f"expected an EC public key, got {type(key).__name__}", "UNSUPPORTED_KEY")
    return key


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _san_for_host(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def new_ca(now: dt.datetime, common_name: str = "Fornax fleet CA") -> CertKeyPair:
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fornax"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE).not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertKeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue(ca: CertKeyPair, identity: Identity, now: dt.datetime, hosts: Sequence[str] = DEFAULT_HOSTS,
          validity: dt.timedelta = LEAF_VALIDITY) -> CertKeyPair:
    """A leaf for identity, signed by ca, valid for hosts (DNS names or IP literals)."""
    key = _new_key()
    ca_cert = ca.certificate
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fornax"),
                         x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, identity.role.value),
                         x509.NameAttribute(NameOID.COMMON_NAME, identity.name)])
    sans = [x509.UniformResourceIdentifier(identity.uri), *(_san_for_host(h) for h in hosts)]
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE).not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ec_public_key(ca_cert)),
                       critical=False)
        .sign(ca.private_key, hashes.SHA256())
    )
    return CertKeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def identity_of(cert: x509.Certificate) -> Identity:
    """The one identity URI in cert's SANs."""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound as exc:
        raise CertificateError("certificate has no subjectAltName", "NO_IDENTITY") from exc
    uris = [u for u in sans.get_values_for_type(x509.UniformResourceIdentifier) if u.startswith("spiffe://")]
    if len(uris) != 1:
        raise CertificateError(f"certificate must carry exactly one identity URI, has {uris}", "NO_IDENTITY")
    try:
        return Identity.from_uri(uris[0])
    except IdentityError as exc:
        raise CertificateError(str(exc), "NO_IDENTITY") from exc


def issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def verify_leaf(cert_pem: bytes, ca_pem: bytes, now: dt.datetime) -> Identity:
    """Identity of cert_pem if a CA in the bundle ca_pem signed it and it is valid at now; else
    CertificateError. The bundle holds two CAs while the fleet CA is being rotated."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise CertificateError(f"unreadable certificate: {exc}", "BAD_CERTIFICATE") from exc
    if not any(issued_by(cert, ca) for ca in x509.load_pem_x509_certificates(ca_pem)):
        raise CertificateError("certificate was not issued by the fleet CA", "UNTRUSTED_CERTIFICATE")
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise CertificateError(
            f"certificate valid {cert.not_valid_before_utc}..{cert.not_valid_after_utc}, not at {now}",
            "CERTIFICATE_EXPIRED")
    return identity_of(cert)


def fingerprint(cert_pem: bytes) -> str:
    return x509.load_pem_x509_certificate(cert_pem).fingerprint(hashes.SHA256()).hex()
