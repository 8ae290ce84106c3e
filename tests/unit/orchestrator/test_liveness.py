"""Liveness of the serving core: in-flight work expires at its deadline, a reader that stops
reading loses its request, release gives up in bounded time, a degraded route refuses."""

from __future__ import annotations

import asyncio

import pytest

from libs.service.errors import Unavailable
from libs.service.log_limit import LogLimiter
from services.orchestrator.engine.domain import (
    FinishReason,
    GenerationRequest,
    SchedulerConfig,
)
from services.orchestrator.engine.route_events import BatchLostRoute
from services.orchestrator.engine.serving import ServingConfig, ServingEngine, terminal_error
from services.orchestrator.engine.unavailable import route_unavailable
from services.orchestrator.route.route_health import (
    DataPlaneMeter,
    DataPlaneProgress,
    HealthPolicy,
    HealthTracker,
    StageCondition,
    StageProbe,
    counts_as_down,
)
from tests.unit.orchestrator.fakes import FakeClock, FakePipeline
from tests.unit.orchestrator.test_serving import SERVED


def _engine(text_context, pipeline, clock=None, **changes) -> ServingEngine:
    config = ServingConfig(scheduler=SchedulerConfig(output_queue_capacity=2), **changes)
    return ServingEngine(pipeline, SERVED, text_context, config, clock or FakeClock())


async def _real_turns(seconds: float) -> None:
    """Lets the engine's real-time timers fire while its own clock stands still."""
    await asyncio.sleep(seconds)


def test_an_inflight_request_ends_at_its_deadline_even_if_its_batch_never_returns(text_context):
    async def main():
        clock, pipeline = FakeClock(), FakePipeline(2)
        eng = _engine(text_context, pipeline, clock)
        stream = eng.submit(GenerationRequest("a", (5, 6, 7), 50))
        await stream.next()
        pipeline.gate.clear()  # the next batch hangs, as on a stopped stage
        stream2 = eng.submit(GenerationRequest("b", (5, 6, 7), 50, deadline_budget_ns=50_000_000))
        collected = asyncio.get_running_loop().create_task(_collect(stream2))
        clock.advance(0.049)
        await _real_turns(0.15)  # the deadline timer fires, but 1 ms of the budget is left
        before_deadline = collected.done()
        clock.advance(0.001)
        final = (await asyncio.wait_for(collected, 5))[-1]  # wait_for: a hang guard only
        admitted_while_hung = eng.admission.holds("b")
        pipeline.gate.set()
        stream.cancel()
        await eng.wait_idle()
        return before_deadline, final, admitted_while_hung, eng.admission.holds("b")

    before_deadline, final, held_while_hung, held_after = asyncio.run(main())
    assert not before_deadline
    assert final.finish_reason is FinishReason.DEADLINE
    assert held_while_hung and not held_after  # the slot returns once the batch comes back


async def _collect(stream):
    return [o async for o in stream]


def test_a_reader_that_stops_reading_loses_its_request(text_context):
    async def main():
        clock, pipeline = FakeClock(), FakePipeline(2)
        eng = _engine(text_context, pipeline, clock, stall_timeout_s=0.1)
        stream = eng.submit(GenerationRequest("quiet", (5, 6, 7), 500))
        await stream.next()  # then never again
        while eng.scheduler.stalled_requests == 0:  # its stream fills up
            await asyncio.sleep(0.001)
        clock.advance(0.099)
        await _real_turns(0.3)  # the stall timer fires more than once; the clock says not yet
        retired_early = list(eng.retired)
        clock.advance(0.001)
        await asyncio.wait_for(eng.wait_idle(), 5)  # a hang guard only
        return retired_early, list(eng.retired), pipeline.stages.live_kv()

    retired_early, retired, live_kv = asyncio.run(main())
    assert retired_early == []
    assert [(r.request_id, r.finish_reason) for r in retired] == [("quiet", FinishReason.CANCELLED)]
    assert live_kv == [0, 0]


