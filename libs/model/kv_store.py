"""Per-(request, lease) MLA KV cache in fixed-size token blocks, with FNX2 epoch semantics.

Rows live in blocks of KV_BLOCK_TOKENS tokens (`libs.model.kv_blocks`); each lease holds a
block table. A lease starts at sequence 0, epoch 0 and position 0, or at the end of a
reused prefix: `attach_prefix` pins the resident blocks of a prompt's prefix chain at
admission, and the lease's first slice may then start at any whole block of that prefix.
Each later slice must carry the next sequence number, the next position and the current
epoch. A successful step advances the epoch by exactly one; a failed step changes nothing,
because new KV rows are only committed after every layer of the stage has succeeded.
Committed full blocks of the prompt are published under their prefix hash (and, when a
lease ends, those of its output too: `publish_chain`); reused blocks
are shared read-only (a lease only ever writes blocks it allocated). Released leases are
tombstoned (bounded table) so that a late slice cannot resurrect them.

One store is shared by the event loop (release on control messages and lease expiry) and
the device thread (check and commit during execution), so every method holds one lock.
"""

from __future__ import annotations

import functools
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from libs.fnx2 import SequenceSlice, bf16_to_float32, float32_to_bf16
from libs.model.errors import (
    KvEpochError,
    KvLimitExceededError,
    ReleasedSequenceError,
    UnknownSequenceError,
)
from libs.model.fp8 import decode_e4m3, encode_e4m3, finite_amax, power_of_two_scale, requantize
from libs.model.kv_blocks import KV_BLOCK_TOKENS, KV_DTYPES, BlockPool, KvFormat, PoolStats, blocks_for, kv_format

KvKey = tuple[str, str]  # (request_id, lease_id)


# KV element types a stage may store (part of the stage contract, `KV_DTYPES`): fp32 is the
# reference; bf16 keeps bf16 bit patterns (round to nearest even) and widens them to float32 when
# read; fp8 keeps the latent as e4m3 codes with one power-of-two float32 scale per (block, layer)
# and the rope key as bf16.
#
# fp8 scale rule: a block's scale is the smallest power of two s with amax / s <= 448 over the
# latent rows written to the block so far (one scale per layer). The first write to a block
# sets it; a later row whose magnitude needs a larger scale raises it and requantizes the
# block's earlier rows to the new scale. A power-of-two ratio makes that requantization exact
# for every value that stays in e4m3's normal range; one that drops into the subnormals is
# rounded again by at most half a subnormal step of the new scale. Since each raise at least
# doubles the scale, a stored value x never errs by more than 2^-4 |x| (its first rounding) plus
# 2^-9 * S, S the block's final scale (the sum of the half steps of every later scale).


@dataclass(frozen=True)
class KvLayout:
    layer_count: int
    kv_lora_rank: int
    rope_dim: int
    dtype: str = "fp32"

    def __post_init__(self) -> None:
        kv_format(self.dtype)

    @property
    def format(self) -> KvFormat:
        return KV_DTYPES[self.dtype]

    def block_bytes(self, block_tokens: int = KV_BLOCK_TOKENS) -> int:
        """Exact bytes of one block of every layer: rows plus the per-block scales."""
        return self.format.block_bytes(self.kv_lora_rank, self.rope_dim, self.layer_count, block_tokens)

    @property
    def bytes_per_token_exact(self) -> Fraction:
        """Bytes a token costs in full blocks: block bytes / block tokens (fp8: not whole)."""
        return Fraction(self.block_bytes(), KV_BLOCK_TOKENS)

    @property
    def bytes_per_token(self) -> int:
        """`bytes_per_token_exact` rounded up: a per-row bound where whole bytes are needed."""
        return math.ceil(self.bytes_per_token_exact)


def kv_slice(request_id: str, lease_id: str, sequence_no: int, position_start: int, kv_epoch: int,
             row_count: int) -> SequenceSlice:
    """The FNX2 slice of what the KV store reads (its lease identity, sequence number, position,
    epoch and rows), for callers that run an executor without a channel: parity, profiling,
    benches and tests. A stage worker hands the executor the slices of the BATCH it received."""
    return SequenceSlice(request_id, sequence_no, 0, row_count, position_start, kv_epoch, 0, lease_id, "", "")


