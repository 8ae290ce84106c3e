"""What a command-line tool presents to the fleet: FORNAX_TLS_{CA,CERT,KEY} when set, else the
local fleet's operator certificate under <state dir>/certs, else nothing (plaintext, which an
mTLS fleet refuses at the handshake)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from libs.security.identity import Identity, Role
from libs.security.store import CertStore
from libs.security.tls import tls_from_env
from libs.service.channels import ChannelConfig, ClientCredentials

OPERATOR = Identity(Role.OPERATOR, "admin")


def operator_credentials(state_dir: str | Path, env: Mapping[str, str] | None = None) -> ClientCredentials | None:
    env = os.environ if env is None else env
    explicit = tls_from_env(env)
    if explicit is not None:
        return explicit.read()
    paths = CertStore(state_dir).paths_for(OPERATOR)
    if not (paths.ca.is_file() and paths.cert.is_file() and paths.key.is_file()):
        return None
    return paths.read()


def cli_channel(state_dir: str | Path = ".fornax", env: Mapping[str, str] | None = None) -> ChannelConfig:
    return ChannelConfig(credentials=operator_credentials(state_dir, env))
