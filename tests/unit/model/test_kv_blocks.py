"""Paged KV: the block pool's reference counts, LRU eviction and prefix index, and the store's
block tables, prefix reuse and commit rules."""

import numpy as np
import pytest

from libs.model.errors import KvEpochError, KvLimitExceededError
from libs.model.kv_blocks import KV_BLOCK_TOKENS, BlockPool, prefix_chain
from libs.model.kv_store import KvLayout, KvStore, kv_slice

B = KV_BLOCK_TOKENS
LAYOUT = KvLayout(layer_count=2, kv_lora_rank=4, rope_dim=2)


def test_prefix_chain_names_salt_and_whole_prefix():
    tokens = list(range(3 * B + 5))
    chain = prefix_chain(b"s", tokens)
    assert len(chain) == 3 and len(set(chain)) == 3
    assert prefix_chain(b"s", tokens[: 2 * B]) == chain[:2]
    assert prefix_chain(b"t", tokens)[0] != chain[0]
    changed = list(tokens)
    changed[0] = 999  # an early token changes every later hash
    assert all(a != b for a, b in zip(prefix_chain(b"s", changed), chain, strict=True))


def test_pool_refcounts_share_and_lru_evicts_only_unreferenced_blocks():
    pool = BlockPool(3)
    a, b, c = pool.allocate(), pool.allocate(), pool.allocate()
    assert pool.available() == 0
    assert pool.publish(a, b"ha") and pool.publish(b, b"hb")
    assert not pool.publish(c, b"ha")  # hash taken: c stays private
    with pytest.raises(KvLimitExceededError):
        pool.allocate()  # every block is held by a live lease: nothing is evicted
    pool.release(b)  # cached, released first
    pool.release(a)  # cached
    pool.release(c)  # private: free at once
    assert pool.available() == 3 and pool.stats().cached_blocks == 2
    assert pool.match([b"ha", b"hx", b"hb"]) == [a]  # stops at the first miss
    assert pool.refcount(a) == 1 and pool.stats().hit_blocks == 1 and pool.stats().missed_blocks == 2
    assert pool.allocate() == c  # the free block before any eviction
    assert pool.allocate() == b and pool.stats().evicted_blocks == 1  # the least recently released
    with pytest.raises(KvLimitExceededError):
        pool.allocate()  # a is referenced by the match: never evicted
    assert pool.match([b"hb"]) == []


def test_pool_refuses_sharing_a_free_block_and_double_release():
    pool = BlockPool(2)
    block = pool.allocate()
    pool.release(block)
    with pytest.raises(ValueError):
        pool.acquire(block)
    with pytest.raises(ValueError):
        pool.release(block)


def rows(n, seed):
    rng = np.random.default_rng(seed)
    return (rng.random((2, n, 4), dtype=np.float32), rng.random((2, n, 2), dtype=np.float32))


def ident(request, seq, pos, epoch, n):
    return kv_slice(request, "lease", seq, pos, epoch, n)


def test_store_reuses_a_committed_prefix_read_only_and_frees_on_release():
    store = KvStore(LAYOUT, bytes_limit=1 << 20)
    prompt = list(range(3 * B + 3))
    chain = tuple(prefix_chain(b"t", prompt))
    assert store.attach_prefix(("a", "lease"), chain) == 0
    latent, k_rope = rows(len(prompt), 1)
    first = ident("a", 0, 0, 0, len(prompt))
    store.check_batch([first])
    store.commit(first, latent, k_rope)
    assert store.attach_prefix(("b", "lease"), chain) == 3 * B
    # b starts after two of the three reusable blocks; it sees a's rows for them.
    start = ident("b", 0, 2 * B, 0, 4)
    store.check_batch([start])
    past_latent, past_rope = store.past(start, 1)
    np.testing.assert_array_equal(past_latent, latent[1, : 2 * B])
    np.testing.assert_array_equal(past_rope, k_rope[1, : 2 * B])
    new_latent, new_rope = rows(4, 2)
    assert store.commit(start, new_latent, new_rope) == 1
    # a's rows are untouched by b's writes (b wrote a block of its own).
    a_past = store.past(ident("a", 1, len(prompt), 1, 1), 1)[0]
    np.testing.assert_array_equal(a_past, latent[1])
    store.release("a", "lease")
    store.release("b", "lease")
    stats = store.usage().blocks
    assert store.bytes_used() == 0 and stats.cached_blocks == 3 and stats.free_blocks == stats.total_blocks


