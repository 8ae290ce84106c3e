"""When a changed set of stage workers earns a re-plan (`--replan-on-change`), with hysteresis.

Pure: each observation of the discovered worker set comes in with the time it was made, and a
decision comes out; no clocks, no I/O. The shell (`pool_discovery.py`) observes on an interval
and calls the re-plan hook when the decision says so.

The policy re-plans only for a change that lasts:
- A set that differs from the one the installed plan was made for becomes the candidate. The
  candidate must be seen unchanged for `settle_s` before it fires; any different observation
  restarts its clock, and seeing the planned set again drops it. So a rolling restart, whose pods
  leave and come back one at a time, never fires: the set keeps moving while it runs and ends
  where it began.
- Two re-plans are at least `min_interval_s` apart, however long a change has settled; a
  settled change waits out the interval, then fires once.
- A set in which some pool has no worker at all never fires: there is nothing to plan onto
  there, and a pool that is briefly empty is the rolling restart of a one-replica pool.
- A re-plan that fails (`replan_failed`) leaves the planned set where it was, so the change is
  tried again once the interval has passed.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

# The worker addresses of each pool, pool order; a pool's addresses as a set (order is the
# shell's business: pool_discovery.stage_order).
WorkerSet = tuple[frozenset[str], ...]


class Verdict(enum.Enum):
    STEADY = "steady"  # the set is the planned one
    SETTLING = "settling"  # a candidate is waiting out its settle window
    HELD = "held"  # settled, but the last re-plan is too recent
    INCOMPLETE = "incomplete"  # some pool has no worker: never re-planned onto
    REPLAN = "replan"  # re-plan onto `workers` now


@dataclass(frozen=True)
class ReplanSettings:
    # How long a changed set must stay the same before it is re-planned onto.
    settle_s: float = 30.0
    # The least time between two re-plans (from one start to the next).
    min_interval_s: float = 120.0

    def __post_init__(self) -> None:
        if self.settle_s < 0 or self.min_interval_s < 0:
            raise ValueError("settle_s and min_interval_s must be >= 0")


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    workers: WorkerSet  # the set observed
    # Seconds until the candidate could fire (settle window or interval left); 0 otherwise.
    wait_s: float = 0.0

    @property
    def replan(self) -> bool:
        return self.verdict is Verdict.REPLAN


class ReplanPolicy:
    """The hysteresis state: the planned set, the candidate and since when, the last re-plan."""

    def __init__(self, settings: ReplanSettings, planned: WorkerSet) -> None:
        self._settings = settings
        self._planned = planned
        self._candidate: WorkerSet | None = None
        self._candidate_since_s = 0.0
        self._last_replan_s: float | None = None
        self._before_replan: WorkerSet = planned

    @property
    def planned(self) -> WorkerSet:
        return self._planned

    def observe(self, now_s: float, workers: Sequence[frozenset[str]]) -> Decision:
        observed = tuple(workers)
        if observed == self._planned:
            self._candidate = None
            return Decision(Verdict.STEADY, observed)
        if observed != self._candidate:
            self._candidate, self._candidate_since_s = observed, now_s
        if any(not pool for pool in observed):
            return Decision(Verdict.INCOMPLETE, observed)
        settle_left = self._candidate_since_s + self._settings.settle_s - now_s
        if settle_left > 0:
            return Decision(Verdict.SETTLING, observed, settle_left)
        interval_left = (0.0 if self._last_replan_s is None
                         else self._last_replan_s + self._settings.min_interval_s - now_s)
        if interval_left > 0:
            return Decision(Verdict.HELD, observed, interval_left)
        self._before_replan, self._planned = self._planned, observed
        self._candidate, self._last_replan_s = None, now_s
        return Decision(Verdict.REPLAN, observed)

    def replan_failed(self) -> None:
        """The last re-plan did not take: the plan is still the one made for the set before it."""
        self._planned = self._before_replan
