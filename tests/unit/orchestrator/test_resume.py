"""An orchestrator that restarts serves the route set last committed to its state directory
(routes added since the start in it, drained ones out, the removed routes in its status); a
change whose marker never committed is rolled back to that set; nothing stored, or a set stored
for other stage workers, leaves the configured routes. Decided on recorded store files."""

from __future__ import annotations

import json

from services.orchestrator.route.host_change import RemovalReason
from services.orchestrator.route.resume import ResumeSource, decide_resume
from services.orchestrator.route.route_set_store import (
    CHANGE_FILE,
    ROUTE_SET_FILE,
    RouteSetJournal,
    read_change,
    read_route_set,
)

WORKERS = ("198.18.0.2:7001", "198.18.0.3:7001", "198.18.0.4:7001", "198.18.0.5:7001")
JOINED = "198.18.0.6:7001"
# route_set.json as `fornax host drain delta` then `fornax host add epsilon --apply` leave it.
AFTER_DRAIN_AND_JOIN = {
    "version": 1, "generation": 2,
    "routes": [list(WORKERS[:2]), [JOINED]], "route_groups": [[0, 1], []],
    "drained_workers": [WORKERS[3]], "lost_workers": [], "configured_workers": list(WORKERS),
    "removed": [{"route": list(WORKERS[2:]), "reason": "HOST_DRAINED", "host": WORKERS[3],
                 "detail": f"host {WORKERS[3]} drained"}]}


def _recorded(tmp_path, route_set: dict | None = None, change: dict | None = None):
    if route_set is not None:
        (tmp_path / ROUTE_SET_FILE).write_text(json.dumps(route_set))
    if change is not None:
        (tmp_path / CHANGE_FILE).write_text(json.dumps(change))
    return read_route_set(tmp_path), read_change(tmp_path)


def test_the_committed_set_is_served_with_the_added_route_and_without_the_drained_one(tmp_path):
    decision = decide_resume(WORKERS, *_recorded(tmp_path, AFTER_DRAIN_AND_JOIN))
    assert decision.source is ResumeSource.STORED and not decision.rolled_back
    assert decision.routes == (WORKERS[:2], (JOINED,))
    assert [(r.route, r.reason, r.host) for r in decision.removed] == [
        (WORKERS[2:], RemovalReason.HOST_DRAINED, WORKERS[3])]
    assert decision.committed is not None and decision.committed.generation == 2


def test_a_change_in_flight_that_never_committed_is_rolled_back_to_the_stored_set(tmp_path):
    decision = decide_resume(WORKERS, *_recorded(tmp_path, AFTER_DRAIN_AND_JOIN,
                                                 {"version": 1, "change": "drain a host", "base_generation": 2}))
    assert decision.rolled_back == "drain a host"
    assert decision.source is ResumeSource.STORED and decision.routes == (WORKERS[:2], (JOINED,))


def test_a_marker_left_after_its_commit_is_no_rollback(tmp_path):
    # The crash fell between the commit (the rename to generation 2) and the marker's removal.
    decision = decide_resume(WORKERS, *_recorded(tmp_path, AFTER_DRAIN_AND_JOIN,
                                                 {"version": 1, "change": "add routes", "base_generation": 1}))
    assert decision.rolled_back == "" and decision.routes == (WORKERS[:2], (JOINED,))


def test_a_first_change_that_never_committed_leaves_the_configured_routes(tmp_path):
    decision = decide_resume(WORKERS, *_recorded(tmp_path, None,
                                                 {"version": 1, "change": "drain a host", "base_generation": 0}))
    assert decision.source is ResumeSource.CONFIGURED and decision.rolled_back == "drain a host"
    assert decision.routes == () and decision.committed is None


def test_nothing_stored_or_a_set_of_another_fleet_leaves_the_configured_routes(tmp_path):
    assert decide_resume(WORKERS, None, None).source is ResumeSource.CONFIGURED
    other = ("198.18.0.2:7555", *WORKERS[1:])  # `fornax up` again: the workers bound other ports
    decision = decide_resume(other, *_recorded(tmp_path, AFTER_DRAIN_AND_JOIN))
    assert decision.source is ResumeSource.CONFIGURED and "other stage workers" in decision.why


def test_a_set_stored_before_generations_resumes_only_on_configured_workers(tmp_path):
    older = {"version": 1, "routes": [list(WORKERS[:2])], "route_groups": [[0, 1]], "drained_workers": []}
    assert decide_resume(WORKERS, *_recorded(tmp_path, older)).routes == (WORKERS[:2],)
    unknown = {**older, "routes": [[WORKERS[0], JOINED]]}
    assert decide_resume(WORKERS, *_recorded(tmp_path, unknown)).source is ResumeSource.CONFIGURED


def test_what_a_journal_commits_is_what_a_restart_serves(tmp_path):
    journal = RouteSetJournal(tmp_path, WORKERS)
    journal.begin("drain a host")
    journal((WORKERS[:2],), ())
    journal.begin("add routes")  # the orchestrator dies here: the added route never committed
    decision = decide_resume(WORKERS, read_route_set(tmp_path), read_change(tmp_path))
    assert decision.routes == (WORKERS[:2],) and decision.rolled_back == "add routes"
