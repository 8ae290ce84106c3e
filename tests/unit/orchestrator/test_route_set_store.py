"""The serving route set a host drain leaves is stored whole (no temporary file left), read
back as written, and names routes both by worker address and as FORNAX_ROUTE_GROUPS."""

from __future__ import annotations

import pytest

from services.orchestrator.route.route_set_store import read_route_set, stored_route_set, write_route_set

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


def test_nothing_stored_reads_as_none_and_an_unconfigured_worker_is_refused(tmp_path):
    assert read_route_set(tmp_path) is None
    with pytest.raises(ValueError):
        stored_route_set(WORKERS, [("10.9.9.9:2",)], [])


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