@dataclass
class LeaseKv:
    blocks: list[int]        # block table: block i holds positions [i*B, (i+1)*B)
    length: int = 0
    epoch: int = 0
    next_sequence_no: int = 0
    chain: tuple[bytes, ...] = ()  # prefix hashes of the prompt's full blocks (to publish)
    published: int = 0       # leading blocks already published or shared


@dataclass
class PinnedPrefix:
    """Blocks of a resident prefix held for a lease between admission and its first slice."""

    blocks: list[int]
    chain: tuple[bytes, ...]


@dataclass(frozen=True)
class KvUsage:
    bytes_used: int
    bytes_limit: int
    bytes_high_water: int
    live_sequences: int
    blocks: PoolStats | None = None
    block_tokens: int = KV_BLOCK_TOKENS


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
    block_tokens: int = KV_BLOCK_TOKENS
    _entries: dict[KvKey, LeaseKv] = field(default_factory=dict)
    _pinned: dict[KvKey, PinnedPrefix] = field(default_factory=dict)
    _tombstones: OrderedDict = field(default_factory=OrderedDict)
    _high_water: int = 0
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.pool = BlockPool(max(1, self.bytes_limit // self.block_bytes))
        lay = self.layout
        self._dtype = lay.dtype
        latent_dtype = {"fp32": np.float32, "bf16": np.uint16, "fp8": np.uint8}[lay.dtype]
        rope_dtype = np.float32 if lay.dtype == "fp32" else np.uint16
        # Storage grows (doubling) as the pool hands out higher block ids: a large limit
        # costs nothing until it is used.
        self._latent = np.zeros((lay.layer_count, 0, self.block_tokens, lay.kv_lora_rank), latent_dtype)
        self._k_rope = np.zeros((lay.layer_count, 0, self.block_tokens, lay.rope_dim), rope_dtype)
        # fp8: one latent scale per (layer, block); empty for the unscaled dtypes.
        self._scale = np.ones((lay.layer_count, 0), np.float32)

    @property
    def block_bytes(self) -> int:
        return self.layout.block_bytes(self.block_tokens)

    @_locked
    def usage(self) -> KvUsage:
        used = self.bytes_used()
        return KvUsage(used, self.bytes_limit, self._high_water, len(self._entries), self.pool.stats(),
                       self.block_tokens)

    @_locked
    def bytes_used(self) -> int:
        """Bytes of the blocks live leases hold (cached, unreferenced blocks are reclaimable)."""
        return self.pool.referenced() * self.block_bytes

    @_locked
    def bytes_allocated(self) -> int:
        """Bytes of the storage arrays as grown so far (what the store may hold resident)."""
        return int(self._latent.nbytes + self._k_rope.nbytes + self._scale.nbytes)

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
    def attach_prefix(self, key: KvKey, chain: tuple[bytes, ...]) -> int:
        """Pin the longest resident prefix of `chain` for a lease that has no KV yet.

        Returns the tokens pinned; the lease's first slice may start at any whole block of
        them. Called again (a repeated admission), it keeps what it pinned first.
        """
        if key in self._tombstones:
            raise ReleasedSequenceError(f"request {key[0]!r} lease {key[1]!r} was released")
        if key in self._entries:
            raise KvEpochError(f"request {key[0]!r}: the lease already holds KV", reason="PREFIX_LATE")
        pinned = self._pinned.get(key)
        if pinned is None:
            pinned = self._pinned[key] = PinnedPrefix(self.pool.match(chain), tuple(chain))
        return len(pinned.blocks) * self.block_tokens

    @_locked
    def check(self, ident: SequenceSlice) -> None:
        """Raise if this slice may not run against the current state (nothing changes)."""
        if ident.identity in self._tombstones:
            raise ReleasedSequenceError(f"request {ident.request_id!r} lease {ident.execution_lease_id!r} was released")
        if ident.input_row_count < 1:
            raise KvEpochError(f"request {ident.request_id!r}: a slice needs at least one row")
        entry = self._entries.get(ident.identity)
        if (entry is None and ident.identity in self._pinned and ident.token_position_start != 0
                and (ident.request_sequence_no, ident.kv_epoch) == (0, 0)):
            self._check_prefix_start(ident)
            return
        expected = (0, 0, 0) if entry is None else (entry.next_sequence_no, entry.length, entry.epoch)
        got = (ident.request_sequence_no, ident.token_position_start, ident.kv_epoch)
        # FNX2 reason codes: the first field that disagrees names the failure.
        for reason, want, have in zip(("SEQUENCE", "POSITION", "STALE_KV"), expected, got, strict=True):
            if want != have:
                raise KvEpochError(
                    f"request {ident.request_id!r}: (sequence_no, position, kv_epoch)={got}, expected {expected}",
                    reason=reason,
                )

    def _check_prefix_start(self, ident: SequenceSlice) -> None:
        held = len(self._pinned[ident.identity].blocks) * self.block_tokens
        if ident.token_position_start % self.block_tokens or ident.token_position_start > held:
            raise KvEpochError(
                f"request {ident.request_id!r}: a first slice at position {ident.token_position_start} needs a "
                f"whole-block prefix this stage holds ({held} tokens in blocks of {self.block_tokens})",
                reason="PREFIX_POSITION",
            )

    @_locked
    def check_batch(self, idents: list[SequenceSlice]) -> None:
        keys = [i.identity for i in idents]
        if len(set(keys)) != len(keys):
            raise KvEpochError("a batch holds two slices of the same (request, lease)")
        for ident in idents:
            self.check(ident)
        needed = sum(self._new_blocks(i) for i in idents)
        if needed > self.pool.available():
            raise KvLimitExceededError(
                f"KV needs {needed} more blocks of {self.block_tokens} tokens, {self.pool.available()} of "
                f"{self.pool.total_blocks} are free (stage limit {self.bytes_limit} bytes)"
            )

    def _new_blocks(self, ident: SequenceSlice) -> int:
        entry = self._entries.get(ident.identity)
        held = blocks_for(ident.token_position_start, self.block_tokens) if entry is None else len(entry.blocks)
        return max(0, blocks_for(ident.token_position_start + ident.input_row_count, self.block_tokens) - held)

    @_locked
    def past(self, ident: SequenceSlice, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """The rows before this slice's position for one layer (copies, [rows, dim])."""
        entry = self._entries.get(ident.identity)
        if entry is not None:
            blocks, length = entry.blocks, entry.length
        else:
            pinned = self._pinned.get(ident.identity)
            length = ident.token_position_start if pinned is not None else 0
            blocks = pinned.blocks[: length // self.block_tokens] if pinned is not None else []
        if not blocks:
            empty = np.zeros((0, self.layout.kv_lora_rank), np.float32)
            return empty, np.zeros((0, self.layout.rope_dim), np.float32)
        table = np.asarray(blocks, dtype=np.intp)
        latent = np.take(self._latent[layer], table, axis=0).reshape(-1, self.layout.kv_lora_rank)[:length]
        k_rope = np.take(self._k_rope[layer], table, axis=0).reshape(-1, self.layout.rope_dim)[:length]
        if self._dtype == "bf16":
            return bf16_to_float32(latent), bf16_to_float32(k_rope)
        if self._dtype == "fp8":
            scale = np.repeat(self._scale[layer, table], self.block_tokens)[:length, None]
            return decode_e4m3(latent) * scale, bf16_to_float32(k_rope)
        return latent, k_rope

    @_locked
    def commit(self, ident: SequenceSlice, latent: np.ndarray, k_rope: np.ndarray) -> int:
        """Append rows ([layers, rows, dim] each) and advance the epoch; returns the new epoch.

        A lease released while its step ran (release comes from the event loop) stays released:
        nothing is stored and its epoch is returned unchanged.
        """
        if ident.identity in self._tombstones:
            return ident.kv_epoch
        entry = self._entries.get(ident.identity)
        if entry is None:
            entry = self._open(ident)
        end = entry.length + ident.input_row_count
        added: list[int] = []
        try:
            while len(entry.blocks) * self.block_tokens < end:
                block = self.pool.allocate()
                added.append(block)
                entry.blocks.append(block)
        except KvLimitExceededError:
            for block in added:
                entry.blocks.pop()
                self.pool.release(block)
            raise
        self._ensure_storage(self.pool.high_block)
        self._write(entry, latent, k_rope)
        entry.length = end
        entry.epoch += 1
        entry.next_sequence_no += 1
        self._publish(entry)
        self._high_water = max(self._high_water, self.bytes_used())
        return entry.epoch

    def _open(self, ident: SequenceSlice) -> LeaseKv:
        pinned = self._pinned.pop(ident.identity, None)
        if pinned is None:
            entry = LeaseKv([])
        else:
            keep = ident.token_position_start // self.block_tokens
            for block in pinned.blocks[keep:]:
                self.pool.release(block)
            entry = LeaseKv(pinned.blocks[:keep], ident.token_position_start, chain=pinned.chain, published=keep)
        self._entries[ident.identity] = entry
        return entry

    def _write(self, entry: LeaseKv, latent: np.ndarray, k_rope: np.ndarray) -> None:
        if self._dtype == "bf16":
            latent = float32_to_bf16(latent)
        if self._dtype != "fp32":
            k_rope = float32_to_bf16(k_rope)
        rows = latent.shape[1]
        position = entry.length
        done = 0
        while done < rows:
            block = entry.blocks[position // self.block_tokens]
            offset = position % self.block_tokens
            take = min(self.block_tokens - offset, rows - done)
            if self._dtype == "fp8":
                self._write_fp8(block, offset, latent[:, done : done + take])
            else:
                self._latent[:, block, offset : offset + take] = latent[:, done : done + take]
            self._k_rope[:, block, offset : offset + take] = k_rope[:, done : done + take]
            position += take
            done += take

    def _write_fp8(self, block: int, offset: int, rows: np.ndarray) -> None:
        """Encode new latent rows ([layers, take, rank]) into `block` at `offset` (the scale rule
        in the module comment); earlier rows of the block are requantized if the scale grows."""
        needed = power_of_two_scale(finite_amax(rows, axis=(1, 2)))  # [layers]
        if offset == 0:
            scale = needed
        else:
            old = self._scale[:, block]
            scale = np.maximum(old, needed)
            grown = np.flatnonzero(scale > old)
            for layer in grown:
                self._latent[layer, block, :offset] = requantize(self._latent[layer, block, :offset],
                                                                 old[layer], scale[layer])
        self._scale[:, block] = scale
        self._latent[:, block, offset : offset + rows.shape[1]] = encode_e4m3(rows / scale[:, None, None])

    @_locked
    def publish_chain(self, key: KvKey, chain: tuple[bytes, ...]) -> int:
        """Publish a lease's committed full blocks under `chain`, the hashes of every token it
        holds (its prompt, then its fed outputs), hashed with its admission's salt.

        `chain` must extend the prompt chain the lease was admitted with (KvEpochError
        PREFIX_CHAIN otherwise): the salt, and so who may reuse the blocks, stays the
        admission's. Returns the blocks published now (0 for a lease without KV).
        """
        entry = self._entries.get(key)
        if entry is None:
            return 0
        if tuple(chain[: len(entry.chain)]) != entry.chain or not entry.chain:
            raise KvEpochError(f"request {key[0]!r}: the chain to publish does not extend the lease's prompt chain",
                               reason="PREFIX_CHAIN")
        before = entry.published
        entry.chain = tuple(chain)
        self._publish(entry)
        return entry.published - before

    def _publish(self, entry: LeaseKv) -> None:
        full = min(entry.length // self.block_tokens, len(entry.chain))
        for index in range(entry.published, full):
            self.pool.publish(entry.blocks[index], entry.chain[index])
        entry.published = max(entry.published, full)

    def _ensure_storage(self, blocks: int) -> None:
        have = self._latent.shape[1]
        if blocks <= have:
            return
        size = min(self.pool.total_blocks, max(blocks, 2 * have, 4))
        for attr in ("_latent", "_k_rope", "_scale"):
            old = getattr(self, attr)
            new = np.zeros((old.shape[0], size, *old.shape[2:]), old.dtype)
            new[:, :have] = old
            setattr(self, attr, new)

    @_locked
    def release(self, request_id: str, lease_id: str) -> bool:
        """Drop a lease's block references and tombstone it; returns whether it held KV."""
        key = (request_id, lease_id)
        entry = self._entries.pop(key, None)
        pinned = self._pinned.pop(key, None)
        for block in (entry.blocks if entry else []) + (pinned.blocks if pinned else []):
            self.pool.release(block)
        self._tombstones[key] = True
        while len(self._tombstones) > self.tombstone_capacity:
            self._tombstones.popitem(last=False)
        return entry is not None

    @_locked
    def release_request(self, request_id: str) -> int:
        keys = {k for k in self._entries if k[0] == request_id} | {k for k in self._pinned if k[0] == request_id}
        held = sum(1 for k in keys if k in self._entries)
        for key in keys:
            self.release(*key)
        return held