def test_release_gives_up_after_its_budget_and_frees_the_slot(text_context):
    class Unreleasable(FakePipeline):
        attempts = 0

        async def release(self, request_id, publish_token_ids=()):
            self.attempts += 1
            raise route_unavailable("stage 1 is unreachable")

    async def main():
        clock, pipeline = FakeClock(), Unreleasable(2)
        eng = _engine(text_context, pipeline, clock, release_budget_s=0.2)
        events = [o async for o in eng.submit(GenerationRequest("r", (5, 6, 7), 3))]
        while pipeline.attempts < 3:  # retries go on while the clock is within the budget
            await asyncio.sleep(0.01)
        clock.advance(0.199)
        attempts = pipeline.attempts
        while pipeline.attempts == attempts:
            await asyncio.sleep(0.01)
        live_within_budget = eng.admission.snapshot().live_requests
        clock.advance(0.001)
        await asyncio.wait_for(eng.wait_idle(), 5)  # a hang guard only
        return events, live_within_budget, eng.admission.snapshot().live_requests

    events, live_within_budget, live = asyncio.run(main())
    assert events[-1].finish_reason is FinishReason.LENGTH
    assert live_within_budget == 1 and live == 0


def test_a_degraded_route_refuses_with_route_unavailable_and_recovers(text_context):
    async def main():
        eng = _engine(text_context, FakePipeline(2))
        eng.degrade("stage 1 is unresponsive")
        with pytest.raises(Unavailable) as refused:
            eng.submit(GenerationRequest("x", (5, 6, 7), 2))
        eng.recover()
        events = [o async for o in eng.submit(GenerationRequest("y", (5, 6, 7), 2))]
        await eng.close()
        return refused.value, events

    refused, events = asyncio.run(main())
    assert refused.reason == "ROUTE_UNAVAILABLE"
    assert refused.message == "the route is unavailable: stage 1 is unresponsive"
    assert events[-1].finish_reason is FinishReason.LENGTH


def test_a_route_failure_mid_request_is_a_clean_503_not_a_500(text_context):
    class LostRoute(FakePipeline):
        async def submit(self, batch):
            if batch.phase.value == "decode":
                raise route_unavailable("the data plane connection to stage 0 was lost")
            return await super().submit(batch)

    reported = []

    async def main():
        eng = _engine(text_context, LostRoute(2), recovery_timeout_s=0.0)  # no wait for a reload

        eng.events.subscribe(BatchLostRoute, lambda event: reported.append(event.reason))
        events = [o async for o in eng.submit(GenerationRequest("z", (5, 6, 7), 5))]
        await eng.wait_idle()
        return events

    final = asyncio.run(main())[-1]
    error = terminal_error(final)
    assert final.finish_reason is FinishReason.UNAVAILABLE
    assert (error.code.name, error.reason) == ("UNAVAILABLE", "ROUTE_UNAVAILABLE")
    assert reported == ["the route is unavailable: the data plane connection to stage 0 was lost"]


def test_health_tracker_needs_consecutive_misses_to_degrade_and_hits_to_recover():
    tracker = HealthTracker(2, HealthPolicy(failures_to_degrade=2, successes_to_recover=2))
    ready = [StageProbe(0, StageCondition.READY), StageProbe(1, StageCondition.READY)]
    stopped = [StageProbe(0, StageCondition.READY), StageProbe(1, StageCondition.UNRESPONSIVE)]
    assert not tracker.observe(stopped).degraded  # one slow probe is not a fault
    verdict = tracker.observe(stopped)
    assert verdict.degraded and verdict.reason == "stage 1 is unresponsive"
    assert tracker.observe(ready).degraded
    assert not tracker.observe(ready).degraded
    assert tracker.force("the data plane failed").degraded
    assert tracker.observe(ready).degraded and not tracker.observe(ready).degraded


PROGRESSING = DataPlaneProgress(results=12, outstanding=4)
STALLED = DataPlaneProgress(results=0, outstanding=4)
IDLE = DataPlaneProgress(results=0, outstanding=0)


def test_a_slow_probe_counts_against_a_stage_only_when_the_data_plane_made_no_progress():
    assert not counts_as_down(StageCondition.UNRESPONSIVE, PROGRESSING)
    assert counts_as_down(StageCondition.UNRESPONSIVE, STALLED)
    assert counts_as_down(StageCondition.UNRESPONSIVE, IDLE)
    # Progress excuses a late answer, never a stage that is gone, unloaded or failing.
    for condition in (StageCondition.UNREACHABLE, StageCondition.NOT_LOADED,
                      StageCondition.DRAINING, StageCondition.FAILED):
        assert counts_as_down(condition, PROGRESSING)
    assert not counts_as_down(StageCondition.READY, IDLE)


