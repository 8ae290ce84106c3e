"""Paged KV bookkeeping: a pool of fixed-size token blocks, reference counts, and a prefix index.

Pure bookkeeping, no tensors: `libs.model.kv_store` keeps the rows of block `b` at index `b`
of its arrays. A block is in exactly one of three states:
- free: holds nothing, may be handed out at once;
- referenced: one or more leases hold it (refcount > 0); never evicted, never reused;
- cached: no lease holds it, but it carries a prefix hash and may be shared by a later
  lease; eviction takes these in least-recently-released order, and only when no free
  block is left.

A block carries a prefix hash only once it is full and its lease committed it. The hash
names the whole token prefix up to the block's end (`prefix_chain`), so two blocks with
the same hash hold the same KV rows.

Block size. KV_BLOCK_TOKENS = 16. `scripts/kv_block_gather_bench.py` times reading one
layer's 2k-token latent past through a block table against the contiguous store's copy; on
the shared 2-CPU AMD EPYC development box (physical, numpy 2.4) the ratio was 0.67x-2.1x with
no trend across 4..64 tokens per block (noise dominates), so the gather cost does not pick
the size. Reuse does: a prompt reuses only whole blocks, so a smaller block recomputes less
(at most 15 tokens at 16), while a larger one keeps tables short (128 ids for a 2k-token
sequence at 16). 16 is the compromise.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from libs.model.errors import ConfigError, KvLimitExceededError

KV_BLOCK_TOKENS = 16


@dataclass(frozen=True)
class KvFormat:
    """How one KV dtype stores a layer's rows: bytes per latent element, per rope-key element,
    and per block for the latent's scale (0 = unscaled)."""

    latent_bytes: int
    rope_bytes: int
    scale_bytes_per_block: int = 0
    backends: tuple[str, ...] | None = None  # stage backends that may hold this format; None: all

    def row_bytes(self, kv_lora_rank: int, rope_dim: int) -> int:
        """One token's latent and rope key in one layer (the scale is per block, not per row)."""
        return self.latent_bytes * kv_lora_rank + self.rope_bytes * rope_dim

    def block_bytes(self, kv_lora_rank: int, rope_dim: int, layers: int = 1,
                    block_tokens: int = KV_BLOCK_TOKENS) -> int:
        """Exact bytes of one block across `layers` layers: rows plus each layer's scale."""
        return layers * (block_tokens * self.row_bytes(kv_lora_rank, rope_dim) + self.scale_bytes_per_block)


# The KV dtypes a stage may hold (part of the stage contract). fp32 is the reference; bf16 keeps
# bf16 bit patterns (round to nearest even); fp8 keeps the MLA latent as float8 e4m3 with one
# float32 power-of-two scale per (16-token block, layer) and the rope key as bf16.
KV_DTYPES: dict[str, KvFormat] = {
    "fp32": KvFormat(4, 4),
    "bf16": KvFormat(2, 2),
    "fp8": KvFormat(1, 2, scale_bytes_per_block=4, backends=("numpy",)),
}


def kv_format(kv_dtype: str, field: str | None = None) -> KvFormat:
    """The format of a KV dtype, or ConfigError KV_DTYPE."""
    fmt = KV_DTYPES.get(kv_dtype)
    if fmt is None:
        raise ConfigError(f"KV dtype {kv_dtype!r} is not one of {', '.join(KV_DTYPES)}", reason="KV_DTYPE",
                          field=field)
    return fmt


def require_kv_backend(kv_dtype: str, backend: str, field: str | None = None) -> None:
    """ConfigError KV_DTYPE_BACKEND when a stage backend cannot hold a KV dtype (never a fallback)."""
    fmt = kv_format(kv_dtype, field)
    if fmt.backends is not None and backend not in fmt.backends:
        raise ConfigError(f"KV dtype {kv_dtype!r} is not supported on the {backend!r} backend "
                          f"(supported on: {', '.join(fmt.backends)})", reason="KV_DTYPE_BACKEND", field=field)

PREFIX_HASH_BYTES = 32
_CHAIN_DOMAIN = b"fornax.kv.prefix.v1"


