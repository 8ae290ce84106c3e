"""Physical measurement behind KV_BLOCK_TOKENS: one layer's 2k-token MLA latent past read
through a block table (numpy take over [layers, blocks, B, rank]) against the contiguous
store's slice copy. Prints the ratio per block size; run with the repository's venv:

    python scripts/kv_block_gather_bench.py
"""

import platform
import time

import numpy as np

RANK, PAST, LAYERS = 512, 2048, 4


def mean_s(fn, n: int = 300) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


def main() -> None:
    rng = np.random.default_rng(0)
    contiguous = rng.random((LAYERS, 2 * PAST, RANK), dtype=np.float32)
    base = mean_s(lambda: contiguous[1, :PAST].copy())
    print(f"physical, {platform.processor() or platform.machine()}, numpy {np.__version__}")
    print(f"contiguous copy: {base * 1e6:.1f} us")
    for block in (4, 8, 16, 32, 64):
        blocks = 2 * PAST // block
        store = rng.random((LAYERS, blocks, block, RANK), dtype=np.float32)
        table = rng.permutation(blocks)[: PAST // block]
        paged = mean_s(lambda s=store, t=table, b=block: np.take(s[1], t, axis=0).reshape(-1, RANK))
        print(f"block {block:3d}: {paged * 1e6:.1f} us, {paged / base:.2f}x contiguous")


if __name__ == "__main__":
    main()