def test_a_starved_stage_that_keeps_returning_results_stays_healthy():
    tracker = HealthTracker(2, HealthPolicy(failures_to_degrade=2))
    slow = [StageProbe(0, StageCondition.UNRESPONSIVE), StageProbe(1, StageCondition.UNRESPONSIVE)]
    for _ in range(50):  # every probe misses its deadline, every round RESULTs come back
        verdict = tracker.observe(slow, PROGRESSING)
        assert not verdict.degraded
        assert verdict.conditions == (StageCondition.READY, StageCondition.READY)


def test_a_stopped_stage_with_work_in_flight_degrades_within_the_detection_bound():
    """SIGSTOP of stage 1: the round in which it stopped may still carry RESULTs sent before
    the stop; after that no RESULT comes back while batches wait, and its probes time out."""
    policy = HealthPolicy(interval_s=0.5, failures_to_degrade=2)
    probe_timeout_s = 1.0
    tracker = HealthTracker(2, policy)
    stopped = [StageProbe(0, StageCondition.READY), StageProbe(1, StageCondition.UNRESPONSIVE)]
    rounds = [PROGRESSING, STALLED, STALLED, STALLED]
    degraded_after = next(n for n, progress in enumerate(rounds, 1)
                          if tracker.observe(stopped, progress).degraded)
    assert tracker.verdict.reason == "stage 1 is unresponsive"
    # Worst case: the stop lands just as a round begins, and each round is a timed-out probe
    # plus the interval. The fault suite's bound for ending every stream is 8 s.
    assert degraded_after == 3
    assert degraded_after * (probe_timeout_s + policy.interval_s) < 8.0


def test_an_idle_stage_that_does_not_answer_its_probe_degrades():
    tracker = HealthTracker(2, HealthPolicy(failures_to_degrade=2))
    silent = [StageProbe(0, StageCondition.UNRESPONSIVE), StageProbe(1, StageCondition.READY)]
    assert not tracker.observe(silent, IDLE).degraded
    verdict = tracker.observe(silent, IDLE)
    assert verdict.degraded and verdict.reason == "stage 0 is unresponsive"


def test_progress_between_misses_resets_the_count_but_a_later_stall_still_degrades():
    tracker = HealthTracker(1, HealthPolicy(failures_to_degrade=2))
    slow = [StageProbe(0, StageCondition.UNRESPONSIVE)]
    assert not tracker.observe(slow, STALLED).degraded
    assert not tracker.observe(slow, PROGRESSING).degraded
    assert not tracker.observe(slow, STALLED).degraded
    assert tracker.observe(slow, STALLED).degraded


def test_the_monitor_reads_the_data_plane_after_each_probe_round():
    from services.orchestrator.route.route_health import RouteHealthMonitor

    async def main():
        rounds, progress, changes = [], [PROGRESSING], []

        async def probe():
            rounds.append(progress[0])
            return [StageProbe(0, StageCondition.UNRESPONSIVE)]

        async def on_change(verdict):
            changes.append((len(rounds), verdict.degraded))

        monitor = RouteHealthMonitor(probe, 1, on_change, HealthPolicy(interval_s=0.001),
                                     progress=lambda: progress[0])
        monitor.start()
        while len(rounds) < 20:
            await asyncio.sleep(0.001)
        assert changes == []  # starved but progressing: twenty late probes, no verdict change
        progress[0] = STALLED
        while not changes:
            await asyncio.sleep(0.001)
        await monitor.stop()
        return changes, rounds

    changes, rounds = asyncio.run(main())
    first_stalled = rounds.index(STALLED) + 1
    assert changes[0] == (first_stalled + 1, True)  # the second stalled round degrades


def test_the_meter_reports_results_served_since_the_last_round_and_the_work_still_out():
    meter = DataPlaneMeter()
    for _ in range(3):
        meter.submitted()
    meter.answered(served=True)
    meter.answered(served=False)  # a RESULT that served nothing, or a failed batch
    assert meter.take() == DataPlaneProgress(results=1, outstanding=1)
    assert meter.take() == DataPlaneProgress(results=0, outstanding=1)
    meter.answered(served=True)
    assert meter.take() == DataPlaneProgress(results=1, outstanding=0)


def test_log_limiter_allows_a_burst_per_window_and_counts_the_rest():
    now = [0.0]
    limiter = LogLimiter(window_s=10, burst=2, clock=lambda: now[0])
    assert [limiter.allow("k") for _ in range(5)] == [0, 0, None, None, None]
    assert limiter.allow("other") == 0
    now[0] = 10.0
    assert limiter.allow("k") == 3  # the three it dropped are reported with the next line
