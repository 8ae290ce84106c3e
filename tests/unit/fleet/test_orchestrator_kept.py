"""`fornax up` keeps its orchestrator: one that crashed (kill -9) is started again by the
supervisor, on its ports, HTTP included, and the fleet stays up; one that exited on purpose, or
any other service that exited, stops the fleet; a stage worker never does."""

from __future__ import annotations

import signal

from apps.cli.fleet import fleet_stops_for
from apps.fleet.supervisor import KEPT_KINDS, PORT_ENV


def test_a_crashed_orchestrator_is_restarted_and_the_fleet_stays_up():
    assert "orchestrator" in KEPT_KINDS and PORT_ENV["http"] == "FORNAX_HTTP_PORT"
    assert not fleet_stops_for("orchestrator", -signal.SIGKILL)
    assert not fleet_stops_for("orchestrator", 1)
    assert not fleet_stops_for("orchestrator", None)


def test_an_orchestrator_that_exited_on_purpose_or_another_service_stops_the_fleet():
    assert fleet_stops_for("orchestrator", 0)
    assert fleet_stops_for("orchestrator", -signal.SIGTERM)
    assert fleet_stops_for("planner", -signal.SIGKILL)
    assert not fleet_stops_for("stage_worker", -signal.SIGKILL)
    assert not fleet_stops_for("stage_worker", 0)
