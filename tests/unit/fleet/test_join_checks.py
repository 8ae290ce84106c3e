"""A joined stage worker whose host clock is off beyond the tolerance (even at the reading's
best bound), or that reports no clock, or whose profile fails, is refused with a stable reason;
`fornax host add` then stops it and leaves the serving routes alone."""

from __future__ import annotations

import argparse
from pathlib import Path

import grpc
import pytest

from apps.cli import host as host_cli
from apps.fleet import join_checks
from apps.fleet.join_checks import (
    DEFAULT_CLOCK_TOLERANCE_S,
    ClockReading,
    check_clock,
    clock_reading,
    profile_refusal,
)
from libs.service.errors import FailedPrecondition, Unavailable
from libs.service.fleet_state import ServiceEntry

S = 1_000_000_000


def test_the_offset_is_taken_at_the_midpoint_and_known_to_half_the_round_trip():
    assert clock_reading(100 * S, 400 * S, 102 * S) == ClockReading(299 * S, 1 * S)
    assert clock_reading(100 * S, 99 * S, 100 * S) == ClockReading(-1 * S, 0)
    with pytest.raises(ValueError):
        clock_reading(101 * S, 0, 100 * S)


def test_a_clock_within_the_tolerance_passes_and_one_beyond_is_refused_host_clock_skewed():
    check_clock("epsilon", 1, ClockReading(299 * S, 0), 300)
    check_clock("epsilon", 1, ClockReading(-301 * S, 2 * S), 300)  # may be 299 s off: given the benefit
    with pytest.raises(FailedPrecondition) as behind:
        check_clock("epsilon", 1, ClockReading(-3600 * S, S // 100), 300)
    assert behind.value.reason == "HOST_CLOCK_SKEWED" and "behind" in behind.value.message
    with pytest.raises(FailedPrecondition) as ahead:
        check_clock("epsilon", 1, ClockReading(400 * S, 0), DEFAULT_CLOCK_TOLERANCE_S)
    assert ahead.value.reason == "HOST_CLOCK_SKEWED" and "ahead of" in ahead.value.message


def test_a_worker_that_reports_no_clock_is_refused_host_clock_unknown():
    with pytest.raises(FailedPrecondition) as refused:
        check_clock("epsilon", 0, ClockReading(0, 0), 300)
    assert refused.value.reason == "HOST_CLOCK_UNKNOWN"


class _RpcError(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.RESOURCE_EXHAUSTED

    def details(self):
        return "the stage does not fit in 512 MiB"


@pytest.mark.parametrize(("cause", "carried"), [
    (Unavailable("the artifact builder ended without a result", reason="BUILD_INCOMPLETE"), "BUILD_INCOMPLETE"),
    (_RpcError(), "RESOURCE_EXHAUSTED: the stage does not fit"),
    (OSError("no route to host"), "OSError: no route to host"),
])
def test_a_failed_profile_refuses_the_join_with_its_cause(cause, carried):
    refusal = profile_refusal("epsilon", cause)
    assert refusal.reason == "JOIN_PROFILE_FAILED" and carried in refusal.message


def _joined(tmp_path: Path, monkeypatch, worker_ns: int, profile: bool = False):
    stopped: list = []
    monkeypatch.setattr(join_checks, "read_clock",
                        lambda address, channel: (worker_ns, clock_reading(S, worker_ns, S)))
    monkeypatch.setattr("apps.fleet.host_leave.stop_retired_worker",
                        lambda state_dir, state, worker, grace: stopped.append(worker.name))
    monkeypatch.setattr(host_cli, "read_fleet", lambda state_dir: object())
    args = argparse.Namespace(name="epsilon", clock_tolerance_s=None, profile=profile, checkpoint=str(tmp_path),
                              weights=None)
    entry = ServiceEntry("stage_worker_4", "stage_worker", "198.18.0.6:7001", "198.18.0.6:7002", 4242, "")
    return host_cli._check_joined(args, tmp_path, None, entry, None), stopped  # type: ignore[arg-type]


def test_host_add_stops_a_skewed_worker_and_says_why(tmp_path, monkeypatch, capsys):
    rc, stopped = _joined(tmp_path, monkeypatch, S + 3600 * S)
    assert rc == 1 and stopped == ["stage_worker_4"]
    err = capsys.readouterr().err
    assert "HOST_CLOCK_SKEWED" in err and "the serving routes are unchanged" in err


def test_host_add_passes_a_worker_on_time_and_refuses_one_whose_profile_fails(tmp_path, monkeypatch, capsys):
    rc, stopped = _joined(tmp_path, monkeypatch, S + S // 2)
    assert rc is None and stopped == [] and "+0.500 s" in capsys.readouterr().out

    def fails(*args):
        raise Unavailable("the artifact builder ended without a result", reason="BUILD_INCOMPLETE")

    monkeypatch.setattr(host_cli, "_profile_joined", fails)
    rc, stopped = _joined(tmp_path, monkeypatch, S, profile=True)
    assert rc == 1 and stopped == ["stage_worker_4"]
    assert "JOIN_PROFILE_FAILED" in capsys.readouterr().err


def test_a_negative_clock_tolerance_is_refused_before_anything_starts(tmp_path, capsys):
    args = argparse.Namespace(name="epsilon", clock_tolerance_s=-1.0, state_dir=str(tmp_path))
    assert host_cli.cmd_host_add(args) == 1
    assert "--clock-tolerance-s must be 0 or more" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # not even the hosts lock
