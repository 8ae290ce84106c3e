"""A Prometheus counter fed from running totals kept elsewhere (a block pool, a stage's GetHealth).

Prometheus counters only go up by increments; sources such as a stage's block pool keep their
own running totals. Each look adds what a total grew since the previous look at the same source.
A new source (a reloaded stage's fresh pool) counts from zero, and so does a total that went
down (its source restarted unseen), which is how Prometheus treats a counter reset anyway.
"""

from __future__ import annotations

from prometheus_client import Counter


class CounterMirror:
    def __init__(self, counter: Counter) -> None:
        self._counter = counter
        self._seen: dict[tuple[tuple[str, ...], str], int] = {}

    def observe(self, labels: tuple[str, ...], total: int, source: str = "") -> int:
        """Adds the growth of `total` since the last look at (`labels`, `source`); returns it."""
        last = self._seen.get((labels, source), 0)
        grown = total - last if total >= last else total
        self._seen[(labels, source)] = total
        if grown:
            self._counter.labels(*labels).inc(grown)
        return grown
