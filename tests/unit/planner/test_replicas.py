"""Replica routes (`services.planner.replicas`) on declared inventories: no timing, predictions only."""

from __future__ import annotations

import pytest

from libs.service.errors import InvalidArgument
from services.planner import domain as d
from services.planner import replicas
from services.planner.inventory import Target
from services.planner.planner import plan, plan_routes
from tests.unit.planner.factories import GIB, full_mesh, node, tiny_model

HALF_CORE_FLOPS = 30e9  # declared: half a core; bandwidth high so compute bounds each stage
MODEL = tiny_model(layers=5, experts=64)  # 5 layers over 4 stages: the 2-layer stage bounds one route


def fleet(memory_bytes: int):
    return full_mesh(*(node(n, compute=HALF_CORE_FLOPS, bandwidth=1e12, memory_gib=memory_bytes / GIB)
                       for n in "abcd"), bandwidth=125e6, latency_ns=50_000)


def target(concurrency: int) -> Target:
    return Target(context_tokens=64, concurrency=concurrency, min_stages=4, max_stages=4, prefill_tokens=16)


def stage_peak(hosts: str, share: int) -> int:
    """The largest stage (weights + KV + buffers + reserve) of one route on `hosts` (roomy) at `share`."""
    roomy = replicas.group_inventory(fleet(64 * GIB), tuple(hosts))
    found = plan(MODEL, roomy, replicas.route_target(target(64), len(hosts), share))
    return max(s.memory_bytes for s in found.plan.stages)


def by_layout(result: d.PlanResult) -> dict[str, d.LayoutCandidate]:
    return {c.layout: c for c in result.route_choice.candidates}


@pytest.fixture(scope="module")
def half_model_hosts():
    """Hosts that hold a stage of a two-stage route at 32 sequences but not the whole model."""
    memory = int(stage_peak("ab", 40) * 1.02)
    assert memory < stage_peak("a", 1), "premise: one host cannot hold the whole model"
    return fleet(memory)


def test_two_routes_beat_one_compute_bound_route_at_concurrency_64(half_model_hosts):
    result = plan_routes(MODEL, half_model_hosts, target(64), None)
    one = by_layout(result)["1 route: a>b>c>d"]
    two = by_layout(result)["2 routes: a>b | c>d"]
    single = plan_routes(MODEL, half_model_hosts, target(64), 1).plan
    stages = single.stages
    assert single.prediction("bottleneck_s") == max(s.decode.service_s for s in stages)  # compute, not wire
    assert max(s.decode.service_s for s in stages) > max(s.decode.wire_s for s in stages)
    assert two.tokens_per_s > one.tokens_per_s
    assert two.shares == (32, 32)
    chosen = result.route_choice.candidates[result.route_choice.chosen]
    assert chosen.routes == 2 and chosen.tokens_per_s == max(c.tokens_per_s for c in result.route_choice.candidates)
    assert [len(r.plan.stages) for r in result.routes] == [2, 2]
    assert result.plan is result.routes[0].plan  # single-route callers see the first route
    assert {s.node for r in result.routes for s in r.plan.stages} == set("abcd")
    assert all(r.plan.prediction("decode_tokens_per_s") > 0 for r in result.routes)
    assert sum(r.plan.prediction("decode_tokens_per_s") for r in result.routes) == pytest.approx(two.tokens_per_s)


@pytest.mark.parametrize("concurrency", [1, 2])
def test_low_concurrency_choice_is_the_models_argmax(half_model_hosts, concurrency):
    result = plan_routes(MODEL, half_model_hosts, target(concurrency), None)
    layouts = by_layout(result)
    one, two = layouts["1 route: a>b>c>d"], layouts["2 routes: a>b | c>d"]
    chosen = result.route_choice.candidates[result.route_choice.chosen]
    assert chosen.tokens_per_s == max(c.tokens_per_s for c in result.route_choice.candidates if c.feasible)
    if concurrency == 1:  # one sequence cannot keep two routes busy
        assert not two.feasible and two.reason == d.CONCURRENCY_BELOW_ROUTES
        assert chosen is one
    else:  # the model's own ordering decides
        assert two.feasible and one.feasible
        expected = one if one.tokens_per_s >= two.tokens_per_s else two
        assert chosen.tokens_per_s == expected.tokens_per_s and chosen.routes == expected.routes


def test_memory_limited_fleet_has_only_one_feasible_route_and_names_memory():
    memory = int(stage_peak("abcd", 64) * 1.02)
    assert memory < stage_peak("ab", 1), "premise: one host cannot hold half the model"
    result = plan_routes(MODEL, fleet(memory), target(64), None)
    feasible = [c for c in result.route_choice.candidates if c.feasible]
    assert [c.layout for c in feasible] == ["1 route: a>b>c>d"]
    assert by_layout(result)["2 routes: a>b | c>d"].reason == d.INSUFFICIENT_MEMORY
    assert "memory" in result.route_choice.explanation and "INSUFFICIENT_MEMORY" in result.route_choice.explanation
    assert len(result.routes) == 1 and len(result.plan.stages) == 4


