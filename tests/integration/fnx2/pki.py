"""A throwaway certificate authority for mutual-TLS tests: one CA, leaves signed by it."""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class MiniCa:
    def __init__(self, directory: Path, name: str = "fornax-test-ca") -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(self.name).issuer_name(self.name)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(minutes=5))
                     .not_valid_after(now + datetime.timedelta(hours=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.path = directory / f"{name}.pem"
        self.path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, common_name: str, dns_names: tuple[str, ...] = ()) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
                   .issuer_name(self.name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(hours=1)))
        if dns_names:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        cert_path = self.directory / f"{common_name}.pem"
        key_path = self.directory / f"{common_name}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(_pem_key(key))
        return cert_path, key_path

    def server_context(self, common_name: str = "localhost") -> ssl.SSLContext:
        """Requires and verifies client certificates signed by this CA."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(self.path))
        context.load_cert_chain(*self.issue(common_name, (common_name,)))
        context.verify_mode = ssl.CERT_REQUIRED
        return context

    def client_context(self, common_name: str, server_ca: MiniCa | None = None) -> ssl.SSLContext:
        """Trusts `server_ca` (default: this CA) and presents a certificate of this CA."""
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                             cafile=str((server_ca or self).path))
        context.load_cert_chain(*self.issue(common_name, (common_name,)))
        return context
