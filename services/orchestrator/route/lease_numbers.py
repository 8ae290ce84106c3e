"""Lease numbers (the FNX2 `lease_sequence` extension) belong to a plan generation, not to
one `Route` object.

Stages fence ended leases by number: within a generation a number opens at most once, and a
number below a stage's watermark that is not a gap counts as ended. So every route opened on
a generation must draw from one counter:
- routes in this process share the generation's `LeaseNumbers` (`for_generation`);
- a route that opens its channel raises the counter to stage 0's `lease_sequence_next` (from
  the extension's ACK), so numbering never restarts below what the stages have seen, even when
  this process did not number the earlier leases (an orchestrator restarted onto a running
  generation, or this process's counter collected after its last route closed).
A number that is reused anyway (two processes numbering one generation at once) is refused
by the stage, never served twice: the fence fails closed.
"""

from __future__ import annotations

import weakref


class LeaseNumbers:
    """One generation's lease numbers, in opening order."""

    def __init__(self, start: int = 0) -> None:
        if start < 0:
            raise ValueError("lease numbers start at 0 or above")
        self._next = start

    @property
    def next(self) -> int:
        return self._next

    def take(self) -> int:
        number, self._next = self._next, self._next + 1
        return number

    def raise_to(self, floor: int) -> None:
        """No number below `floor` is handed out from now on (never lowers the counter)."""
        self._next = max(self._next, floor)


# Held by the routes using them: a generation's counter lives while one of its routes does.
_BY_GENERATION: weakref.WeakValueDictionary[str, LeaseNumbers] = weakref.WeakValueDictionary()


def for_generation(plan_generation_id: str) -> LeaseNumbers:
    """The counter every route of this generation in this process shares."""
    numbers = _BY_GENERATION.get(plan_generation_id)
    if numbers is None:
        numbers = LeaseNumbers()
        _BY_GENERATION[plan_generation_id] = numbers
    return numbers
