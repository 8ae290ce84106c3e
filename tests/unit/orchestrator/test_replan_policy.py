"""--replan-on-change hysteresis: a rolling restart never re-plans, a lasting change re-plans once
after its settle window, and re-plans keep their minimum interval."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.orchestrator.route.replan_policy import ReplanPolicy, ReplanSettings, Verdict

SETTLE_S, INTERVAL_S = 30.0, 120.0
W0, W1, W2, W3 = "w-0.pool:50051", "w-1.pool:50051", "w-2.pool:50051", "w-3.pool:50051"


def workers(*names: str) -> tuple[frozenset[str], ...]:
    return (frozenset(names),)


THREE = workers(W0, W1, W2)


def policy(planned=THREE) -> ReplanPolicy:
    return ReplanPolicy(ReplanSettings(SETTLE_S, INTERVAL_S), planned)


def run(p: ReplanPolicy, observations) -> list[Verdict]:
    return [p.observe(t, seen).verdict for t, seen in observations]


def test_a_rolling_restart_never_replans():
    # Each pod leaves for 20 s and comes back, one after the other, observed every 5 s.
    sequence = []
    t = 0.0
    for leaving in (W2, W1, W0):
        for _ in range(4):
            sequence.append((t, workers(*(w for w in (W0, W1, W2) if w != leaving))))
            t += 5
        sequence.append((t, THREE))
        t += 5
    verdicts = run(policy(), sequence + [(t + 600, THREE)])
    assert Verdict.REPLAN not in verdicts
    assert verdicts[-1] is Verdict.STEADY


def test_a_rolling_restart_slower_than_the_window_per_pod_still_never_replans_when_pods_overlap():
    # Pods leave one at a time but the set keeps moving: no shape is held for the settle window.
    shapes = [workers(W0, W1), workers(W0, W1, W2), workers(W0, W2), workers(W0, W1, W2), workers(W1, W2)]
    sequence = [(i * 25.0, shape) for i, shape in enumerate(shapes)]
    assert Verdict.REPLAN not in run(policy(), sequence)


def test_a_lasting_change_replans_once_after_the_settle_window():
    p = policy()
    four = workers(W0, W1, W2, W3)
    verdicts = run(p, [(t, four) for t in (0.0, 10.0, 29.9, 30.0, 40.0, 500.0)])
    assert verdicts == [Verdict.SETTLING, Verdict.SETTLING, Verdict.SETTLING, Verdict.REPLAN,
                        Verdict.STEADY, Verdict.STEADY]
    assert p.planned == four


def test_the_settle_window_restarts_when_the_candidate_moves():
    p = policy()
    assert run(p, [(0.0, workers(W0, W1, W2, W3)), (20.0, workers(W0, W1, W3)),
                   (45.0, workers(W0, W1, W3))]) == [Verdict.SETTLING] * 3
    decision = p.observe(50.0, workers(W0, W1, W3))
    assert decision.replan and decision.workers == workers(W0, W1, W3)


def test_settling_reports_how_long_is_left():
    p = policy()
    p.observe(0.0, workers(W0))
    assert p.observe(12.0, workers(W0)).wait_s == pytest.approx(18.0)


def test_the_minimum_interval_holds_a_second_change_then_it_fires_once():
    p = policy()
    four, five = workers(W0, W1, W2, W3), workers(W0, W1, W2, W3, "w-4.pool:50051")
    assert p.observe(0.0, four).verdict is Verdict.SETTLING
    assert p.observe(30.0, four).replan
    assert p.observe(40.0, five).verdict is Verdict.SETTLING
    held = p.observe(70.0, five)  # settled, but only 40 s after the last re-plan
    assert held.verdict is Verdict.HELD and held.wait_s == pytest.approx(80.0)
    assert p.observe(149.0, five).verdict is Verdict.HELD
    assert p.observe(150.0, five).replan
    assert p.observe(151.0, five).verdict is Verdict.STEADY


def test_a_pool_with_no_workers_is_never_replanned_onto():
    p = ReplanPolicy(ReplanSettings(SETTLE_S, INTERVAL_S), (frozenset({W0}), frozenset({"c-0.cpu:50051"})))
    verdicts = [p.observe(t, (frozenset({W0}), frozenset())).verdict for t in (0.0, 100.0, 1000.0)]
    assert verdicts == [Verdict.INCOMPLETE] * 3


def test_a_failed_replan_keeps_the_old_plan_and_is_retried_after_the_interval():
    p = policy()
    four = workers(W0, W1, W2, W3)
    p.observe(0.0, four)
    assert p.observe(30.0, four).replan
    p.replan_failed()
    assert p.planned == THREE
    assert p.observe(40.0, four).verdict is Verdict.SETTLING  # a fresh candidate
    assert p.observe(70.0, four).verdict is Verdict.HELD
    assert p.observe(150.0, four).replan


def test_negative_windows_are_refused():
    with pytest.raises(ValueError):
        ReplanSettings(-1.0, 0.0)


@given(st.lists(st.tuples(st.floats(0.0, 40.0), st.sets(st.sampled_from((W0, W1, W2, W3)))), max_size=40))
def test_re_plans_are_never_closer_than_the_interval_and_always_settled(steps):
    p, t, replans = policy(), 0.0, []
    seen_since: dict[frozenset[str], float] = {}
    previous = None
    for gap, names in steps:
        t += gap
        observed = workers(*names)
        if observed != previous:
            seen_since = {observed[0]: t}
            previous = observed
        if p.observe(t, observed).replan:
            assert t - seen_since[observed[0]] >= SETTLE_S
            replans.append(t)
    assert all(b - a >= INTERVAL_S for a, b in zip(replans, replans[1:], strict=False))
