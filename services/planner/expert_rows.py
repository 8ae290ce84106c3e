"""A MoE layer's decode time between its measured batch sizes. Pure.

A routed MoE layer reads the weights of every distinct expert its rows route to, and at a few
rows that read is most of its time. The number of distinct experts grows fast and then saturates
(16 experts, top 4: 4 at one row, 8.6 at 2.67 rows, 14.4 at 8, 16 at 32), so the time between
the profile's batches (1, 8, 32) is concave in the rows, and a straight line between 1 and 8
reads the microbatches a route serves (a few rows each) low: on this project's half-core numpy
host, 9.1 ms per layer predicted at 2.67 rows against about 13.5 served (`fornax bench placement
--every-split`, per MoE layer added to the host's stage).

The shape here is `t(r) = a + b*r + c*D(r)`: a fixed cost, a per-row cost (attention, shared
experts, router) and a per-distinct-expert cost, with `D(r)` the expected distinct experts of
`r` rows each routing to `top_k` of `experts` uniformly. Its coefficients are the least-squares
fit to the measured points with none below zero (a negative cost is noise, not a shape). Between
two measured batch sizes the prediction follows that shape, anchored to both measured medians, so
it reproduces every measured point exactly and only the path between them changes; beyond the
measured batches it is the straight end segment that `measured.interpolate` uses, as is any
table the shape cannot describe (fewer than three points, or a fit flat between two points).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from itertools import combinations

import numpy as np

from libs.profiles import schema
from services.planner.costs import expected_distinct_experts


def expected_distinct(experts: int, top_k: int) -> Callable[[float], float]:
    """D(r): expected distinct experts that `r` rows each routing to `top_k` of `experts` reach."""
    if experts <= 0 or not 0 < top_k <= experts:
        raise ValueError(f"a routed layer needs 0 < top_k <= experts, got top_k={top_k}, experts={experts}")
    return partial(expected_distinct_experts, experts, top_k)


def nonnegative_fit(design: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: the best of the fits on each subset of the
    columns whose coefficients all come out >= 0 (exact for the few columns used here)."""
    columns = design.shape[1]
    best, best_residual = np.zeros(columns), float(np.sum(y ** 2))
    for size in range(1, columns + 1):
        for subset in combinations(range(columns), size):
            coef = np.linalg.lstsq(design[:, subset], y, rcond=None)[0]
            if np.any(coef < 0):
                continue
            residual = float(np.sum((design[:, subset] @ coef - y) ** 2))
            if residual < best_residual:
                best, best_residual = np.zeros(columns), residual
                best[list(subset)] = coef
    return best


def expert_shaped(table: dict[int, schema.Figure], rows: float, distinct: Callable[[float], float],
                  straight: Callable[[dict[int, schema.Figure], float], float]) -> float:
    """The median at `rows` between two measured batch sizes along the fitted shape (module doc);
    `straight(table, rows)` outside them or where the shape says nothing."""
    points = sorted((float(b), f.median) for b, f in table.items())
    xs = [x for x, _ in points]
    if len(points) < 3 or rows <= xs[0] or rows >= xs[-1]:
        return straight(table, rows)
    design = np.array([[1.0, x, distinct(x)] for x in xs])
    _, per_row, per_expert = nonnegative_fit(design, np.array([y for _, y in points]))

    def shape(r: float) -> float:
        return per_row * r + per_expert * distinct(r)

    upper = int(np.searchsorted(xs, rows))
    (x0, y0), (x1, y1) = points[upper - 1], points[upper]
    span = shape(x1) - shape(x0)
    if span <= 0:
        return straight(table, rows)
    return y0 + (y1 - y0) * (shape(rows) - shape(x0)) / span
