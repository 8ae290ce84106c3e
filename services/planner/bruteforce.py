"""Brute-force placement: every ordered node subset times every contiguous cut.

The reference the search is checked against. It shares no code with the dynamic programme:
stage costs and memory come from direct per-stage sums (`stage_time`, `stage_memory`), not
from the prefix-sum matrices. Exponential; only for small instances.
"""

from __future__ import annotations

import itertools
import math

from services.planner.costs import CostTables, stage_memory, stage_time


def stage_table(tables: CostTables) -> list[list[list[float]]]:
    """[node][a][b] decode service seconds of stage [a, b), inf when it doesn't fit."""
    n, L = len(tables.nodes), tables.num_layers
    out = [[[math.inf] * (L + 1) for _ in range(L + 1)] for _ in range(n)]
    for v in range(n):
        for a in range(L):
            for b in range(a + 1, L + 1):
                if stage_memory(tables, a, b).total_bytes <= int(tables.usable_bytes[v]):
                    out[v][a][b] = stage_time(tables, v, a, b, None).service_s
    return out


def brute_force_bottleneck(tables: CostTables, min_stages: int, max_stages: int) -> float:
    """The smallest bottleneck over all plans (inf when none is feasible)."""
    n, L = len(tables.nodes), tables.num_layers
    stage = stage_table(tables)
    link = tables.link_decode_s.tolist()
    best = math.inf
    for k in range(min_stages, min(max_stages, n, L) + 1):
        cut_sets = [(0, *c, L) for c in itertools.combinations(range(1, L), k - 1)]
        for nodes in itertools.permutations(range(n), k):
            route = max((link[u][v] for u, v in zip(nodes, nodes[1:], strict=False)), default=0.0)
            if route >= best:
                continue
            for cuts in cut_sets:
                value = route
                for i, v in enumerate(nodes):
                    value = max(value, stage[v][cuts[i]][cuts[i + 1]])
                    if value >= best:
                        break
                best = min(best, value)
    return best