def _layout(routes: int, tokens: float, band: tuple[float, float]):
    groups = tuple(tuple("abcd"[i::routes]) for i in range(routes))
    return d.LayoutCandidate(f"{routes} routes", routes, groups, True, tokens, band, (1,) * routes)


def test_tie_within_spread_prefers_fewer_routes():
    one, two = _layout(1, 100.0, (90.0, 110.0)), _layout(2, 105.0, (100.0, 112.0))
    choice = replicas.choose_layout([two, one])
    assert choice.candidates[choice.chosen].routes == 1
    assert choice.rule == replicas.FEWER_WITHIN_SPREAD
    assert "within the measured spread" in choice.explanation


def test_outside_spread_the_faster_layout_wins():
    one, two = _layout(1, 100.0, (95.0, 99.0)), _layout(2, 105.0, (100.0, 112.0))
    choice = replicas.choose_layout([one, two])
    assert choice.candidates[choice.chosen].routes == 2
    assert choice.rule == replicas.FASTEST


def test_equal_declared_predictions_prefer_fewer_routes():
    one, two = _layout(1, 100.0, (100.0, 100.0)), _layout(2, 100.0, (100.0, 100.0))
    choice = replicas.choose_layout([two, one])
    assert choice.candidates[choice.chosen].routes == 1


def test_partitions_count_and_bounds():
    assert len(list(replicas.partitions(4))) == 15
    assert len(list(replicas.partitions(4, 2))) == 7
    assert list(replicas.partitions(4, 2))[0] == ((0, 1, 2), (3,))
    assert ((0, 1), (2, 3)) in list(replicas.partitions(4, 2))
    many = full_mesh(*(node(f"n{i}") for i in range(replicas.MAX_ROUTE_HOSTS + 1)))
    with pytest.raises(InvalidArgument) as err:
        plan_routes(MODEL, many, target(64), None)
    assert err.value.reason == d.TOO_MANY_HOSTS_FOR_ROUTES
    with pytest.raises(InvalidArgument) as err:
        plan_routes(MODEL, fleet(64 * GIB), target(64), 5)
    assert err.value.reason == d.BAD_ROUTE_COUNT


def test_proportional_shares_follow_the_weights():
    assert replicas.proportional_shares(64, [3.0, 1.0]) == (48, 16)
    assert sum(replicas.proportional_shares(7, [1.0, 1.0, 5.0])) == 7
    assert min(replicas.proportional_shares(3, [100.0, 1.0, 1.0])) == 1


@pytest.mark.parametrize(("spread", "routes", "rule"), [
    (0.0, 2, replicas.FASTEST),  # runs that agree exactly: the faster layout counts
    (0.05, 2, replicas.FASTEST),  # faster beyond the spread still wins
    (0.3, 2, replicas.FASTEST),  # the bands overlap, but one route's median is below two's band
    (0.8, 1, replicas.FEWER_WITHIN_SPREAD),  # each median within the other's band: fewer routes
])
def test_profiles_spread_decides_between_one_and_two_routes(spread, routes, rule):
    from dataclasses import replace as with_

    from services.planner.profiles import book_from_records
    from tests.unit.planner.test_plan_stability import MODEL as PROFILED
    from tests.unit.planner.test_plan_stability import NOW, TWO, _records

    inventory = full_mesh(node("a"), with_(node("b"), backend="numpy"))
    book = book_from_records(_records(1.0, 1.0, spread))
    result = plan_routes(PROFILED, inventory, with_(TWO, concurrency=16), None, profiles=book, now_unix_ns=NOW)
    choice = result.route_choice
    one, two = by_layout(result)["1 route: a>b"], by_layout(result)["2 routes: a | b"]
    assert two.tokens_per_s > one.tokens_per_s  # the medians' ordering, whatever the spread
    assert one.band_tokens_per_s[0] <= one.tokens_per_s <= one.band_tokens_per_s[1]
    assert (one.band_tokens_per_s[1] - one.band_tokens_per_s[0] > 0) == (spread > 0)
    assert choice.candidates[choice.chosen].routes == routes and choice.rule == rule
    assert len(result.routes) == routes and result.plan.from_profiles


def test_overlapping_bands_are_not_a_tie_unless_each_median_lies_in_the_other():
    # one slow run stretched the two-route band down to 40, so the bands overlap; but two routes'
    # median (105) lies far outside one route's band (45..60): the faster layout stands
    one, two = _layout(1, 50.0, (45.0, 60.0)), _layout(2, 105.0, (40.0, 112.0))
    choice = replicas.choose_layout([one, two])
    assert choice.candidates[choice.chosen].routes == 2 and choice.rule == replicas.FASTEST
    # the same two-route figures with one route's band reaching its median: a tie
    wide = _layout(1, 50.0, (45.0, 106.0))
    choice = replicas.choose_layout([wide, two])
    assert choice.candidates[choice.chosen].routes == 1 and choice.rule == replicas.FEWER_WITHIN_SPREAD
