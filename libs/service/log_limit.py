"""Rate limit for repetitive log events, so a failing dependency cannot flood the logs.

A retry loop against a dead peer would otherwise log one line (or a traceback) per attempt.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class LogLimiter:
    """At most `burst` events per key in each `window_s`; counts what it suppressed."""

    def __init__(self, window_s: float = 10.0, burst: int = 3,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._window_s = window_s
        self._burst = burst
        self._clock = clock
        self._windows: dict[str, tuple[float, int, int]] = {}  # key -> (start, sent, suppressed)

    def allow(self, key: str) -> int | None:
        """None when this event should be dropped; otherwise how many were dropped before it
        (to log alongside it)."""
        now = self._clock()
        start, sent, suppressed = self._windows.get(key, (now, 0, 0))
        if now - start >= self._window_s:
            start, sent = now, 0
        if sent >= self._burst:
            self._windows[key] = (start, sent, suppressed + 1)
            return None
        self._windows[key] = (start, sent + 1, 0)
        return suppressed
