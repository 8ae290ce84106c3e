"""`.fornax/fleet.json`: where each service of a local fleet listens, and its pid.

It can hold the API key, so it is written with mode 600 like every other secret file."""

from __future__ import annotations

import json
import os
import ssl
from dataclasses import asdict, dataclass, field
from pathlib import Path

from libs.security.store import write_secret

FLEET_FILE_VERSION = 1


@dataclass(frozen=True)
class ServiceEntry:
    name: str
    kind: str
    grpc: str
    metrics: str
    pid: int
    log: str
    # Extra listeners, e.g. {"data_plane": "127.0.0.1:7070"}.
    extra: dict[str, str] = field(default_factory=dict)
    # Size of `log` when this process was spawned: its own lines start there (the file is
    # appended to by every fleet of the state directory).
    log_start: int = 0


@dataclass(frozen=True)
class FleetState:
    services: tuple[ServiceEntry, ...]
    api: str | None = None
    api_key: str | None = None
    # Whether the fleet serves mTLS (certificates under <state dir>/certs).
    tls: bool = False
    # The CA bundle that verifies the API's certificate when it serves https (the fleet CA).
    api_ca: str | None = None

    def api_ssl_context(self) -> ssl.SSLContext | None:
        """How a client of the API verifies it: None for plain http; the fleet CA for https
        when the fleet file names one, else the system's trust store."""
        if not (self.api or "").startswith("https://"):
            return None
        return ssl.create_default_context(cafile=self.api_ca) if self.api_ca else ssl.create_default_context()

    def entry(self, name: str) -> ServiceEntry:
        for service in self.services:
            if service.name == name:
                return service
        raise KeyError(name)

    def to_json(self) -> str:
        body = {
            "version": FLEET_FILE_VERSION,
            "services": [asdict(service) for service in self.services],
            "api": self.api,
            "tls": self.tls,
        }
        if self.api_key:
            body["api_key"] = self.api_key
        if self.api_ca:
            body["api_ca"] = self.api_ca
        return json.dumps(body, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> FleetState:
        body = json.loads(text)
        if body.get("version") != FLEET_FILE_VERSION:
            raise ValueError(f"unsupported fleet file version {body.get('version')!r}")
        services = tuple(ServiceEntry(**service) for service in body["services"])
        return cls(services=services, api=body.get("api"), api_key=body.get("api_key"),
                   tls=bool(body.get("tls", False)), api_ca=body.get("api_ca"))


def fleet_path(state_dir: str | os.PathLike) -> Path:
    return Path(state_dir) / "fleet.json"


def write_fleet(state_dir: str | os.PathLike, state: FleetState) -> Path:
    path = fleet_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_secret(path, state.to_json().encode())
    return path


def read_fleet(state_dir: str | os.PathLike) -> FleetState | None:
    path = fleet_path(state_dir)
    if not path.exists():
        return None
    return FleetState.from_json(path.read_text(encoding="utf-8"))
