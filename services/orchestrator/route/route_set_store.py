"""The serving set of replica routes, stored where the orchestrator keeps its state, and the
change in flight, so that an orchestrator that restarts serves the set last committed.

`<state>/route_set.json` names every route by its stage workers' addresses in stage order and
as FORNAX_ROUTE_GROUPS groups (indices into the configured stage workers; `[]` for a route on a
worker that joined later), next to the workers a host drain took out, those whose routes were
removed when they did not come back within the rejoin timeout (`lost_workers`), the removed
routes with their reasons, the configured stage workers it was stored for, and its
`generation` (one more at every commit). Fields a file written before them lacks read as empty.

A change of the set (`fornax host drain`, `fornax host add --apply`) first writes
`<state>/route_set.change.json` (what it is, and the generation it starts from), then runs.
**The commit point is the rename of `route_set.json`** holding generation + 1; the marker is
removed after. Both files are written whole or not at all: a temporary file, fsynced, renamed
over the old one, then the directory fsynced; a crash mid-write leaves the previous file. An
orchestrator that finds a marker whose generation is still the stored one knows that change
never committed, and serves the stored set: the change is rolled back (route/resume.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from services.orchestrator.route.host_change import RemovalReason, RemovedRoute, Route
from services.orchestrator.route.lifecycle import REMOVED_ROUTES_KEPT, InstalledRoute, Publish, RouteChange

_Outcome = TypeVar("_Outcome")

ROUTE_SET_FILE = "route_set.json"
CHANGE_FILE = "route_set.change.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class StoredRouteSet:
    routes: tuple[tuple[str, ...], ...]  # stage worker addresses, stage order
    route_groups: tuple[tuple[int, ...], ...]  # the same, as indices into the configured workers
    drained_workers: tuple[str, ...]  # workers a host drain took out, oldest first
    lost_workers: tuple[str, ...] = ()  # workers gone past the rejoin timeout, oldest first
    generation: int = 0  # commits so far; 0 in a file written before generations existed
    configured_workers: tuple[str, ...] = ()  # the stage workers it was stored for; () unknown
    removed: tuple[RemovedRoute, ...] = ()  # routes taken out, oldest first (the latest kept)


@dataclass(frozen=True)
class ChangeInFlight:
    """A change of the set that started from `base_generation` and has not committed (yet)."""

    change: str  # in words: "drain a host", "add routes"
    base_generation: int


def stored_route_set(workers: Sequence[str], routes: Sequence[Sequence[str]],
                     drained: Sequence[str], lost: Sequence[str] = ()) -> StoredRouteSet:
    """The set to store; a route on a worker that is not configured (one that joined) has no group."""
    return StoredRouteSet(tuple(tuple(r) for r in routes), tuple(_group(workers, r) for r in routes),
                          tuple(drained), tuple(lost), configured_workers=tuple(workers))


def _group(workers: Sequence[str], route: Sequence[str]) -> tuple[int, ...]:
    return tuple(workers.index(w) for w in route) if all(w in workers for w in route) else ()


def write_route_set(state_dir: str | Path, route_set: StoredRouteSet) -> Path:
    """Writes the set whole: this rename is a change's commit point."""
    return _write_whole(Path(state_dir), ROUTE_SET_FILE, {
        "version": FORMAT_VERSION, "generation": route_set.generation,
        "routes": [list(r) for r in route_set.routes],
        "route_groups": [list(g) for g in route_set.route_groups],
        "drained_workers": list(route_set.drained_workers), "lost_workers": list(route_set.lost_workers),
        "configured_workers": list(route_set.configured_workers),
        "removed": [{"route": list(r.route), "reason": r.reason.value, "host": r.host, "detail": r.detail}
                    for r in route_set.removed]})


def read_route_set(state_dir: str | Path) -> StoredRouteSet | None:
    """The stored set; None when none was stored."""
    body = _read(Path(state_dir) / ROUTE_SET_FILE)
    if body is None:
        return None
    if body.get("version") != FORMAT_VERSION:
        raise ValueError(f"{ROUTE_SET_FILE}: unsupported version {body.get('version')!r}")
    removed = tuple(RemovedRoute(tuple(r["route"]), RemovalReason(r["reason"]), r["host"], r.get("detail", ""))
                    for r in body.get("removed", ()))
    return StoredRouteSet(tuple(tuple(r) for r in body["routes"]),
                          tuple(tuple(g) for g in body["route_groups"]), tuple(body["drained_workers"]),
                          tuple(body.get("lost_workers", ())), int(body.get("generation", 0)),
                          tuple(body.get("configured_workers", ())), removed)


def write_change(state_dir: str | Path, change: ChangeInFlight) -> Path:
    return _write_whole(Path(state_dir), CHANGE_FILE, {"version": FORMAT_VERSION, "change": change.change,
                                                       "base_generation": change.base_generation})


def read_change(state_dir: str | Path) -> ChangeInFlight | None:
    body = _read(Path(state_dir) / CHANGE_FILE)
    return None if body is None else ChangeInFlight(str(body["change"]), int(body["base_generation"]))


def clear_change(state_dir: str | Path) -> None:
    (Path(state_dir) / CHANGE_FILE).unlink(missing_ok=True)


class RouteSetJournal:
    """Records each change of the serving set: `begin` marks it in flight, calling the journal
    with the routes left and the routes removed commits it (it is a `RouteSetStore`), `end`
    clears a marker that no commit cleared (a change refused or failed: nothing changed)."""

    def __init__(self, state_dir: str | Path, configured_workers: Sequence[str],
                 committed: StoredRouteSet | None = None) -> None:
        self._dir = Path(state_dir)
        self._workers = tuple(configured_workers)
        self._committed = committed

    @property
    def generation(self) -> int:
        return self._committed.generation if self._committed else 0

    def begin(self, change: str) -> None:
        write_change(self._dir, ChangeInFlight(change, self.generation))

    def __call__(self, routes: tuple[Route, ...], removed: tuple[RemovedRoute, ...]) -> str:
        before = self._committed
        drained = _with_hosts(before.drained_workers if before else (), removed, RemovalReason.HOST_DRAINED)
        lost = _with_hosts(before.lost_workers if before else (), removed, RemovalReason.REJOIN_TIMEOUT)
        committed = replace(stored_route_set(self._workers, routes, drained, lost), generation=self.generation + 1,
                            removed=((*before.removed, *removed) if before else removed)[-REMOVED_ROUTES_KEPT:])
        path = write_route_set(self._dir, committed)
        self._committed = committed
        clear_change(self._dir)
        return str(path)

    def end(self) -> None:
        clear_change(self._dir)


def journaled(journal: RouteSetJournal, what: str, change: RouteChange[_Outcome]) -> RouteChange[_Outcome]:
    """`change`, marked in flight in the journal while it runs (under the lifecycle lock)."""
    async def run(current: InstalledRoute, publish: Publish) -> _Outcome:
        journal.begin(what)
        try:
            return await change(current, publish)
        finally:
            journal.end()  # a commit cleared it already; else nothing was stored: the set is as before

    return run


def _with_hosts(hosts: tuple[str, ...], removed: Sequence[RemovedRoute], reason: RemovalReason) -> tuple[str, ...]:
    added = [r.host for r in removed if r.reason is reason]
    return (*hosts, *(h for i, h in enumerate(added) if h not in hosts and h not in added[:i]))


def _write_whole(directory: Path, name: str, body: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    temporary = directory / f".{name}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(body, indent=2) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