def prefix_chain(salt: bytes, token_ids: Sequence[int], block_tokens: int = KV_BLOCK_TOKENS) -> list[bytes]:
    """One hash per full block of `token_ids`: hash i names the salt and tokens [0, (i+1)*B).

    Each hash chains the previous one with the block's own tokens, so equal hashes mean an
    equal salt and an equal token prefix (up to SHA-256 collisions).
    """
    chain: list[bytes] = []
    previous = hashlib.sha256(_CHAIN_DOMAIN + len(salt).to_bytes(4, "little") + salt).digest()
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        block = b"".join(int(t).to_bytes(4, "little") for t in token_ids[start : start + block_tokens])
        previous = hashlib.sha256(previous + block).digest()
        chain.append(previous)
    return chain


def blocks_for(tokens: int, block_tokens: int = KV_BLOCK_TOKENS) -> int:
    return -(-tokens // block_tokens)


@dataclass(frozen=True)
class PoolStats:
    total_blocks: int
    free_blocks: int         # free plus cached (reclaimable) blocks
    referenced_blocks: int
    cached_blocks: int       # unreferenced, hashed, evictable
    hit_blocks: int
    missed_blocks: int
    evicted_blocks: int


class BlockPool:
    """Allocates blocks, counts references, and indexes full blocks by prefix hash."""

    def __init__(self, total_blocks: int) -> None:
        if total_blocks < 1:
            raise KvLimitExceededError("a KV pool needs at least one block")
        self.total_blocks = total_blocks
        self._refcount: list[int] = []          # per block id handed out so far (grows with _fresh)
        self._recycled: list[int] = []          # freed block ids, reused before fresh ones
        self._fresh = 0                          # ids [fresh, total) were never handed out
        self._hash_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached blocks, oldest first
        self.hit_blocks = 0
        self.missed_blocks = 0
        self.evicted_blocks = 0

    @property
    def high_block(self) -> int:
        """One past the largest block id ever handed out (the storage the pool has touched)."""
        return self._fresh

    def available(self) -> int:
        """Blocks an allocation may take now: free ones plus cached ones it would evict."""
        return len(self._recycled) + (self.total_blocks - self._fresh) + len(self._lru)

    def referenced(self) -> int:
        return self.total_blocks - self.available()

    def refcount(self, block: int) -> int:
        return self._refcount[block] if 0 <= block < len(self._refcount) else 0

    def stats(self) -> PoolStats:
        return PoolStats(self.total_blocks, self.available(), self.referenced(), len(self._lru),
                         self.hit_blocks, self.missed_blocks, self.evicted_blocks)

    def allocate(self) -> int:
        """A block referenced once by the caller; evicts the oldest cached block if none is free."""
        if self._recycled:
            block = self._recycled.pop()
        elif self._fresh < self.total_blocks:
            block = self._fresh
            self._fresh += 1
            self._refcount.append(0)
        elif self._lru:
            block, _ = self._lru.popitem(last=False)
            del self._block_of[self._hash_of.pop(block)]
            self.evicted_blocks += 1
        else:
            raise KvLimitExceededError(
                f"no KV block is free: all {self.total_blocks} blocks are held by live leases"
            )
        self._refcount[block] = 1
        return block

    def acquire(self, block: int) -> None:
        """One more reference to a block that is referenced or cached."""
        if self.refcount(block) == 0:
            if block not in self._lru:
                raise ValueError(f"block {block} is free and cannot be shared")
            del self._lru[block]
        self._refcount[block] += 1

    def release(self, block: int) -> None:
        count = self.refcount(block)
        if count < 1:
            raise ValueError(f"block {block} is not referenced")
        self._refcount[block] = count - 1
        if count == 1:
            if block in self._hash_of:
                self._lru[block] = None
            else:
                self._recycled.append(block)

    def publish(self, block: int, prefix_hash: bytes) -> bool:
        """Index a full, referenced block under its prefix hash; False if the hash is taken
        (the block then stays private and is freed when released)."""
        if self.refcount(block) < 1:
            raise ValueError(f"block {block} is not referenced")
        if prefix_hash in self._block_of or block in self._hash_of:
            return False
        self._block_of[prefix_hash] = block
        self._hash_of[block] = prefix_hash
        return True

    def match(self, chain: Sequence[bytes]) -> list[int]:
        """The blocks of the longest resident prefix of `chain`, each acquired for the caller."""
        blocks: list[int] = []
        for prefix_hash in chain:
            block = self._block_of.get(prefix_hash)
            if block is None:
                break
            self.acquire(block)
            blocks.append(block)
        self.hit_blocks += len(blocks)
        self.missed_blocks += len(chain) - len(blocks)
        return blocks
