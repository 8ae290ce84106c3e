import itertools
import math

import numpy as np
import pytest

from apps.bench.planner import agreement, random_small_instance
from services.planner import search
from services.planner.costs import build_tables, decode_service_matrix
from services.planner.search import Problem, evaluate, solve


def _problem(inst):
    tables = build_tables(inst.model, inst.inventory, inst.inventory.nodes, inst.target)
    return Problem(decode_service_matrix(tables), tables.link_decode_s, inst.target.min_stages, inst.target.max_stages)


def _all_plans(problem):
    n, L = problem.num_nodes, problem.num_layers
    for k in range(problem.min_stages, min(problem.max_stages, n, L) + 1):
        for nodes in itertools.permutations(range(n), k):
            for cuts in itertools.combinations(range(1, L), k - 1):
                yield nodes, (0, *cuts, L)


def test_bottleneck_equals_brute_force_on_random_instances():
    fraction, feasible = agreement(80, seed=11)
    assert fraction == 1.0
    assert 20 < feasible < 80  # both feasible and infeasible instances were exercised


def test_latency_objective_equals_enumeration():
    rng = np.random.default_rng(3)
    for _ in range(25):
        problem = _problem(random_small_instance(rng))
        found = solve(problem, "latency")
        best = min((evaluate(problem, n, c, np.add) for n, c in _all_plans(problem)), default=math.inf)
        if not math.isfinite(best):
            assert found is None
            continue
        assert found.value == pytest.approx(best, rel=1e-9)
        assert evaluate(problem, found.nodes, found.cuts, np.add) == pytest.approx(found.value, rel=1e-9)


def test_tie_break_keeps_the_optimal_bottleneck_and_minimises_the_pass_time():
    rng = np.random.default_rng(5)
    for _ in range(12):
        problem = _problem(random_small_instance(rng))
        found = solve(problem)
        if found is None:
            continue
        plans = list(_all_plans(problem))
        bottleneck = min(evaluate(problem, n, c) for n, c in plans)
        assert found.value == pytest.approx(bottleneck, rel=1e-9)
        tied = [evaluate(problem, n, c, np.add) for n, c in plans
                if evaluate(problem, n, c) <= bottleneck * (1 + 1e-12)]
        assert evaluate(problem, found.nodes, found.cuts, np.add) == pytest.approx(min(tied), rel=1e-9)
        assert len(set(found.nodes)) == len(found.nodes)
        assert found.cuts[0] == 0 and found.cuts[-1] == problem.num_layers
        assert all(a < b for a, b in itertools.pairwise(found.cuts))


def test_ordered_fleet_is_exact_on_interchangeable_nodes(monkeypatch):
    L, n = 12, 5
    per_layer = np.linspace(1.0, 2.0, L)
    prefix = np.concatenate([[0.0], np.cumsum(per_layer)])
    a, b = np.arange(L + 1)[:, None], np.arange(L + 1)[None, :]
    stage = np.where((b > a) & (b - a <= 5), prefix[b] - prefix[a], np.inf)
    problem = Problem(np.repeat(stage[None], n, axis=0), np.full((n, n), 0.5), 1, 4)
    exact = solve(problem)
    monkeypatch.setattr(search, "EXACT_MAX_NODES", 0)
    monkeypatch.setattr(search, "REFINE_POOL_NODES", 1)  # the ordered DP alone
    ordered = solve(problem)
    assert ordered.value == pytest.approx(exact.value)
    assert "ordered_fleet" in search.method_name(n)


def test_ordered_fleet_never_beats_the_exact_optimum(monkeypatch):
    rng = np.random.default_rng(9)
    problems = [_problem(random_small_instance(rng)) for _ in range(30)]
    exact = [solve(p) for p in problems]
    monkeypatch.setattr(search, "EXACT_MAX_NODES", 0)
    for problem, best in zip(problems, exact, strict=True):
        pooled = solve(problem)  # <= 7 nodes all fit the refinement pool: exact again
        assert (pooled is None) == (best is None)
        if best is not None:
            assert pooled.value == pytest.approx(best.value, rel=1e-9)
    monkeypatch.setattr(search, "REFINE_POOL_NODES", 1)
    for problem, best in zip(problems, exact, strict=True):
        found = solve(problem)
        if best is None:
            assert found is None
        elif found is not None:
            assert found.value >= best.value * (1 - 1e-12)
            assert evaluate(problem, found.nodes, found.cuts) == pytest.approx(found.value)


def test_identical_nodes_take_stages_in_inventory_order():
    from services.planner.search import Problem, canonical, solve

    layers, n = 6, 3
    per_layer = np.full(layers, 1.0)
    prefix = np.concatenate([[0.0], np.cumsum(per_layer)])
    one = np.full((layers + 1, layers + 1), np.inf)
    for a in range(layers + 1):
        for b in range(a + 1, layers + 1):
            one[a, b] = prefix[b] - prefix[a]
    problem = Problem(stage=np.stack([one] * n), link=np.full((n, n), 0.01), min_stages=3, max_stages=3)
    placement = solve(problem)
    assert placement.nodes == (0, 1, 2)
    assert canonical(problem, placement.__class__((2, 0, 1), placement.cuts, placement.value)).nodes == (0, 1, 2)
