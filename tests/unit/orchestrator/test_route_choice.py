"""The replica-route choice core: the least loaded serving route takes a request, streams of a
lost route are spread over the routes that serve, and no serving route means no answer."""

from __future__ import annotations

from services.orchestrator.engine.route_choice import (
    RouteLoad,
    Stranded,
    choose_route,
    place_stranded,
    unavailable_detail,
)


def load(index: int, queued: int = 0, free: int = 1000, serving: bool = True) -> RouteLoad:
    return RouteLoad(index, serving, queued, free)


def test_the_route_with_fewest_queued_tokens_takes_the_request():
    assert choose_route([load(0, queued=300), load(1, queued=120), load(2, queued=200)], 50) == 1


def test_more_free_kv_breaks_a_tie_then_route_order():
    assert choose_route([load(0, free=500), load(1, free=900)], 50) == 1
    assert choose_route([load(0), load(1)], 50) == 0


def test_a_route_whose_free_kv_cannot_hold_the_request_is_passed_over():
    # Route 0 is idle but full; route 1 is busier and has room.
    assert choose_route([load(0, queued=0, free=40), load(1, queued=500, free=400)], 100) == 1


def test_when_no_route_has_room_the_least_queued_serving_route_takes_it_anyway():
    # Its own admission then queues or refuses the request by its KV policy.
    assert choose_route([load(0, queued=90, free=10), load(1, queued=30, free=20)], 100) == 1


def test_degraded_or_draining_routes_take_nothing():
    assert choose_route([load(0, serving=False), load(1, queued=10_000, free=0)], 10) == 1


def test_no_serving_route_is_no_answer():
    assert choose_route([load(0, serving=False), load(1, serving=False)], 10) is None
    assert choose_route([], 10) is None


def test_stranded_streams_are_spread_counting_the_ones_already_placed():
    stranded = [Stranded("a", 100), Stranded("b", 100), Stranded("c", 100)]
    placed = place_stranded(stranded, [load(0, serving=False), load(1, queued=50), load(2, queued=100)])
    # a -> 1 (50 < 100); then route 1 holds 150, so b -> 2 (100); then c -> 1 (150 < 200).
    assert placed == {"a": 1, "b": 2, "c": 1}


def test_stranded_streams_wait_when_no_route_serves():
    assert place_stranded([Stranded("a", 10)], [load(0, serving=False), load(1, serving=False)]) == {}


def test_the_refusal_names_every_routes_reason():
    detail = unavailable_detail(["stage 1 is unreachable", None])
    assert detail == "no route serves: route 0: stage 1 is unreachable; route 1: not admitting"
