"""Physical comparison of one stage-executor decode step (32 sequences, 128-token past, the whole
model in one stage, numpy) between two checkouts, e.g. the contiguous KV store and the paged one:

    python scripts/kv_decode_compare.py <checkout root> <checkpoint dir>

Run it alternately for both roots on an otherwise idle host; it prints the median step time.
"""

import sys
import time

SEQUENCES, PAST, STEPS = 32, 128, 8


def main(root: str, checkpoint: str) -> None:
    sys.path[:0] = [root, root + "/libs/api"]
    import numpy as np

    from libs.model.config import load_config
    from libs.model.executor import StageBatch, StageExecutor, StageSpec
    from libs.model.kernels import make_kernels
    from libs.model.kv_store import SliceIdentity
    from libs.model.weights import load_stage_weights

    cfg = load_config(checkpoint)
    n = cfg.num_hidden_layers
    weights = load_stage_weights(checkpoint, cfg, 0, n, True, True)
    executor = StageExecutor(cfg, StageSpec(0, n, True, True, 1 << 31), make_kernels("numpy", cfg, weights))
    rng = np.random.default_rng(0)
    for i in range(SEQUENCES):
        prompt = rng.integers(3, cfg.vocab_size, PAST).astype(np.int32)
        executor.execute(StageBatch((SliceIdentity(f"r{i}", "l", 0, 0, 0, PAST),), prompt))
    times = []
    for step in range(1, STEPS + 1):
        slices = tuple(SliceIdentity(f"r{i}", "l", step, PAST + step - 1, step, 1) for i in range(SEQUENCES))
        batch = StageBatch(slices, rng.integers(3, cfg.vocab_size, SEQUENCES).astype(np.int32))
        started = time.perf_counter()
        executor.execute(batch)
        times.append(time.perf_counter() - started)
    print(f"{root}: decode step c{SEQUENCES} median {1000 * float(np.median(times)):.2f} ms (physical, this host)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
