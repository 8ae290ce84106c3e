"""TLS material on disk, and the gRPC credentials built from it.

The server side uses gRPC's dynamic credentials: at every new handshake gRPC asks the fetcher
for a new configuration, and the fetcher returns one only when the files changed (or a SIGHUP
asked for a reload). Rotation therefore takes effect for new connections with no restart and
no dropped calls; live connections keep the certificate they were opened with.
"""

from __future__ import annotations

import hashlib
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from libs.service.channels import ClientCredentials

ENV_CA = "FORNAX_TLS_CA"
ENV_CERT = "FORNAX_TLS_CERT"
ENV_KEY = "FORNAX_TLS_KEY"
ENV_INSECURE = "FORNAX_INSECURE"


class TlsConfigError(ValueError):
    """TLS settings that are incomplete or unreadable."""


@dataclass(frozen=True)
class TlsPaths:
    """Where one identity's trust bundle, certificate and key live."""

    ca: Path
    cert: Path
    key: Path

    def read(self) -> ClientCredentials:
        try:
            return ClientCredentials(self.ca.read_bytes(), self.cert.read_bytes(), self.key.read_bytes())
        except OSError as exc:
            raise TlsConfigError(f"cannot read TLS material: {exc}") from exc

    def digest(self) -> str:
        """Changes whenever any of the three files changes."""
        hasher = hashlib.sha256()
        for path in (self.ca, self.cert, self.key):
            try:
                hasher.update(path.read_bytes())
            except OSError:
                hasher.update(b"missing:" + str(path).encode())
        return hasher.hexdigest()


def tls_from_env(env: Mapping[str, str]) -> TlsPaths | None:
    """TlsPaths from FORNAX_TLS_{CA,CERT,KEY}; None when none is set; an error when only some are."""
    values = [env.get(k) or "" for k in (ENV_CA, ENV_CERT, ENV_KEY)]
    if not any(values):
        return None
    if not all(values):
        raise TlsConfigError(f"set all of {ENV_CA}, {ENV_CERT} and {ENV_KEY}, or none")
    return TlsPaths(*(Path(v) for v in values))


def insecure_from_env(env: Mapping[str, str]) -> bool:
    return (env.get(ENV_INSECURE) or "").lower() in ("1", "true", "yes")


def key_matches_cert(key_pem: bytes, cert_pem: bytes) -> bool:
    key = serialization.load_pem_private_key(key_pem, password=None)
    cert = x509.load_pem_x509_certificate(cert_pem)
    der = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    return key.public_key().public_bytes(*der) == cert.public_key().public_bytes(*der)


class ReloadingServerCredentials:
    """Server credentials that follow the files in `paths`, requiring a client certificate."""

    def __init__(self, paths: TlsPaths):
        self._paths = paths
        self._lock = threading.Lock()
        self._digest = paths.digest()
        self._forced = False
        self.reloads = 0
        self.credentials = grpc.dynamic_ssl_server_credentials(
            self._config(paths.read()), self._fetch, require_client_authentication=True)

    @staticmethod
    def _config(material: ClientCredentials) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(material.key_pem, material.cert_pem)], root_certificates=material.ca_pem)

    def request_reload(self) -> None:
        """Make the next handshake load the files even if their bytes look unchanged (SIGHUP)."""
        with self._lock:
            self._forced = True

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC on its own threads at each new handshake; must not raise.
        with self._lock:
            digest = self._paths.digest()
            if digest == self._digest and not self._forced:
                return None
            try:
                material = self._paths.read()
                if not (material.key_pem and material.cert_pem
                        and key_matches_cert(material.key_pem, material.cert_pem)):
                    return None  # mid-rotation: the other file has not landed yet
                config = self._config(material)
            except (TlsConfigError, ValueError):
                return None  # keep serving with the last good certificate
            self._digest, self._forced = digest, False
            self.reloads += 1
            return config


def own_identity_uri(paths: TlsPaths | None) -> str:
    """The identity URI in this process's own certificate; "" without TLS."""
    if paths is None:
        return ""
    from libs.security.certs import identity_of

    return identity_of(x509.load_pem_x509_certificate(paths.cert.read_bytes())).uri


class ReloadingSslContext:
    """An ssl.SSLContext for a raw TLS socket (the FNX2 data plane) that follows the files.

    `maybe_reload()` (called on SIGHUP, and before each new outbound connection) builds a fresh
    context from changed files, so a CA dropped from the bundle stops being trusted. A client
    reads `context` per connection. A listener keeps the context it was created with; as a
    server, that context switches each handshake to the current one (in its SNI callback, which
    OpenSSL runs for every ClientHello), so the next handshake gets the new certificate and
    trust bundle without the listener being restarted."""

    def __init__(self, paths: TlsPaths, *, server: bool):
        self._paths = paths
        self._server = server
        self._digest = ""
        self.reloads = 0
        self.context = self._build()
        self._current = self.context
        self.maybe_reload()
        if server:
            self.context.sni_callback = self._switch

    def _build(self, material: ClientCredentials | None = None) -> ssl.SSLContext:
        purpose = ssl.Purpose.CLIENT_AUTH if self._server else ssl.Purpose.SERVER_AUTH
        context = ssl.create_default_context(purpose)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # A server verifies and requires the peer's fleet certificate; a client verifies the
        # server's chain and host name and presents its own certificate.
        context.verify_mode = ssl.CERT_REQUIRED
        material = material or self._paths.read()
        context.load_verify_locations(cadata=(material.ca_pem or b"").decode())
        context.load_cert_chain(str(self._paths.cert), str(self._paths.key))
        return context

    def _switch(self, ssl_object, server_name, initial) -> None:
        if self._current is not initial:
            ssl_object.context = self._current

    def maybe_reload(self) -> bool:
        digest = self._paths.digest()
        if digest == self._digest:
            return False
        material = self._paths.read()
        if not (material.key_pem and material.cert_pem and key_matches_cert(material.key_pem, material.cert_pem)):
            return False  # mid-rotation: keep what is loaded
        fresh = self._build(material)
        if self._server:
            self._current = fresh  # the listener's context hands handshakes over to it
        else:
            self.context = fresh
        self._digest = digest
        self.reloads += 1
        return True


def peer_uris(ssl_object) -> tuple[str, ...]:
    """SAN URIs of the verified certificate on an ssl.SSLObject (or SSLSocket)."""
    cert = ssl_object.getpeercert() or {}
    return tuple(value for kind, value in cert.get("subjectAltName", ()) if kind == "URI")