def test_store_refuses_a_first_slice_beyond_the_pinned_prefix_or_off_a_block():
    store = KvStore(LAYOUT, bytes_limit=1 << 20)
    prompt = list(range(2 * B))
    chain = tuple(prefix_chain(b"t", prompt))
    store.attach_prefix(("a", "lease"), chain)
    store.commit(ident("a", 0, 0, 0, 2 * B), *rows(2 * B, 0))
    store.attach_prefix(("b", "lease"), chain[:1])
    for position in (B + 1, 2 * B, 3):
        with pytest.raises(KvEpochError) as err:
            store.check(ident("b", 0, position, 0, 1))
        assert err.value.reason == "PREFIX_POSITION"
    with pytest.raises(KvEpochError) as err:
        store.check(ident("c", 0, B, 0, 1))  # nothing pinned for c
    assert err.value.reason == "POSITION"
    store.check(ident("b", 0, B, 0, 1))


def test_eviction_under_pressure_never_takes_a_live_leases_blocks():
    store = KvStore(LAYOUT, bytes_limit=3 * B * LAYOUT.bytes_per_token)  # three blocks
    chain_a = tuple(prefix_chain(b"t", list(range(2 * B))))
    store.attach_prefix(("a", "lease"), chain_a)
    store.commit(ident("a", 0, 0, 0, 2 * B), *rows(2 * B, 0))
    store.release("a", "lease")  # two cached blocks
    store.commit(ident("live", 0, 0, 0, B), *rows(B, 1))  # takes the free block
    store.commit(ident("x", 0, 0, 0, B), *rows(B, 2))  # evicts a cached block
    with pytest.raises(KvLimitExceededError):
        store.check_batch([ident("y", 0, 0, 0, 2 * B)])  # one cached block left, two needed
    before = store.past(ident("live", 1, B, 1, 1), 0)[0].copy()
    store.commit(ident("y", 0, 0, 0, B), *rows(B, 3))
    np.testing.assert_array_equal(store.past(ident("live", 1, B, 1, 1), 0)[0], before)
    assert store.usage().blocks.evicted_blocks == 2


def _oracle_rows(tokens, start, end):
    """Rows a sequence's KV must hold at [start, end): a function of its whole token prefix."""
    latent = np.zeros((2, end - start, 4), np.float32)
    k_rope = np.zeros((2, end - start, 2), np.float32)
    for i, position in enumerate(range(start, end)):
        seed = hash(tuple(tokens[: position + 1])) % (1 << 32)
        rng = np.random.default_rng(seed)
        latent[:, i] = rng.random((2, 4), dtype=np.float32)
        k_rope[:, i] = rng.random((2, 2), dtype=np.float32)
    return latent, k_rope


