"""The pure part of `fornax bench placement`: per-host cost fits, the calibrated split, the ratios.

Each host's decode service per microbatch is fitted, from stages measured in this run, as
`per_layer_s * layers + fixed_s`: in a two-host route in fleet order the first host always owns
the embeddings and the second the final norm and head, so each host's fixed term is its end of
the route. The calibrated split is the planner's own placement search (`services/planner/search.py`)
over those fitted costs: contiguous ranges minimising the bottleneck of stage service and the
measured hop, hosts kept in fleet order. Fitted costs and everything derived from them are
predictions; only the served figures are measurements.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from services.planner.search import Problem, solve


@dataclass(frozen=True)
class StageSample:
    """One stage measured in a warm-up route: its layer count and mean decode service per microbatch."""

    layers: int
    service_s: float


@dataclass(frozen=True)
class HostFit:
    per_layer_s: float
    fixed_s: float
    samples: tuple[StageSample, ...]

    def predict(self, layers: int) -> float:
        return self.per_layer_s * layers + self.fixed_s


def fit_host(samples: tuple[StageSample, ...]) -> HostFit:
    """Least squares over at least two distinct layer counts; a negative slope or intercept is
    clipped to zero (the measurement says the term is below this host's noise)."""
    counts = {s.layers for s in samples}
    if len(counts) < 2:
        raise ValueError(f"a host fit needs samples at two layer counts, got {sorted(counts)}")
    x = np.array([s.layers for s in samples], dtype=np.float64)
    y = np.array([s.service_s for s in samples], dtype=np.float64)
    slope, intercept = (float(v) for v in np.polyfit(x, y, 1))
    if slope < 0:
        slope, intercept = 0.0, float(y.mean())
    elif intercept < 0:
        slope, intercept = float((x * y).sum() / (x * x).sum()), 0.0
    return HostFit(slope, intercept, samples)


def warmup_splits(num_layers: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Layers per host (first, second) of the two warm-up routes: each host at 1 and at L-1 layers."""
    if num_layers < 3:
        raise ValueError(f"fitting per-layer costs needs at least 3 layers, the model has {num_layers}")
    return (1, num_layers - 1), (num_layers - 1, 1)


def ranges_of(counts: tuple[int, ...]) -> list[tuple[int, int]]:
    edges = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def calibrated_ranges(fits: tuple[HostFit, ...], num_layers: int, hop_s: float) -> list[tuple[int, int]]:
    """Contiguous ranges, one per host in fleet order, minimising the predicted bottleneck.

    The first host's fixed term holds the embeddings and the last host's the head, so only
    placements keeping that order are offered to the search: other first or last stages, and
    links other than host i to host i+1, are infeasible (inf)."""
    n, L = len(fits), num_layers
    stage = np.full((n, L + 1, L + 1), np.inf)
    for v, fit in enumerate(fits):
        for a in range(L):
            for b in range(a + 1, L + 1):
                if (a == 0) == (v == 0) and (b == L) == (v == n - 1):
                    stage[v, a, b] = fit.predict(b - a)
    link = np.full((n, n), np.inf)
    for v in range(n - 1):
        link[v, v + 1] = hop_s
    placement = solve(Problem(stage, link, n, n))
    if placement is None:
        raise ValueError(f"no placement of {L} layers over {n} hosts")
    return [(placement.cuts[i], placement.cuts[i + 1]) for i in range(n)]


def predicted_stage_s(fits: tuple[HostFit, ...], ranges: list[tuple[int, int]]) -> list[float]:
    return [fit.predict(b - a) for fit, (a, b) in zip(fits, ranges, strict=True)]


def bottleneck_prediction_error(predicted_s: list[float], measured_s: list[float]) -> float:
    """|measured bottleneck stage time - predicted| / measured, bottlenecks compared as such."""
    measured = max(measured_s)
    if measured <= 0:
        raise ValueError("no stage time was measured")
    return abs(measured - max(predicted_s)) / measured


def tok_s_ratio(calibrated_tok_s: float, even_tok_s: float) -> float:
    if even_tok_s <= 0:
        raise ValueError("the even split served no tokens")
    return calibrated_tok_s / even_tok_s
