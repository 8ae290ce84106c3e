"""Where a stage's wall time goes, for pipeline-bubble accounting (physical, this host's clock).

Every instant of the stage's life is in exactly one of three states:

- busy: at least one batch is being worked on by this stage (unpack, device queue and compute,
  pack, KV commit);
- waiting for credit: no batch is being worked on, but at least one computed batch is handed to
  the next hop and not yet answered. In FNX2 a batch holds the next hop's credit until its RESULT
  comes back, so this is the stage idling on what is downstream of it;
- waiting for input: nothing is being worked on and nothing is downstream: the stage has no work.

Pure: the clock is injected; the data plane calls the begin/end pairs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class OccupancyTotals:
    busy_ns: int
    input_wait_ns: int
    credit_wait_ns: int


class Occupancy:
    def __init__(self, clock: Callable[[], int] = time.monotonic_ns):
        self._clock = clock
        self._since = clock()
        self._working = 0
        self._handed_off = 0
        self._busy_ns = self._input_ns = self._credit_ns = 0

    def _advance(self) -> None:
        now = self._clock()
        elapsed, self._since = max(0, now - self._since), now
        if self._working:
            self._busy_ns += elapsed
        elif self._handed_off:
            self._credit_ns += elapsed
        else:
            self._input_ns += elapsed

    def begin_work(self) -> None:
        self._advance()
        self._working += 1

    def end_work(self) -> None:
        self._advance()
        self._working = max(0, self._working - 1)

    def begin_handoff(self) -> None:
        self._advance()
        self._handed_off += 1

    def end_handoff(self) -> None:
        self._advance()
        self._handed_off = max(0, self._handed_off - 1)

    def totals(self) -> OccupancyTotals:
        self._advance()
        return OccupancyTotals(self._busy_ns, self._input_ns, self._credit_ns)
