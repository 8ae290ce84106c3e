"""A stage worker times the batches it serves on the clock its profiles use: under a CPU quota an
interval counts the larger of its wall time and the process CPU time over the quota's cores, so a
stage the route keeps only partly busy reports what it would cost a busy host, as the profile
predicts it. Readings are scripted; nothing is timed."""

from __future__ import annotations

import pytest

from libs.common.kinds import Backend
from libs.profiles.sustained_clock import SUSTAINED, WALL, IntervalClock
from services.stage_worker import runtime as runtime_module
from services.stage_worker.convert import _service_to_pb
from services.stage_worker.runtime import StageRuntime
from services.stage_worker.service_times import ServiceTimes


class Scripted:
    def __init__(self) -> None:
        self.wall, self.cpu, self.throttled = 50.0, 3.0, 7.0

    def advance(self, wall: float, cpu: float, throttled: float = 0.0) -> None:
        self.wall += wall
        self.cpu += cpu
        self.throttled += throttled


def _clock(quota: float) -> tuple[IntervalClock, Scripted]:
    s = Scripted()
    return IntervalClock(quota, wall=lambda: s.wall, cpu=lambda: s.cpu, throttled=lambda: s.throttled), s


def test_an_unthrottled_batch_on_a_half_core_host_costs_twice_its_cpu_time():
    clock, s = _clock(0.5)
    mark = clock.mark()
    s.advance(wall=0.008, cpu=0.008)  # the host was idle: the batch ran at full speed
    assert clock.since(mark) == pytest.approx(0.016)
    assert clock.timing == SUSTAINED


def test_a_batch_the_quota_stopped_costs_its_cpu_time_over_the_quota_not_the_wait():
    """A period of five 10-ms batches under a half-core quota: four run at full speed, the fifth is
    stopped for 50 ms. The host serves five batches per 100 ms, 20 ms each; the fifth's wall time
    (60 ms) would count the wait the other four already count as their share."""
    clock, s = _clock(0.5)
    served = []
    for throttled in (0.0, 0.0, 0.0, 0.0, 0.050):
        mark = clock.mark()
        s.advance(wall=0.010 + throttled, cpu=0.010, throttled=throttled)
        served.append(clock.since(mark))
    assert served == pytest.approx([0.020] * 5)
    assert sum(served) == pytest.approx(0.100)


def test_a_batch_slowed_by_something_else_on_its_cpu_costs_its_wall_time():
    clock, s = _clock(0.5)
    mark = clock.mark()
    s.advance(wall=0.060, cpu=0.008)  # not throttled: another task held the CPU
    assert clock.since(mark) == pytest.approx(0.060)


def test_intervals_are_independent_so_overlapping_ones_each_see_their_own_span():
    clock, s = _clock(0.5)
    first = clock.mark()
    s.advance(wall=0.002, cpu=0.002)
    second = clock.mark()
    s.advance(wall=0.004, cpu=0.004)
    assert clock.since(second) == pytest.approx(0.008)
    assert clock.since(first) == pytest.approx(0.012)


def test_a_host_without_a_quota_times_by_the_wall_clock_and_never_reads_cpu():
    s = Scripted()

    def never() -> float:
        raise AssertionError("the wall clock reads neither CPU nor throttled time")

    clock = IntervalClock(0.0, wall=lambda: s.wall, cpu=never, throttled=never)
    mark = clock.mark()
    s.advance(wall=0.005, cpu=0.040)
    assert clock.since(mark) == pytest.approx(0.005)
    assert clock.timing == WALL


def test_a_negative_quota_is_refused():
    with pytest.raises(ValueError, match="cannot be negative"):
        IntervalClock(-0.5)


def test_the_worker_times_compute_on_its_service_clock_and_queueing_on_the_wall(monkeypatch):
    clock, s = _clock(0.5)

    class Executor:
        def run(self, batch):
            s.advance(wall=0.010, cpu=0.010)
            return "result", "pending"

    monkeypatch.setattr(runtime_module.time, "perf_counter", lambda: s.wall)
    submitted = s.wall
    s.advance(wall=0.003, cpu=0.0)  # waited for the device thread
    result, pending, queue_s, compute_s = runtime_module._timed(Executor(), object(), submitted, clock)
    assert (result, pending) == ("result", "pending")
    assert queue_s == pytest.approx(0.003)
    assert compute_s == pytest.approx(0.020)


def test_health_says_which_clock_the_service_times_use():
    runtime = StageRuntime(Backend.NUMPY, "cpu", 0, service_clock=IntervalClock(0.5))
    assert runtime.service_times.timing == SUSTAINED
    runtime.service_times.observe_decode(0.016, rows=2)
    reply = _service_to_pb(runtime.service_times)
    assert reply.timing == SUSTAINED and reply.decode_service_ns == 16_000_000
    assert _service_to_pb(ServiceTimes()).timing == WALL
    assert StageRuntime(Backend.NUMPY, "cpu", 0).service_times.timing == WALL