def test_random_admit_reuse_commit_release_under_pressure_always_reads_the_right_rows():
    """Leases over prompts that share prefixes, in a pool small enough to evict: every live
    lease reads exactly its own prefix's rows, and reference counts match the tables."""
    import random

    rng = random.Random(5)
    store = KvStore(LAYOUT, bytes_limit=24 * B * LAYOUT.bytes_per_token)  # 24 blocks
    stems = [[rng.randrange(50) for _ in range(5 * B)] for _ in range(3)]
    live: dict[str, dict] = {}
    served = reused = 0
    for step in range(400):
        if live and (rng.random() < 0.35 or len(live) > 5):
            request = rng.choice(sorted(live))
            store.release(request, "lease")
            del live[request]
        elif rng.random() < 0.6 or not live:
            request = f"r{step}"
            stem = rng.choice(stems)
            prompt = stem[: rng.randrange(1, len(stem))] + [rng.randrange(50) for _ in range(rng.randrange(0, 9))]
            chain = tuple(prefix_chain(b"salt", prompt))
            pinned = store.attach_prefix((request, "lease"), chain)
            start = min(pinned, ((len(prompt) - 1) // B) * B)
            start -= B * rng.randrange(0, start // B + 1) if rng.random() < 0.2 else 0
            first = kv_slice(request, "lease", 0, start, 0, len(prompt) - start)
            try:
                store.check_batch([first])
            except KvLimitExceededError:
                store.release(request, "lease")
                continue
            store.commit(first, *_oracle_rows(prompt, start, len(prompt)))
            live[request] = {"tokens": list(prompt), "step": 1}
            served += 1
            reused += start > 0
        else:
            request = rng.choice(sorted(live))
            entry = live[request]
            entry["tokens"].append(rng.randrange(50))
            n = len(entry["tokens"])
            ident = kv_slice(request, "lease", entry["step"], n - 1, entry["step"], 1)
            try:
                store.check_batch([ident])
            except KvLimitExceededError:
                entry["tokens"].pop()
                continue
            store.commit(ident, *_oracle_rows(entry["tokens"], n - 1, n))
            entry["step"] += 1
        for request, entry in live.items():
            n = len(entry["tokens"])
            probe = kv_slice(request, "lease", entry["step"], n, entry["step"], 1)
            want_latent, want_rope = _oracle_rows(entry["tokens"], 0, n)
            got_latent, got_rope = store.past(probe, 1)
            np.testing.assert_array_equal(got_latent, want_latent[1])
            np.testing.assert_array_equal(got_rope, want_rope[1])
        held: dict[int, int] = {}
        for entry in list(store._entries.values()) + list(store._pinned.values()):
            for block in entry.blocks:
                held[block] = held.get(block, 0) + 1
        assert all(store.pool.refcount(b) == c for b, c in held.items())
        assert store.pool.referenced() == len(held)
    assert served > 50 and reused > 10 and store.usage().blocks.evicted_blocks > 0


def test_a_commit_after_release_resurrects_nothing_and_holds_no_block():
    store = KvStore(LAYOUT, bytes_limit=1 << 20)
    chain = tuple(prefix_chain(b"t", list(range(2 * B))))
    store.commit(ident("a", 0, 0, 0, 2 * B), *rows(2 * B, 0))
    store.release("a", "lease")
    store.attach_prefix(("b", "lease"), chain)  # b pins nothing: a published no chain
    first = ident("b", 0, 0, 0, 2 * B)
    store.check_batch([first])
    store.release("b", "lease")  # released while its step ran
    assert store.commit(first, *rows(2 * B, 1)) == 0
    assert store.bytes_used() == 0 and store.usage().live_sequences == 0


def test_a_pool_costs_memory_for_the_blocks_it_handed_out_not_for_its_limit():
    """A store's limit may be far beyond what it uses (a profile's private store is 1 TiB):
    the pool's bookkeeping grows with the blocks handed out."""
    import tracemalloc

    tracemalloc.start()
    pool = BlockPool(1 << 36)
    blocks = [pool.allocate() for _ in range(100)]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1 << 20
    assert pool.available() == (1 << 36) - 100 and pool.refcount(blocks[-1]) == 1
    assert pool.refcount(1 << 35) == 0  # never handed out
    with pytest.raises(ValueError):
        pool.release(1 << 35)


def test_pool_counts_hits_misses_and_evictions_exactly_over_a_scripted_run():
    store = KvStore(LAYOUT, bytes_limit=4 * B * LAYOUT.bytes_per_token)  # four blocks
    prompt_a, prompt_c, prompt_d = list(range(2 * B + 3)), list(range(100, 100 + 2 * B)), list(range(200, 200 + 3 * B))
    chain_a, chain_c, chain_d = (tuple(prefix_chain(b"t", p)) for p in (prompt_a, prompt_c, prompt_d))

    def counts():
        s = store.usage().blocks
        return s.hit_blocks, s.missed_blocks, s.evicted_blocks

    assert store.attach_prefix(("a", "l"), chain_a) == 0
    assert counts() == (0, 2, 0)  # two full blocks looked up, none resident
    store.commit(kv_slice("a", "l", 0, 0, 0, len(prompt_a)), *rows(len(prompt_a), 0))  # 3 blocks, 2 published
    store.release("a", "l")  # two cached, one free
    assert store.attach_prefix(("b", "l"), chain_a) == 2 * B
    assert counts() == (2, 2, 0)
    assert store.attach_prefix(("c", "l"), chain_c) == 0
    assert counts() == (2, 4, 0)
    store.commit(kv_slice("c", "l", 0, 0, 0, 2 * B), *rows(2 * B, 1))  # the two free blocks: no eviction
    assert counts() == (2, 4, 0)
    store.release("b", "l")
    store.release("c", "l")  # four cached blocks, none free
    assert store.attach_prefix(("d", "l"), chain_d) == 0
    assert counts() == (2, 7, 0)
    store.commit(kv_slice("d", "l", 0, 0, 0, 3 * B), *rows(3 * B, 2))  # evicts the three oldest
    assert counts() == (2, 7, 3)
    assert store.attach_prefix(("e", "l"), chain_a) == 0  # a's blocks were evicted first
    assert store.attach_prefix(("f", "l"), chain_c) == 0  # c's first block too: the chain stops there
    assert counts() == (2, 11, 3)
    assert store.usage().blocks.referenced_blocks == 3  # d's live blocks survived every eviction


def test_a_block_table_that_disagrees_with_the_epoch_or_position_is_refused_and_changes_nothing():
    store = KvStore(LAYOUT, bytes_limit=1 << 20)
    prompt = list(range(2 * B + 5))
    store.attach_prefix(("a", "lease"), tuple(prefix_chain(b"t", prompt)))
    store.commit(ident("a", 0, 0, 0, len(prompt)), *rows(len(prompt), 0))  # a three-block table, epoch 1
    before = (store.epoch(("a", "lease")), store.length(("a", "lease")), store.usage().blocks)
    for bad, reason in ((ident("a", 1, len(prompt), 0, 1), "STALE_KV"),   # an old epoch
                        (ident("a", 1, len(prompt), 2, 1), "STALE_KV"),   # a future epoch
                        (ident("a", 1, 2 * B, 1, 1), "POSITION"),        # inside the table
                        (ident("a", 1, len(prompt) + 1, 1, 1), "POSITION"),  # past its end
                        (ident("a", 2, len(prompt), 1, 1), "SEQUENCE")):
        with pytest.raises(KvEpochError) as err:
            store.check_batch([bad])
        assert err.value.reason == reason
    assert (store.epoch(("a", "lease")), store.length(("a", "lease")), store.usage().blocks) == before
    store.check_batch([ident("a", 1, len(prompt), 1, 1)])  # the right identity passes


def test_a_finished_lease_publishes_its_output_blocks_for_its_own_salt_only():
    """A turn's output blocks become reusable by the next turn under the same salt, and by no
    other tenant; a chain that does not extend the admitted prompt's publishes nothing."""
    store = KvStore(LAYOUT, bytes_limit=1 << 20)
    prompt, output = list(range(B + 5)), list(range(500, 500 + 2 * B))
    store.attach_prefix(("a", "lease"), tuple(prefix_chain(b"t", prompt)))
    latent, k_rope = rows(len(prompt), 1)
    store.commit(ident("a", 0, 0, 0, len(prompt)), latent, k_rope)
    for step, token_position in enumerate(range(len(prompt), len(prompt) + len(output) - 1)):
        one_latent, one_rope = rows(1, 10 + step)
        store.commit(ident("a", step + 1, token_position, step + 1, 1), one_latent, one_rope)
        latent, k_rope = np.concatenate([latent, one_latent], 1), np.concatenate([k_rope, one_rope], 1)
    held = prompt + output[:-1]  # the last output was sampled, never fed
    next_turn = prompt + output + list(range(900, 940))
    assert store.attach_prefix(("before", "lease"), tuple(prefix_chain(b"t", next_turn))) == B
    with pytest.raises(KvEpochError) as err:
        store.publish_chain(("a", "lease"), tuple(prefix_chain(b"other-tenant", held)))
    assert err.value.reason == "PREFIX_CHAIN"
    assert store.publish_chain(("a", "lease"), tuple(prefix_chain(b"t", held))) == 2  # blocks 1 and 2 are full
    store.release("a", "lease")
    assert store.attach_prefix(("b", "lease"), tuple(prefix_chain(b"t", next_turn))) == 3 * B
    np.testing.assert_array_equal(store.past(ident("b", 0, 3 * B, 0, 1), 1)[0], latent[1, : 3 * B])
    assert store.attach_prefix(("c", "lease"), tuple(prefix_chain(b"other-tenant", next_turn))) == 0
    assert store.publish_chain(("gone", "lease"), tuple(prefix_chain(b"t", held))) == 0
