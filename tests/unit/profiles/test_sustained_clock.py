"""The profile's clock on a host with a CPU quota: each interval counts the larger of wall time
and process CPU time over the quota. Readings are scripted; nothing is timed."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from libs.profiles.measure import timed_runs
from libs.profiles.schema import HostFacts, ProfileFormatError, StageProfile, stage_profile_from_json, to_json
from libs.profiles.sustained_clock import SUSTAINED, WALL, SustainedClock, profile_clock


class Scripted:
    """Wall and CPU readings advanced by the test."""

    def __init__(self) -> None:
        self.wall = 100.0
        self.cpu = 7.0

    def advance(self, wall: float, cpu: float) -> None:
        self.wall += wall
        self.cpu += cpu


def _clock(quota: float) -> tuple[SustainedClock, Scripted]:
    s = Scripted()
    return SustainedClock(quota, wall=lambda: s.wall, cpu=lambda: s.cpu), s


def test_a_call_that_ran_unthrottled_costs_its_cpu_time_over_the_quota():
    clock, s = _clock(0.5)
    start = clock()
    s.advance(wall=0.015, cpu=0.015)  # fit in what was left of the period
    assert clock() - start == pytest.approx(0.030)


def test_a_call_that_waited_for_the_next_period_costs_its_wall_time():
    clock, s = _clock(0.5)
    start = clock()
    s.advance(wall=0.070, cpu=0.015)  # throttled for 55 ms
    assert clock() - start == pytest.approx(0.070)


def test_each_interval_takes_its_own_larger_term():
    clock, s = _clock(0.5)
    start = clock()
    s.advance(wall=0.070, cpu=0.015)
    clock()
    s.advance(wall=0.015, cpu=0.015)
    assert clock() - start == pytest.approx(0.070 + 0.030)


def test_threads_beyond_the_quota_count_through_process_cpu_time():
    clock, s = _clock(1.5)
    start = clock()
    s.advance(wall=0.010, cpu=0.020)  # two threads on two CPUs, a 1.5-core quota
    assert clock() - start == pytest.approx(0.020 / 1.5)


def test_timed_runs_on_a_throttled_host_give_the_sustained_cost_whatever_the_phase():
    """A call of 15 ms CPU under a half-core quota: some calls wait out the period (wall 70 ms),
    others fit (wall 15 ms). The wall clock's runs scatter with the phase; the sustained clock's
    do not fall below 30 ms, the cost when the host stays busy."""
    clock, s = _clock(0.5)
    walls = iter([0.015, 0.070, 0.015, 0.015, 0.070, 0.015, 0.015, 0.015, 0.015, 0.070] * 10)

    def call() -> None:
        s.advance(wall=next(walls), cpu=0.015)

    samples = timed_runs(call, runs=3, min_run_s=0.0, clock=clock)
    assert all(x >= 0.030 - 1e-12 for x in samples)
    assert {round(x, 3) for x in samples} <= {0.030, 0.070}


def test_a_host_without_a_quota_times_by_the_wall_clock():
    clock, timing = profile_clock(0.0)
    assert clock is time.perf_counter and timing == WALL
    clock, timing = profile_clock(0.5)
    assert isinstance(clock, SustainedClock) and clock.quota_cores == 0.5 and timing == SUSTAINED


@pytest.mark.parametrize("quota", [0.0, -1.0])
def test_a_sustained_clock_refuses_a_missing_quota(quota):
    with pytest.raises(ValueError, match="positive CPU quota"):
        SustainedClock(quota)


def _profile(**changes) -> StageProfile:
    host = HostFacts(host="beta", cpu_model="AMD EPYC", cpu_quota_cores=0.5, cpuset="1", memory_limit_bytes=0)
    base = StageProfile(host=host, worker="spiffe://fornax/stage/stage-1", backend="numpy",
                        backend_build="numpy 2.4.6", device="cpu", model_snapshot="sha256:" + "0" * 64,
                        dtype="float32", context_tokens=512, concurrency=32, kinds=(), command="fornax profile",
                        measured_unix_ns=1, valid_for_s=60)
    return replace(base, **changes)


def test_a_profile_records_how_it_was_timed_and_an_older_one_reads_as_wall():
    sustained = _profile(timing=SUSTAINED)
    again = stage_profile_from_json(to_json(sustained))
    assert again.timing == SUSTAINED
    assert "process CPU time / the 0.5-core quota" in again.timing_label
    older = to_json(_profile()).replace(b',"timing":"wall"', b"")
    assert b"timing" not in older
    assert stage_profile_from_json(older).timing == WALL
    assert stage_profile_from_json(older).timing_label == "timed by the wall clock"


def test_an_unknown_timing_is_refused():
    with pytest.raises(ProfileFormatError, match="timing 'cpu'"):
        _profile(timing="cpu")
