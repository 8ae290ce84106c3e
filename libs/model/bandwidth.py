"""Memory bandwidth of this host, measured the STREAM way, and the weight bytes a decode step
reads: the two halves of `fornax bench stage --weights`' `weight_read_vs_triad_*` ratios."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import numpy as np

TRIAD_ELEMENTS = 1 << 25  # float64: 256 MiB per array, far beyond any cache


@dataclass(frozen=True)
class Triad:
    bytes_per_s: float   # best of the repeats
    threads: int
    bytes_per_pass: int  # counted traffic of one pass (see `triad`)


def triad(elements: int = TRIAD_ELEMENTS, repeats: int = 5, threads: int | None = None) -> Triad:
    """a = b + s * c over float64 arrays, split across `threads` (numpy releases the GIL). numpy
    runs it as two passes, c * s -> a then a + b -> a, so one pass moves 5 arrays' bytes (read c,
    write a, read a, read b, write a), and that is what is counted."""
    threads = threads or os.cpu_count() or 1
    a, b, c = (np.full(elements, v, dtype=np.float64) for v in (0.0, 1.0, 2.0))
    bounds = np.linspace(0, elements, threads + 1, dtype=np.int64)

    def part(lo: int, hi: int) -> None:
        np.multiply(c[lo:hi], 3.0, out=a[lo:hi])
        np.add(a[lo:hi], b[lo:hi], out=a[lo:hi])

    best = float("inf")
    for _ in range(repeats):
        workers = [threading.Thread(target=part, args=(int(lo), int(hi))) for lo, hi in zip(bounds, bounds[1:],
                                                                                               strict=False)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - start)
    moved = 5 * 8 * elements
    return Triad(moved / best, threads, moved)


def expected_distinct_experts(experts: int, per_token: int, rows: int) -> float:
    """Distinct routed experts a batch of `rows` uniformly routed rows touches."""
    return experts * (1.0 - (1.0 - per_token / experts) ** rows)


def decode_read_bytes(dense_bytes: int, expert_bytes: float, experts: int, per_token: int, rows: int) -> float:
    """Weight bytes one decode step of a layer reads: the dense part, and each routed expert the
    batch touches once."""
    if not experts:
        return float(dense_bytes)
    return dense_bytes + expert_bytes * expected_distinct_experts(experts, per_token, rows)
