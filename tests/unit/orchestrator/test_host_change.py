"""The pure core of `fornax host drain` / `host add`: drain refusals and the layout diff."""

from __future__ import annotations

import pytest

from libs.service.errors import FailedPrecondition, NotFound
from services.orchestrator.route.host_change import decide_drain, diff_layouts

TWO = (("alpha", "beta"), ("gamma", "delta"))


def test_draining_a_host_keeps_the_routes_without_it() -> None:
    decision = decide_drain(TWO, [8, 8], "delta", admitted=5)
    assert decision.leaving == (("gamma", "delta"),)
    assert decision.remaining == (("alpha", "beta"),)
    assert decision.remaining_capacity == 8


def test_a_host_in_no_route_is_refused() -> None:
    with pytest.raises(NotFound) as err:
        decide_drain(TWO, [8, 8], "epsilon", admitted=0)
    assert err.value.reason == "HOST_NOT_SERVING"


def test_draining_the_last_route_is_refused() -> None:
    with pytest.raises(FailedPrecondition) as err:
        decide_drain((("alpha", "beta"),), [8], "beta", admitted=0)
    assert err.value.reason == "DRAIN_LEAVES_NO_ROUTE"


def test_a_host_in_every_route_is_refused() -> None:
    with pytest.raises(FailedPrecondition) as err:
        decide_drain((("alpha", "beta"), ("alpha", "gamma")), [8, 8], "alpha", admitted=0)
    assert err.value.reason == "DRAIN_LEAVES_NO_ROUTE"


def test_draining_below_the_admitted_load_is_refused() -> None:
    with pytest.raises(FailedPrecondition) as err:
        decide_drain(TWO, [8, 8], "alpha", admitted=9)
    assert err.value.reason == "DRAIN_BELOW_ADMITTED_LOAD"
    assert decide_drain(TWO, [8, 8], "alpha", admitted=8).remaining == (("gamma", "delta"),)


def test_capacities_must_match_routes() -> None:
    with pytest.raises(ValueError):
        decide_drain(TWO, [8], "alpha", admitted=0)


def test_a_joining_host_shows_as_an_added_route() -> None:
    diff = diff_layouts(TWO, TWO + (("epsilon",),))
    assert diff.lines() == ("= alpha>beta", "= gamma>delta", "+ epsilon")
    assert not diff.unchanged


def test_a_route_whose_hosts_change_is_removed_and_added() -> None:
    diff = diff_layouts(TWO, (("alpha", "beta"), ("gamma", "delta", "epsilon")))
    assert diff.kept == (("alpha", "beta"),)
    assert diff.removed == (("gamma", "delta"),)
    assert diff.added == (("gamma", "delta", "epsilon"),)


def test_the_same_layout_is_unchanged() -> None:
    assert diff_layouts(TWO, TWO).unchanged
    assert diff_layouts(TWO, tuple(reversed(TWO))).unchanged
