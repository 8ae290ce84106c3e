"""The rejoin timeout's pure core: how long each route has been lost (an injected clock, no
waiting), and which lost routes leave the serving set: those lost for at least the timeout,
only while another route serves; a host that answers again before the timeout cancels it."""

from __future__ import annotations

import pytest

from services.orchestrator.route.rejoin_timeout import (
    OFF,
    LostSince,
    RouteObservation,
    RouteWatch,
    decide_rejoin,
)

A, B, C = ("w0", "w1"), ("w2", "w3"), ("w4", "w5")


def serving(route) -> RouteObservation:
    return RouteObservation(route, True)


def lost(route, host) -> RouteObservation:
    return RouteObservation(route, False, host)


def watch(route, lost_for_s: float | None, *, host: str = "w1") -> RouteWatch:
    """A route lost for `lost_for_s` (None: serving)."""
    if lost_for_s is None:
        return RouteWatch(route, True, "", 0.0)
    return RouteWatch(route, False, host, lost_for_s)


def test_a_route_is_lost_from_the_round_its_host_is_first_seen_gone():
    since = LostSince()
    assert since.observe(10.0, [serving(A), serving(B)]) == (watch(A, None), watch(B, None))
    assert since.observe(11.0, [lost(A, "w1"), serving(B)])[0] == watch(A, 0.0)
    assert since.observe(14.5, [lost(A, "w1"), serving(B)])[0] == watch(A, 3.5)


def test_a_host_that_answers_again_cancels_the_timer():
    since = LostSince()
    since.observe(0.0, [lost(A, "w1"), serving(B)])
    since.observe(2.0, [serving(A), serving(B)])  # back before the timeout
    since.observe(3.0, [lost(A, "w1"), serving(B)])  # gone again: counted from here
    watches = since.observe(5.5, [lost(A, "w1"), serving(B)])
    assert watches[0].lost_for_s == 2.5
    assert decide_rejoin(watches, 3.0).drop == ()
    assert decide_rejoin(since.observe(6.0, [lost(A, "w1"), serving(B)]), 3.0).drop == (watch(A, 3.0),)


def test_a_degraded_route_whose_hosts_all_answer_is_not_lost():
    """A worker that came back and is being reloaded: the route is degraded, its host is there."""
    since = LostSince()
    since.observe(0.0, [RouteObservation(A, False, ""), serving(B)])
    watches = since.observe(100.0, [RouteObservation(A, False, ""), serving(B)])
    assert not watches[0].lost and watches[0].lost_for_s == 0.0
    assert decide_rejoin(watches, 3.0).drop == ()


def test_a_route_that_left_the_set_is_forgotten():
    since = LostSince()
    since.observe(0.0, [lost(A, "w1"), serving(B)])
    since.observe(1.0, [serving(B)])  # A was drained meanwhile
    assert since.observe(2.0, [lost(A, "w1"), serving(B)])[0].lost_for_s == 0.0  # a new spell


def test_routes_lost_for_at_least_the_timeout_are_dropped_while_another_serves():
    routes = [watch(A, 3.0), watch(B, None), watch(C, 2.9, host="w5")]
    decision = decide_rejoin(routes, 3.0)
    assert decision.drop == (watch(A, 3.0),) and decision.kept == () and decision.why_kept == ""


def test_several_overdue_routes_leave_together_when_one_serves():
    decision = decide_rejoin([watch(A, 9.0), watch(B, None), watch(C, 4.0, host="w4")], 3.0)
    assert decision.drop == (watch(A, 9.0), watch(C, 4.0, host="w4"))


@pytest.mark.parametrize("routes", [
    [watch(A, 10.0)],  # one route: nothing to hand its streams to
    [watch(A, 10.0), watch(B, 1.0, host="w3")],  # the other route is lost too (not yet overdue)
    [watch(A, 10.0), watch(B, 10.0, host="w3")],  # every route overdue
    [watch(A, 10.0), RouteWatch(B, False, "", 0.0)],  # the other is degraded (being reloaded)
])
def test_an_overdue_route_is_kept_when_no_other_route_serves_and_says_why(routes):
    decision = decide_rejoin(routes, 3.0)
    assert decision.drop == ()
    assert watch(A, 10.0) in decision.kept
    assert "would leave no serving route" in decision.why_kept and "w0>w1" in decision.why_kept


def test_off_drops_nothing_however_long_a_route_is_lost():
    assert decide_rejoin([watch(A, 1e9), watch(B, None)], OFF) == decide_rejoin([], 3.0)
    assert decide_rejoin([watch(A, 1e9), watch(B, None)], OFF).drop == ()
