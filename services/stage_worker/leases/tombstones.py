"""Tombstones of released and expired leases, kept for a bounded time (pure, no clock).

A tombstone stops a late or replayed frame from reopening a lease that ended: only a
prefill at sequence 0 can open a lease, so what needs fencing is a stale opening frame
still in transit or retried after the end (over another channel, or racing a release
sent on the control plane). Each tombstone lives `ttl_ns` after its lease ended, then a
watermark passes it. Every tombstone gets the same lifetime and the caller's clock only
moves forward, so expiry order is insertion order: a FIFO, O(1) per lease, and the
table holds only leases that ended within the last `ttl_ns` (memory in proportion to
the end rate times the TTL, not to every lease of the plan generation).
"""

from __future__ import annotations

import collections
from enum import StrEnum


class Tombstone(StrEnum):
    RELEASED = "released"
    EXPIRED = "expired"


class TombstoneTable:
    def __init__(self, ttl_ns: int) -> None:
        if ttl_ns <= 0:
            raise ValueError("tombstone ttl_ns must be positive")
        self.ttl_ns = ttl_ns
        self._entries: dict[str, tuple[Tombstone, int]] = {}
        self._order: collections.deque[tuple[int, str]] = collections.deque()
        self._watermark_ns = 0  # the latest time seen; the clock never moves back here

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, lease_id: str) -> bool:
        return lease_id in self._entries

    def get(self, lease_id: str) -> Tombstone | None:
        entry = self._entries.get(lease_id)
        return None if entry is None else entry[0]

    def add(self, lease_id: str, reason: Tombstone, now_ns: int | None = None) -> None:
        now = self._advance(now_ns)
        expires = now + self.ttl_ns
        self._entries[lease_id] = (reason, expires)
        self._order.append((expires, lease_id))

    def evict(self, now_ns: int | None = None) -> int:
        """Forget tombstones whose time is up; returns how many."""
        now = self._advance(now_ns)
        evicted = 0
        while self._order and self._order[0][0] <= now:
            expires, lease_id = self._order.popleft()
            entry = self._entries.get(lease_id)
            if entry is not None and entry[1] == expires:  # not re-added since
                del self._entries[lease_id]
                evicted += 1
        return evicted

    @property
    def latest_ns(self) -> int:
        """The latest time this table has seen (callers' clocks only move forward)."""
        return self._watermark_ns

    def _advance(self, now_ns: int | None) -> int:
        if now_ns is not None and now_ns > self._watermark_ns:
            self._watermark_ns = now_ns
        return self._watermark_ns
