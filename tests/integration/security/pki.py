"""A throwaway fleet PKI for security tests: a CA, a foreign CA, and named identities."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import grpc

from libs.security.identity import Identity, Role
from libs.security.store import CertStore
from libs.security.tls import TlsPaths
from libs.service.channels import ClientCredentials

OPERATOR = Identity(Role.OPERATOR, "admin")
CLIENT = Identity(Role.CLIENT, "app")


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class FleetPki:
    def __init__(self, root: Path):
        self.store = CertStore(root / "fleet")
        self.store.init(now())
        self.foreign = CertStore(root / "foreign")
        self.foreign.init(now())

    def paths(self, identity: Identity, *, foreign: bool = False) -> TlsPaths:
        store = self.foreign if foreign else self.store
        return store.ensure(identity, now())

    def creds(self, identity: Identity, *, foreign: bool = False) -> ClientCredentials:
        material = self.paths(identity, foreign=foreign).read()
        # The caller trusts the real fleet CA whatever signed its own certificate.
        return ClientCredentials(self.store.ca_cert.read_bytes(), material.cert_pem, material.key_pem)

    def channel(self, address: str, identity: Identity | None, *, foreign: bool = False) -> grpc.aio.Channel:
        if identity is None:
            return grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(self.store.ca_cert.read_bytes()))
        return grpc.aio.secure_channel(address, self.creds(identity, foreign=foreign).channel_credentials())
