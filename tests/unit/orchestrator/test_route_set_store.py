"""The serving route set a host drain leaves is stored whole (no temporary file left), read
back as written, and names routes both by worker address and as FORNAX_ROUTE_GROUPS; the
journal marks a change in flight, commits the set it leaves (one generation more) and clears
the marker, and a change that ends without a commit leaves the stored set as it was."""

from __future__ import annotations

import pytest

from services.orchestrator.route.host_change import RemovalReason, RemovedRoute
from services.orchestrator.route.route_set_store import (
    CHANGE_FILE,
    ROUTE_SET_FILE,
    ChangeInFlight,
    RouteSetJournal,
    journaled,
    read_change,
    read_route_set,
    stored_route_set,
    write_route_set,
)

WORKERS = ("10.0.0.1:2", "10.0.0.2:2", "10.0.0.3:2", "10.0.0.4:2")


def test_a_stored_route_set_reads_back_as_written(tmp_path):
    written = stored_route_set(WORKERS, [("10.0.0.1:2", "10.0.0.2:2")], ["10.0.0.4:2"])
    path = write_route_set(tmp_path / "orchestrator", written)
    assert written.route_groups == ((0, 1),)
    assert read_route_set(tmp_path / "orchestrator") == written
    assert [p.name for p in path.parent.iterdir()] == ["route_set.json"]


def test_a_second_drain_replaces_the_stored_set(tmp_path):
    write_route_set(tmp_path, stored_route_set(WORKERS, [WORKERS[:2], WORKERS[2:3]], [WORKERS[3]]))
    write_route_set(tmp_path, stored_route_set(WORKERS, [WORKERS[:2]], [WORKERS[3], WORKERS[2]]))
    stored = read_route_set(tmp_path)
    assert stored is not None and stored.route_groups == ((0, 1),)
    assert stored.drained_workers == (WORKERS[3], WORKERS[2])


def test_nothing_stored_reads_as_none_and_a_route_on_a_joined_worker_has_no_group(tmp_path):
    assert read_route_set(tmp_path) is None
    written = stored_route_set(WORKERS, [WORKERS[:2], ("10.9.9.9:2",)], [])
    assert written.route_groups == ((0, 1), ())
    write_route_set(tmp_path, written)
    assert read_route_set(tmp_path) == written


def test_workers_lost_past_the_rejoin_timeout_are_stored_apart_from_drained_ones(tmp_path):
    write_route_set(tmp_path, stored_route_set(WORKERS, [WORKERS[:2]], [WORKERS[3]], [WORKERS[2]]))
    stored = read_route_set(tmp_path)
    assert stored is not None and stored.lost_workers == (WORKERS[2],) and stored.drained_workers == (WORKERS[3],)


def test_a_set_stored_before_lost_workers_existed_reads_with_none_lost(tmp_path):
    import json

    (tmp_path / "route_set.json").write_text(json.dumps(
        {"version": 1, "routes": [list(WORKERS[:2])], "route_groups": [[0, 1]], "drained_workers": []}))
    stored = read_route_set(tmp_path)
    assert stored is not None and stored.lost_workers == () and stored.routes == (WORKERS[:2],)


def _drained(route, host: str) -> RemovedRoute:
    return RemovedRoute(route, RemovalReason.HOST_DRAINED, host, f"host {host} drained")


def test_a_commit_stores_the_set_one_generation_on_with_what_was_removed_and_clears_the_marker(tmp_path):
    journal = RouteSetJournal(tmp_path, WORKERS)
    journal.begin("drain a host")
    assert read_change(tmp_path) == ChangeInFlight("drain a host", 0)
    path = journal((WORKERS[:2],), (_drained(WORKERS[2:], WORKERS[3]),))
    assert path.endswith(ROUTE_SET_FILE) and read_change(tmp_path) is None
    stored = read_route_set(tmp_path)
    assert stored is not None and stored.generation == 1 and stored.routes == (WORKERS[:2],)
    assert stored.removed == (_drained(WORKERS[2:], WORKERS[3]),) and stored.drained_workers == (WORKERS[3],)
    assert stored.configured_workers == WORKERS
    journal.begin("add routes")
    assert read_change(tmp_path) == ChangeInFlight("add routes", 1)
    journal((WORKERS[:2], ("10.9.9.9:2",)), ())
    again = read_route_set(tmp_path)
    assert again is not None and again.generation == 2 and again.removed == stored.removed
    assert again.routes == (WORKERS[:2], ("10.9.9.9:2",)) and again.drained_workers == (WORKERS[3],)


def test_a_journal_resumed_from_a_stored_set_goes_on_from_its_generation_and_records(tmp_path):
    journal = RouteSetJournal(tmp_path, WORKERS)
    journal((WORKERS[:2], WORKERS[2:3]), (_drained((WORKERS[3],), WORKERS[3]),))
    resumed = RouteSetJournal(tmp_path, WORKERS, read_route_set(tmp_path))
    resumed((WORKERS[:2],), (RemovedRoute(WORKERS[2:3], RemovalReason.REJOIN_TIMEOUT, WORKERS[2]),))
    stored = read_route_set(tmp_path)
    assert stored is not None and stored.generation == 2
    assert stored.drained_workers == (WORKERS[3],) and stored.lost_workers == (WORKERS[2],)
    assert [r.reason for r in stored.removed] == [RemovalReason.HOST_DRAINED, RemovalReason.REJOIN_TIMEOUT]


def test_a_change_that_fails_leaves_the_stored_set_and_no_marker(tmp_path):
    import asyncio

    journal = RouteSetJournal(tmp_path, WORKERS)
    journal((WORKERS[:2], WORKERS[2:]), ())
    before = (tmp_path / ROUTE_SET_FILE).read_bytes()
    seen: list = []

    async def fails(current, publish):
        seen.append(read_change(tmp_path))  # marked in flight while it runs
        raise RuntimeError("the added route failed to load")

    with pytest.raises(RuntimeError):
        asyncio.run(journaled(journal, "add routes", fails)(None, None))  # type: ignore[arg-type]
    assert seen == [ChangeInFlight("add routes", 1)]
    assert (tmp_path / ROUTE_SET_FILE).read_bytes() == before and not (tmp_path / CHANGE_FILE).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [ROUTE_SET_FILE]  # no temporary file left
