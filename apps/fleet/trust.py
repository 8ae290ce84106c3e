"""The local fleet's certificates: created under the state dir by `fornax up`, one per
service, plus the operator identity the command line uses. `--insecure` skips all of it."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path

from libs.security.cli_credentials import OPERATOR
from libs.security.identity import Identity, service_identity, stage_identity
from libs.security.store import CertStore
from libs.security.tls import ENV_CA, ENV_CERT, ENV_INSECURE, ENV_KEY
from libs.service.channels import ClientCredentials

LOOPBACK_HOSTS = ("localhost", "127.0.0.1")


def identity_for(name: str, kind: str) -> Identity:
    """stage_worker_<i> (and its numpy stand-in stage_worker_<i>_reference, which serves the
    same stage while MAX compiles) is stage/stage-<i>; every other service is service/<kind>."""
    if kind == "stage_worker":
        match = _STAGE_WORKER.fullmatch(name)
        if match is None:
            raise ValueError(f"a stage worker's name must be stage_worker_<index>[_reference], got {name!r}")
        return stage_identity(int(match.group(1)))
    return service_identity(kind)


_STAGE_WORKER = re.compile(r"stage_worker_(\d+)(?:_reference)?")


@dataclass(frozen=True)
class FleetTrust:
    state_dir: Path
    # None when the fleet was started with --insecure.
    store: CertStore | None

    @property
    def insecure(self) -> bool:
        return self.store is None

    def service_env(self, name: str, kind: str, host: str = "127.0.0.1") -> dict[str, str]:
        env = {"FORNAX_AUDIT_LOG": str(self.state_dir / "audit" / f"{name}.jsonl")}
        if self.store is None:
            return {**env, ENV_INSECURE: "1"}
        hosts = tuple(dict.fromkeys((*LOOPBACK_HOSTS, host)))  # a fleet host's namespace address too
        paths = self.store.ensure(identity_for(name, kind), _now(), hosts)
        return {**env, ENV_CA: str(paths.ca), ENV_CERT: str(paths.cert), ENV_KEY: str(paths.key)}

    def operator_credentials(self) -> ClientCredentials | None:
        return None if self.store is None else self.store.ensure(OPERATOR, _now()).read()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def prepare_trust(state_dir: Path, insecure: bool) -> FleetTrust:
    """The CA is created once and kept; leaf certificates are issued when missing or expiring."""
    if insecure:
        return FleetTrust(state_dir, None)
    store = CertStore(state_dir)
    if not store.has_ca():
        store.init(_now())
    store.ensure(OPERATOR, _now())
    return FleetTrust(state_dir, store)
