"""The certificate directory of a state dir: the fleet CA and one certificate per identity.

Layout under `<state_dir>/certs/`: `ca.pem` (the trust bundle every service and client reads),
`ca.key` (the signing key), and `<role>-<name>.pem|.key`. Every file is written atomically with
mode 600, in a directory of mode 700.

Rotating the CA without downtime, in three steps:
1. `rotate_ca`: a new CA signs from now on (`ca-signing.pem`, `ca.key`); `ca.pem` becomes the
   transition bundle, new + old, and the old CA's certificate is kept as `ca-retiring.pem`.
   Services reloading the bundle accept leaves of either CA.
2. `rotate`: every leaf is reissued by the new CA; services reload their certificates.
3. `retire_ca`: `ca.pem` is the new CA alone; services reloading it refuse the old CA's leaves.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from libs.security.certs import DEFAULT_HOSTS, CertKeyPair, identity_of, issue, issued_by, new_ca
from libs.security.identity import Identity
from libs.security.tls import TlsPaths

SECRET_FILE_MODE = 0o600
SECRET_DIR_MODE = 0o700


class CertStoreError(RuntimeError):
    pass


def write_secret(path: Path, data: bytes) -> None:
    """Write data to path atomically, readable by the owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, SECRET_FILE_MODE)
    try:
        os.fchmod(fd, SECRET_FILE_MODE)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


@dataclass(frozen=True)
class IssuedIdentity:
    identity: Identity
    paths: TlsPaths
    not_after: dt.datetime


class CertStore:
    def __init__(self, state_dir: str | os.PathLike):
        self.root = Path(state_dir) / "certs"

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def ca_signing(self) -> Path:
        """The certificate of the CA that signs, once the CA was rotated (before: `ca.pem`)."""
        return self.root / "ca-signing.pem"

    @property
    def ca_retiring(self) -> Path:
        """The old CA's certificate while a CA rotation is in progress."""
        return self.root / "ca-retiring.pem"

    def paths_for(self, identity: Identity) -> TlsPaths:
        return TlsPaths(self.ca_cert, self.root / f"{identity.file_stem}.pem", self.root / f"{identity.file_stem}.key")

    def has_ca(self) -> bool:
        return self.ca_cert.is_file() and self.ca_key.is_file()

    def init(self, now: dt.datetime, *, force: bool = False) -> Path:
        """Create the fleet CA; refuses to replace one unless force (which orphans every leaf)."""
        if self.has_ca() and not force:
            raise CertStoreError(
                f"a fleet CA already exists at {self.ca_cert}; rotate leaves with `fornax certs rotate`"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, SECRET_DIR_MODE)
        ca = new_ca(now)
        write_secret(self.ca_key, ca.key_pem)
        write_secret(self.ca_cert, ca.cert_pem)
        self.ca_signing.unlink(missing_ok=True)
        self.ca_retiring.unlink(missing_ok=True)
        return self.ca_cert

    def _ca(self) -> CertKeyPair:
        if not self.has_ca():
            raise CertStoreError(f"no fleet CA under {self.root}; run `fornax certs init` first")
        signing = self.ca_signing if self.ca_signing.is_file() else self.ca_cert
        return CertKeyPair(signing.read_bytes(), self.ca_key.read_bytes())

    def rotate_ca(self, now: dt.datetime) -> Path:
        """Step 1 of a CA rotation: a new signing CA, and ca.pem trusting both. Returns ca.pem."""
        if self.ca_retiring.is_file():
            raise CertStoreError(
                f"a CA rotation is already in progress ({self.ca_retiring}); reissue the leaves with "
                "`fornax certs rotate`, then `fornax certs retire-ca`")
        old = self._ca()
        new = new_ca(now)
        write_secret(self.ca_retiring, old.cert_pem)
        # Trust first: by the time anything is signed by the new CA, ca.pem already accepts it.
        write_secret(self.ca_cert, new.cert_pem + self.ca_cert.read_bytes())
        write_secret(self.ca_key, new.key_pem)
        write_secret(self.ca_signing, new.cert_pem)
        return self.ca_cert

    def leaves_of_retiring_ca(self) -> list[Identity]:
        """Identities whose certificate the retiring CA issued (none once all are reissued)."""
        if not self.ca_retiring.is_file():
            return []
        old = x509.load_pem_x509_certificate(self.ca_retiring.read_bytes())
        found = []
        for identity in self.identities():
            cert = x509.load_pem_x509_certificate(self.paths_for(identity).cert.read_bytes())
            if issued_by(cert, old):
                found.append(identity)
        return found

    def retire_ca(self, *, force: bool = False) -> Path:
        """Step 3: ca.pem trusts the new CA alone. Refused while a leaf of the old CA remains
        (those services would be locked out), unless force."""
        if not self.ca_retiring.is_file():
            raise CertStoreError("no CA rotation in progress; start one with `fornax certs rotate-ca`")
        stale = self.leaves_of_retiring_ca()
        if stale and not force:
            raise CertStoreError(
                "still issued by the retiring CA: " + ", ".join(map(str, stale))
                + "; reissue them with `fornax certs rotate` (or retire anyway with --force)")
        write_secret(self.ca_cert, self.ca_signing.read_bytes())
        self.ca_retiring.unlink()
        return self.ca_cert

    def issue(self, identity: Identity, now: dt.datetime, hosts: Sequence[str] = DEFAULT_HOSTS,
              validity: dt.timedelta | None = None) -> IssuedIdentity:
        kwargs = {"validity": validity} if validity else {}
        leaf = issue(self._ca(), identity, now, hosts, **kwargs)
        paths = self.paths_for(identity)
        # Key first: a reader that sees the new certificate also finds its key.
        write_secret(paths.key, leaf.key_pem)
        write_secret(paths.cert, leaf.cert_pem)
        return IssuedIdentity(identity, paths, leaf.certificate.not_valid_after_utc)

    def ensure(self, identity: Identity, now: dt.datetime, hosts: Sequence[str] = DEFAULT_HOSTS) -> TlsPaths:
        """The identity's paths, issuing a certificate when there is none, it expires within a
        day, or it does not name every one of hosts."""
        paths = self.paths_for(identity)
        if paths.cert.is_file() and paths.key.is_file():
            cert = x509.load_pem_x509_certificate(paths.cert.read_bytes())
            fresh = cert.not_valid_after_utc - now > dt.timedelta(days=1)
            if fresh and set(hosts) <= set(self.hosts_of(identity)):
                return paths
        return self.issue(identity, now, hosts).paths

    def identities(self) -> list[Identity]:
        found = []
        for cert_path in sorted(self.root.glob("*.pem")):
            if cert_path.name in ("ca.pem", self.ca_signing.name, self.ca_retiring.name):
                continue
            found.append(identity_of(x509.load_pem_x509_certificate(cert_path.read_bytes())))
        return found

    def hosts_of(self, identity: Identity) -> list[str]:
        cert = x509.load_pem_x509_certificate(self.paths_for(identity).cert.read_bytes())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return [*sans.get_values_for_type(x509.DNSName), *(str(ip) for ip in sans.get_values_for_type(x509.IPAddress))]

    def rotate(self, identities: Sequence[Identity], now: dt.datetime) -> list[IssuedIdentity]:
        """A fresh key and certificate for each identity, keeping its hosts; services reload them."""
        return [self.issue(identity, now, self.hosts_of(identity)) for identity in identities]
