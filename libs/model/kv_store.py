"""Per-(request, lease) MLA KV cache with FNX2 epoch semantics and a byte limit.

A lease starts with a slice at sequence 0, position 0, epoch 0. Each later slice must carry
the next sequence number, the next position and the current epoch. A successful step
advances the epoch by exactly one; a failed step changes nothing, because new KV rows are
only committed after every layer of the stage has succeeded. Released leases are
tombstoned (bounded table) so that a late slice cannot resurrect them.

One store is shared by the event loop (release on control messages and lease expiry) and
the device thread (check and commit during execution), so every method holds one lock.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from libs.model.errors import KvEpochError, KvLimitExceededError, ReleasedSequenceError, UnknownSequenceError

KvKey = tuple[str, str]  # (request_id, lease_id)


@dataclass(frozen=True)
class KvLayout:
    layer_count: int
    kv_lora_rank: int
    rope_dim: int

    @property
    def bytes_per_token(self) -> int:
        return 4 * self.layer_count * (self.kv_lora_rank + self.rope_dim)


@dataclass(frozen=True)
class SliceIdentity:
    request_id: str
    lease_id: str
    sequence_no: int
    position_start: int
    kv_epoch: int
    row_count: int

    @property
    def key(self) -> KvKey:
        return (self.request_id, self.lease_id)


@dataclass
class SequenceKv:
    latent: np.ndarray   # float32 [layers, capacity, kv_lora_rank]
    k_rope: np.ndarray   # float32 [layers, capacity, rope_dim]
    length: int = 0
    epoch: int = 0
    next_sequence_no: int = 0


@dataclass(frozen=True)
class KvUsage:
    bytes_used: int
    bytes_limit: int
    bytes_high_water: int
    live_sequences: int


def _locked(method):
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return guarded


@dataclass
class KvStore:
    layout: KvLayout
    bytes_limit: int
    tombstone_capacity: int = 65536
    _entries: dict[KvKey, SequenceKv] = field(default_factory=dict)
    _tombstones: OrderedDict = field(default_factory=OrderedDict)
    _high_water: int = 0
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    @_locked
    def usage(self) -> KvUsage:
        used = self.bytes_used()
        return KvUsage(used, self.bytes_limit, self._high_water, len(self._entries))

    @_locked
    def bytes_used(self) -> int:
        return sum(e.length for e in self._entries.values()) * self.layout.bytes_per_token

    @_locked
    def epoch(self, key: KvKey) -> int:
        entry = self._entries.get(key)
        if entry is None:
            raise UnknownSequenceError(f"no KV for request {key[0]!r} lease {key[1]!r}")
        return entry.epoch

    @_locked
    def length(self, key: KvKey) -> int:
        entry = self._entries.get(key)
        return 0 if entry is None else entry.length

    @_locked
    def check(self, ident: SliceIdentity) -> None:
        """Raise if this slice may not run against the current state (nothing changes)."""
        if ident.key in self._tombstones:
            raise ReleasedSequenceError(f"request {ident.request_id!r} lease {ident.lease_id!r} was released")
        if ident.row_count < 1:
            raise KvEpochError(f"request {ident.request_id!r}: a slice needs at least one row")
        entry = self._entries.get(ident.key)
        expected = (0, 0, 0) if entry is None else (entry.next_sequence_no, entry.length, entry.epoch)
        got = (ident.sequence_no, ident.position_start, ident.kv_epoch)
        # FNX2 reason codes: the first field that disagrees names the failure.
        for reason, want, have in zip(("SEQUENCE", "POSITION", "STALE_KV"), expected, got):
            if want != have:
                raise KvEpochError(
                    f"request {ident.request_id!r}: (sequence_no, position, kv_epoch)={got}, expected {expected}",
                    reason=reason,
                )

    @_locked
    def check_batch(self, idents: list[SliceIdentity]) -> None:
        keys = [i.key for i in idents]
        if len(set(keys)) != len(keys):
            raise KvEpochError("a batch holds two slices of the same (request, lease)")
        for ident in idents:
            self.check(ident)
        added = sum(i.row_count for i in idents) * self.layout.bytes_per_token
        used = self.bytes_used()
        if used + added > self.bytes_limit:
            raise KvLimitExceededError(
                f"KV would grow to {used + added} bytes, over the stage limit of {self.bytes_limit} bytes"
            )

    @_locked
    def past(self, key: KvKey, layer: int) -> tuple[np.ndarray, np.ndarray]:
        entry = self._entries.get(key)
        if entry is None:
            empty = np.zeros((0, self.layout.kv_lora_rank), np.float32)
            return empty, np.zeros((0, self.layout.rope_dim), np.float32)
        return entry.latent[layer, : entry.length], entry.k_rope[layer, : entry.length]

    @_locked
    def commit(self, ident: SliceIdentity, latent: np.ndarray, k_rope: np.ndarray) -> int:
        """Append rows ([layers, rows, dim] each) and advance the epoch; returns the new epoch."""
        entry = self._entries.get(ident.key)
        if entry is None:
            entry = self._entries[ident.key] = self._new_entry(ident.row_count)
        end = entry.length + ident.row_count
        if end > entry.latent.shape[1]:
            self._grow(entry, max(end, 2 * entry.latent.shape[1]))
        entry.latent[:, entry.length : end] = latent
        entry.k_rope[:, entry.length : end] = k_rope
        entry.length = end
        entry.epoch += 1
        entry.next_sequence_no += 1
        self._high_water = max(self._high_water, self.bytes_used())
        return entry.epoch

    @_locked
    def release(self, request_id: str, lease_id: str) -> bool:
        """Free a lease's KV and tombstone it; returns whether it held KV."""
        key = (request_id, lease_id)
        existed = self._entries.pop(key, None) is not None
        self._tombstones[key] = True
        while len(self._tombstones) > self.tombstone_capacity:
            self._tombstones.popitem(last=False)
        return existed

    @_locked
    def release_request(self, request_id: str) -> int:
        keys = [k for k in self._entries if k[0] == request_id]
        for key in keys:
            self.release(*key)
        return len(keys)

    def _new_entry(self, rows: int) -> SequenceKv:
        cap = max(16, rows)
        lay = self.layout
        return SequenceKv(
            np.zeros((lay.layer_count, cap, lay.kv_lora_rank), np.float32),
            np.zeros((lay.layer_count, cap, lay.rope_dim), np.float32),
        )

    @staticmethod
    def _grow(entry: SequenceKv, capacity: int) -> None:
        for attr in ("latent", "k_rope"):
            old = getattr(entry, attr)
            new = np.zeros((old.shape[0], capacity, old.shape[2]), np.float32)
            new[:, : entry.length] = old[:, : entry.length]
            setattr(entry, attr, new)
