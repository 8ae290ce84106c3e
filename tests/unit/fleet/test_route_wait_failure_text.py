"""An install failure logged with a traceback and no error text still ends the wait with what
failed, never with an empty message."""

from __future__ import annotations

import json

import pytest

from apps.fleet.route_wait import RouteFailed, wait_for_route
from libs.service.fleet_state import FleetState, ServiceEntry

TRACEBACK = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in install\n"
             "grpc.aio._call.AioRpcError: status = StatusCode.UNAVAILABLE\n\n")


def _state(log) -> FleetState:
    entry = ServiceEntry("orchestrator", "orchestrator", "127.0.0.1:1", "127.0.0.1:2", 1, str(log))
    return FleetState(services=(entry,), api="http://127.0.0.1:9/v1")


def test_a_failure_with_only_a_traceback_names_its_last_line(tmp_path):
    log = tmp_path / "orchestrator.log"
    log.write_text(json.dumps({"event": "route_install_failed", "exception": TRACEBACK}) + "\n")
    last = r"grpc\.aio\._call\.AioRpcError: status = StatusCode\.UNAVAILABLE"
    with pytest.raises(RouteFailed, match=rf"^INSTALL_FAILED: {last}$"):
        wait_for_route(_state(log), 5.0, lambda _: None)


def test_the_error_text_wins_over_the_traceback(tmp_path):
    log = tmp_path / "orchestrator.log"
    event = {"event": "route_install_failed", "error": "RuntimeError: boom", "exception": TRACEBACK}
    log.write_text(json.dumps(event) + "\n")
    with pytest.raises(RouteFailed, match=r"^INSTALL_FAILED: RuntimeError: boom$"):
        wait_for_route(_state(log), 5.0, lambda _: None)
