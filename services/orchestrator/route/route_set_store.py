"""The serving set of replica routes, stored where the orchestrator keeps its state.

`<state>/route_set.json` names every route by its stage workers' addresses in stage order and
as FORNAX_ROUTE_GROUPS groups (indices into the configured stage workers), next to the workers
a host drain took out and those whose routes were removed when they did not come back within
the rejoin timeout (`lost_workers`; absent in a file written before it existed). It is written
whole or not at all: a temporary file, fsynced, renamed over the old one, then the directory
fsynced; a crash mid-write leaves the previous set.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROUTE_SET_FILE = "route_set.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class StoredRouteSet:
    routes: tuple[tuple[str, ...], ...]  # stage worker addresses, stage order
    route_groups: tuple[tuple[int, ...], ...]  # the same, as indices into the configured workers
    drained_workers: tuple[str, ...]  # workers a host drain took out, oldest first
    lost_workers: tuple[str, ...] = ()  # workers gone past the rejoin timeout, oldest first


def stored_route_set(workers: Sequence[str], routes: Sequence[Sequence[str]],
                     drained: Sequence[str], lost: Sequence[str] = ()) -> StoredRouteSet:
    """The set to store; a route worker that is not configured raises ValueError."""
    return StoredRouteSet(tuple(tuple(r) for r in routes),
                          tuple(tuple(workers.index(w) for w in route) for route in routes), tuple(drained),
                          tuple(lost))


def write_route_set(state_dir: str | Path, route_set: StoredRouteSet) -> Path:
    directory = Path(state_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / ROUTE_SET_FILE
    body = json.dumps({"version": FORMAT_VERSION, "routes": [list(r) for r in route_set.routes],
                       "route_groups": [list(g) for g in route_set.route_groups],
                       "drained_workers": list(route_set.drained_workers),
                       "lost_workers": list(route_set.lost_workers)}, indent=2) + "\n"
    temporary = directory / f".{ROUTE_SET_FILE}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(body)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def read_route_set(state_dir: str | Path) -> StoredRouteSet | None:
    # Read by tests and operators; an orchestrator that restarts does not resume from it yet.
    """The stored set; None when none was stored."""
    try:
        body = json.loads((Path(state_dir) / ROUTE_SET_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    if body.get("version") != FORMAT_VERSION:
        raise ValueError(f"{ROUTE_SET_FILE}: unsupported version {body.get('version')!r}")
    return StoredRouteSet(tuple(tuple(r) for r in body["routes"]),
                          tuple(tuple(g) for g in body["route_groups"]), tuple(body["drained_workers"]),
                          tuple(body.get("lost_workers", ())))
