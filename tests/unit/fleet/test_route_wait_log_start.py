"""A state directory's service logs are appended to by every fleet started from it: the wait for
a new fleet's route reads only the lines its own processes wrote, so an earlier install failure
does not end it."""

from __future__ import annotations

import json

import pytest

from apps.fleet.route_wait import RouteFailed, wait_for_route
from libs.service.fleet_state import FleetState, ServiceEntry

OLD_FAILURE = json.dumps({"event": "route_install_failed", "reason": "MISSING_CALIBRATION", "error": "old fleet"})
NEW_FAILURE = json.dumps({"event": "route_install_failed", "reason": "PLAN_INFEASIBLE", "error": "this fleet"})


def _state(log, start: int) -> FleetState:
    entry = ServiceEntry("orchestrator", "orchestrator", "127.0.0.1:1", "127.0.0.1:2", 1, str(log), log_start=start)
    return FleetState(services=(entry,), api="http://127.0.0.1:9/v1")


def test_the_wait_starts_at_the_log_offset_of_its_own_process(tmp_path):
    log = tmp_path / "orchestrator.log"
    log.write_text(OLD_FAILURE + "\n")
    start = log.stat().st_size
    log.write_text(OLD_FAILURE + "\n" + NEW_FAILURE + "\n")
    with pytest.raises(RouteFailed, match="PLAN_INFEASIBLE"):
        wait_for_route(_state(log, start), 5.0, lambda _: None)


def test_an_earlier_fleets_failure_alone_does_not_end_the_wait(tmp_path):
    log = tmp_path / "orchestrator.log"
    log.write_text(OLD_FAILURE + "\n")
    with pytest.raises(TimeoutError):
        wait_for_route(_state(log, log.stat().st_size), 0.5, lambda _: None)


def test_the_entry_keeps_its_log_offset_through_fleet_json(tmp_path):
    state = _state(tmp_path / "x.log", 123)
    assert FleetState.from_json(state.to_json()).services[0].log_start == 123
