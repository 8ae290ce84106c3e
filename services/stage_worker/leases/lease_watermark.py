"""Fencing ended leases by their opening order instead of one tombstone each (pure, no clock).

With the negotiated `lease_sequence` extension the gateway numbers the leases of a plan
generation in the order it opens them (0, 1, 2, ...), and every slice of a lease carries its
number. A receiver then needs no per-lease tombstone: a lease may open only once, so every
number at or below the highest one seen is either live, ended, or a *gap* (skipped so far:
a lease still in transit, or one that never reaches this stage because an earlier stage
refused it). A number below the watermark that is neither live nor a gap has ended and
stays fenced for the whole plan generation.

Memory is the gaps, not the leases: numbers arrive nearly in order, so gaps are few and
short-lived. They are bounded anyway: at most `max_gaps`, each kept at most `gap_ttl_ns`
(the oldest are closed first, and a closed gap is fenced like an ended lease).
"""

from __future__ import annotations

import collections


class LeaseWatermark:
    def __init__(self, max_gaps: int, gap_ttl_ns: int) -> None:
        if max_gaps < 0 or gap_ttl_ns <= 0:
            raise ValueError("max_gaps must be >= 0 and gap_ttl_ns positive")
        self.max_gaps, self.gap_ttl_ns = max_gaps, gap_ttl_ns
        self._next = 0  # one above the highest number opened or ended here
        self._gaps: collections.OrderedDict[int, int] = collections.OrderedDict()  # number -> since

    @property
    def watermark(self) -> int:
        return self._next

    @property
    def gaps(self) -> int:
        return len(self._gaps)

    def ended(self, sequence: int) -> bool:
        """True when a lease with this number can no longer open (it opened or was closed)."""
        return sequence < self._next and sequence not in self._gaps

    def consume(self, sequence: int, now_ns: int) -> None:
        """The lease numbered `sequence` opens (or ends unopened): it can never open again.
        The caller checked `ended(sequence)` is False."""
        if sequence < self._next:
            self._gaps.pop(sequence, None)
            return
        first_gap = max(self._next, sequence - self.max_gaps)
        for skipped in range(first_gap, sequence):  # ascending, so the dict stays ordered
            self._gaps[skipped] = now_ns
        self._next = sequence + 1
        self.evict(now_ns)

    def evict(self, now_ns: int) -> int:
        """Close gaps past their lifetime, and the oldest beyond `max_gaps`; returns how many."""
        closed = 0
        while self._gaps:
            number, since = next(iter(self._gaps.items()))
            if len(self._gaps) <= self.max_gaps and now_ns - since < self.gap_ttl_ns:
                break
            del self._gaps[number]
            closed += 1
        return closed
