"""Placement search over stage-cost matrices: which ordered nodes, which contiguous cuts.

A plan uses an ordered sequence of distinct nodes v_1..v_k and cuts 0 = c_0 < ... < c_k = L;
stage i runs layers [c_{i-1}, c_i) on v_i. Given `stage[v, a, b]` (inf when infeasible) and
`link[u, v]` (inf when there is no route), the throughput objective is the bottleneck

    B = max( max_i stage[v_i, c_{i-1}, c_i],  max_i link[v_i, v_{i+1}] )

and the latency objective is the sum of the same terms. Both are solved by one dynamic
programme with a different combining operator (`max` or `+`).

Methods:
- `exact_subsets` (up to EXACT_MAX_NODES nodes): DP over (used-node set, last node, layer
  prefix). Exact: every ordered subset and every cut is covered. O(2^n * n * L^2).
- `ordered_fleet` (larger fleets): the same DP restricted to node sequences that are
  subsequences of a candidate node order, with a stage-count dimension; exact within those
  orders. O(orders * max_stages * n * (n + L) * L). Orders tried: fastest-first, and a
  greedy chain along the cheapest routes starting from each of the few fastest nodes. Then
  `exact_subsets` runs on a pool of REFINE_POOL_NODES nodes (those of the best ordered plan,
  topped up with the fastest others). Guarantee: the answer is optimal among all plans whose
  node sequence is a subsequence of a candidate order, and among all plans that use only
  pool nodes; it is never worse than the best single-node plan.

For the throughput objective a second pass breaks ties: among plans whose bottleneck equals
the optimum, it picks the one with the smallest summed pass time (for large fleets, among
plans over subsequences of the chosen nodes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EXACT_MAX_NODES = 10
REFINE_POOL_NODES = 8
TIE_TOLERANCE = 1e-12
Op = np.ufunc  # np.maximum (bottleneck) or np.add (latency); evaluate() also reduces with it


@dataclass(frozen=True)
class Problem:
    stage: np.ndarray  # (n, L+1, L+1)
    link: np.ndarray  # (n, n)
    min_stages: int
    max_stages: int

    @property
    def num_nodes(self) -> int:
        return self.stage.shape[0]

    @property
    def num_layers(self) -> int:
        return self.stage.shape[1] - 1


@dataclass(frozen=True)
class Placement:
    nodes: tuple[int, ...]
    cuts: tuple[int, ...]  # len(nodes) + 1 boundaries, first 0, last L
    value: float


def evaluate(problem: Problem, nodes: tuple[int, ...], cuts: tuple[int, ...], op: Op = np.maximum) -> float:
    terms = [problem.stage[v, cuts[i], cuts[i + 1]] for i, v in enumerate(nodes)]
    terms += [problem.link[u, v] for u, v in zip(nodes, nodes[1:], strict=False)]
    return float(op.reduce(np.array(terms)))


def solve(problem: Problem, objective: str = "throughput") -> Placement | None:
    """Best placement, or None when no placement is feasible."""
    search = _exact_subsets if problem.num_nodes <= EXACT_MAX_NODES else _ordered_fleet
    if objective == "latency":
        found = search(problem, np.add)
        return None if found is None else canonical(problem, found)
    best = search(problem, np.maximum)
    if best is None:
        return None
    limit = best.value * (1 + TIE_TOLERANCE)
    masked = Problem(
        stage=np.where(problem.stage <= limit, problem.stage, np.inf),
        link=np.where(problem.link <= limit, problem.link, np.inf),
        min_stages=problem.min_stages,
        max_stages=problem.max_stages,
    )
    if search is _exact_subsets:
        tied = _exact_subsets(masked, np.add)
    else:  # large fleets: break ties among subsequences of the chosen nodes' order
        tied = _ordered_dp(masked, np.array(best.nodes), np.add)
    if tied is None:  # tolerance edge: keep the min-max answer
        return canonical(problem, best)
    return canonical(problem, Placement(tied.nodes, tied.cuts, evaluate(problem, tied.nodes, tied.cuts)))


def _interchangeable(problem: Problem, u: int, v: int) -> bool:
    """Nodes whose every stage cost and every link are the same: swapping them changes nothing."""
    if not np.array_equal(problem.stage[u], problem.stage[v]) or problem.link[u, v] != problem.link[v, u]:
        return False
    others = [w for w in range(problem.num_nodes) if w not in (u, v)]
    return bool(np.array_equal(problem.link[u, others], problem.link[v, others])
                and np.array_equal(problem.link[others, u], problem.link[others, v]))


def canonical(problem: Problem, placement: Placement) -> Placement:
    """Among placements that differ only by a permutation of interchangeable nodes, the one
    whose nodes follow inventory order: identical machines take stages in the order listed."""
    nodes = list(placement.nodes)
    for i in range(len(nodes)):
        for j in range(i + 1, len(nodes)):
            if nodes[j] < nodes[i] and _interchangeable(problem, nodes[i], nodes[j]):
                nodes[i], nodes[j] = nodes[j], nodes[i]
    return Placement(tuple(nodes), placement.cuts, placement.value)


def method_name(num_nodes: int) -> str:
    if num_nodes <= EXACT_MAX_NODES:
        return "exact_subsets: DP over (node set, last node, layer prefix); proven optimal"
    return ("ordered_fleet: exact DP over node subsequences of candidate orders (fastest-first, "
            f"cheapest-route chains) plus an exact search over a pool of {REFINE_POOL_NODES} nodes; "
            "optimal within those orders and within that pool")


def _extend(row: np.ndarray, link_cost: np.ndarray, stage_w: np.ndarray, op: Op):
    """Best value per end layer b for extending `row[(u, j)]` with a stage on w: (values, u*, j*)."""
    via = op(row, link_cost[:, None])  # (u, j)
    u_best = np.argmin(via, axis=0)
    g = via[u_best, np.arange(via.shape[1])]
    cand = op(g[:, None], stage_w)  # (j, b)
    j_best = np.argmin(cand, axis=0)
    values = cand[j_best, np.arange(cand.shape[1])]
    return values, u_best[j_best], j_best


def _exact_subsets(problem: Problem, op: Op) -> Placement | None:
    n, L = problem.num_nodes, problem.num_layers
    size = 1 << n
    f = np.full((size, n, L + 1), np.inf)
    parent_u = np.full((size, n, L + 1), -1, dtype=np.int16)
    parent_j = np.full((size, n, L + 1), -1, dtype=np.int16)
    for v in range(n):
        f[1 << v, v] = problem.stage[v, 0]
    popcount = np.array([bin(s).count("1") for s in range(size)])
    for s in range(1, size):
        if popcount[s] >= problem.max_stages:
            continue
        members = [v for v in range(n) if s >> v & 1]
        rows = f[s, members]
        if not np.isfinite(rows[:, :L]).any():
            continue
        for w in range(n):
            if s >> w & 1:
                continue
            values, u_idx, j_idx = _extend(rows, problem.link[members, w], problem.stage[w], op)
            t = s | 1 << w
            better = values < f[t, w]
            f[t, w] = np.where(better, values, f[t, w])
            parent_u[t, w] = np.where(better, np.array(members)[u_idx], parent_u[t, w])
            parent_j[t, w] = np.where(better, j_idx, parent_j[t, w])
    allowed = (popcount >= problem.min_stages) & (popcount <= problem.max_stages)
    ends = np.where(allowed[:, None], f[:, :, L], np.inf)
    s, v = (int(i) for i in np.unravel_index(np.argmin(ends), ends.shape))
    if not np.isfinite(ends[s, v]):
        return None
    nodes, cuts = [int(v)], [L]
    b = L
    while popcount[s] > 1:
        u, j = int(parent_u[s, v, b]), int(parent_j[s, v, b])
        s, v, b = s & ~(1 << v), u, j
        nodes.append(v)
        cuts.append(b)
    cuts.append(0)
    return Placement(tuple(reversed(nodes)), tuple(reversed(cuts)), float(ends.min()))


def _ordered_dp(problem: Problem, order: np.ndarray, op: Op) -> Placement | None:
    n, L = len(order), problem.num_layers
    stage = problem.stage[order]
    link = problem.link[np.ix_(order, order)]
    k_max = min(problem.max_stages, n, L)
    f = np.full((k_max + 1, n, L + 1), np.inf)
    parent_u = np.full((k_max + 1, n, L + 1), -1, dtype=np.int32)
    parent_j = np.full((k_max + 1, n, L + 1), -1, dtype=np.int32)
    f[1] = stage[:, 0, :]
    for c in range(2, k_max + 1):
        for v in range(c - 1, n):
            rows = f[c - 1, :v]
            if not np.isfinite(rows[:, :L]).any():
                continue
            f[c, v], parent_u[c, v], parent_j[c, v] = _extend(rows, link[:v, v], stage[v], op)
    ends = f[:, :, L].copy()
    ends[: problem.min_stages] = np.inf
    c, v = (int(i) for i in np.unravel_index(np.argmin(ends), ends.shape))
    if not np.isfinite(ends[c, v]):
        return None
    nodes, cuts, b = [int(v)], [L], L
    while c > 1:
        u, j = int(parent_u[c, v, b]), int(parent_j[c, v, b])
        c, v, b = c - 1, u, j
        nodes.append(v)
        cuts.append(b)
    cuts.append(0)
    real = tuple(int(order[i]) for i in reversed(nodes))
    return Placement(real, tuple(reversed(cuts)), float(ends.min()))


def candidate_orders(problem: Problem, starts: int = 3) -> list[np.ndarray]:
    """Fastest-first, plus greedy cheapest-route chains from the `starts` fastest nodes."""
    L = problem.num_layers
    single = problem.stage[:, np.arange(L), np.arange(1, L + 1)]  # one-layer stages
    finite = np.isfinite(single)
    mean = np.where(finite, single, 0.0).sum(axis=1) / np.maximum(finite.sum(axis=1), 1)
    rank = np.argsort(np.where(finite.any(axis=1), mean, np.inf), kind="stable")
    position = np.empty(problem.num_nodes, dtype=np.int64)
    position[rank] = np.arange(problem.num_nodes)
    orders = [rank]
    for start in rank[:starts]:
        chain, left = [int(start)], set(range(problem.num_nodes)) - {int(start)}
        while left:
            last = chain[-1]
            nxt = min(left, key=lambda w: (problem.link[last, w], position[w]))
            chain.append(nxt)
            left.remove(nxt)
        orders.append(np.array(chain))
    return orders


def _refine(problem: Problem, best: Placement | None, rank: np.ndarray, op: Op) -> Placement | None:
    """Exact search restricted to a small pool: the best plan's nodes, then the fastest others."""
    pool = list(best.nodes) if best is not None else []
    pool = pool[:REFINE_POOL_NODES]
    for v in rank:
        if len(pool) >= REFINE_POOL_NODES:
            break
        if int(v) not in pool:
            pool.append(int(v))
    index = np.array(pool)
    sub = Problem(problem.stage[index], problem.link[np.ix_(index, index)], problem.min_stages, problem.max_stages)
    found = _exact_subsets(sub, op)
    if found is None:
        return None
    return Placement(tuple(pool[i] for i in found.nodes), found.cuts, found.value)


def _ordered_fleet(problem: Problem, op: Op) -> Placement | None:
    best: Placement | None = None
    orders = candidate_orders(problem)
    for order in orders:
        found = _ordered_dp(problem, order, op)
        if found is not None and (best is None or found.value < best.value):
            best = found
    refined = _refine(problem, best, orders[0], op)
    if refined is not None and (best is None or refined.value < best.value):
        best = refined
    return best
