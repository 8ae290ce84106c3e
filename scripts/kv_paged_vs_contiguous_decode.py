"""Physical A/B: decode tokens/s of one numpy stage holding every layer, with the paged KV store
(`libs.model.kv_store`, 16-token blocks) against the contiguous per-sequence store it replaced
(read from git at `--contiguous-rev`, default 9ae2d22^). Same process, same weights, same
kernels and executor; only the store differs. Each round builds a fresh executor per store,
commits `--past` synthetic KV rows for each of `--sequences` sequences, and times
`--steps` decode steps of all of them at once; stores alternate within a round, and the
median over `--rounds` rounds is reported. The figure compared is tokens per CPU second of
this process (one BLAS thread, set before numpy loads), which other jobs on a shared host
disturb far less than wall time; wall tokens/s is reported beside it. Run with the
repository's venv from its root:

    nice -n 19 .venv/bin/python scripts/kv_paged_vs_contiguous_decode.py --checkpoint DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

for _threads in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_threads] = "1"  # before numpy loads: CPU time then counts one thread's work

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "libs" / "api")]

from libs.model.config import load_config  # noqa: E402
from libs.model.executor import StageBatch, StageExecutor, StageSpec  # noqa: E402
from libs.model.kernels import make_kernels  # noqa: E402
from libs.model.kv_store import kv_slice  # noqa: E402
from libs.model.weights import load_stage_weights  # noqa: E402
from libs.service.host import cpu_name  # noqa: E402


def contiguous_store_module(rev: str) -> types.ModuleType:
    source = subprocess.run(["git", "show", f"{rev}:libs/model/kv_store.py"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout
    module = types.ModuleType("kv_store_contiguous")
    sys.modules[module.__name__] = module  # dataclasses resolve their module by name
    exec(compile(source, f"{rev}:libs/model/kv_store.py", "exec"), module.__dict__)
    return module


def contiguous_store(module: types.ModuleType, cfg, limit: int):
    def old(s):  # noqa: ANN001, ANN202 - today's FNX2 slice as the old store's identity
        return module.SliceIdentity(s.request_id, s.execution_lease_id, s.request_sequence_no,
                                    s.token_position_start, s.kv_epoch, s.input_row_count)

    class ContiguousStore(module.KvStore):
        """The old store behind today's executor, which passes FNX2 slices (not keys)."""

        def check_batch(self, slices):  # noqa: ANN001, ANN202
            return super().check_batch([old(s) for s in slices])

        def commit(self, s, latent, k_rope):  # noqa: ANN001, ANN202
            return super().commit(old(s), latent, k_rope)

        def past(self, s, layer):  # noqa: ANN001, ANN202
            return super().past(old(s).key, layer)

    return ContiguousStore(module.KvLayout(cfg.num_hidden_layers, cfg.kv_lora_rank, cfg.qk_rope_head_dim), limit)


def decode_tokens_per_s(executor: StageExecutor, cfg, args: argparse.Namespace) -> tuple[float, float]:
    """(tokens per CPU second, tokens per wall second) over the timed decode steps."""
    rng = np.random.default_rng(0)
    layers, names = cfg.num_hidden_layers, [f"seq-{i}" for i in range(args.sequences)]
    for name in names:
        latent = rng.standard_normal((layers, args.past, cfg.kv_lora_rank), dtype=np.float32)
        k_rope = rng.standard_normal((layers, args.past, cfg.qk_rope_head_dim), dtype=np.float32)
        executor.kv.commit(kv_slice(name, "bench", 0, 0, 0, args.past), latent, k_rope)
    started = cpu_started = 0.0
    for step in range(args.steps + 1):  # the first step is untimed (warm)
        if step == 1:
            started, cpu_started = time.perf_counter(), time.process_time()
        slices = tuple(kv_slice(n, "bench", step + 1, args.past + step, step + 1, 1) for n in names)
        executor.execute(StageBatch(slices, rng.integers(3, cfg.vocab_size, size=len(names)).astype(np.int32)))
    tokens = args.sequences * args.steps
    return tokens / (time.process_time() - cpu_started), tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--contiguous-rev", default="9ae2d22^")
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--past", type=int, default=512, help="KV rows per sequence before decoding")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cfg = load_config(args.checkpoint)
    n = cfg.num_hidden_layers
    kernels = make_kernels("numpy", cfg, load_stage_weights(args.checkpoint, cfg, 0, n, True, True))
    module = contiguous_store_module(args.contiguous_rev)
    limit = 1 << 32
    runs: dict[str, list[float]] = {"paged": [], "contiguous": []}
    wall: dict[str, list[float]] = {"paged": [], "contiguous": []}
    for _ in range(args.rounds):
        for name in runs:
            executor = StageExecutor(cfg, StageSpec(0, n, True, True, limit), kernels)
            if name == "contiguous":
                executor.kv = contiguous_store(module, cfg, limit)
            per_cpu_s, per_wall_s = decode_tokens_per_s(executor, cfg, args)
            runs[name].append(per_cpu_s)
            wall[name].append(per_wall_s)
    paged, contiguous = (statistics.median(runs[k]) for k in ("paged", "contiguous"))
    print(json.dumps({
        "evidence_class": "physical",
        "hardware": f"{cpu_name()}, {len(os.sched_getaffinity(0))} usable CPUs, load average "
                    f"{os.getloadavg()[0]:.2f}",
        "numpy": np.__version__,
        "command": " ".join(["scripts/kv_paged_vs_contiguous_decode.py", *sys.argv[1:]]),
        "blas_threads": 1,
        "decode_tokens_per_cpu_s": runs, "decode_tokens_per_wall_s": wall,
        "median_paged_tokens_per_cpu_s": paged, "median_contiguous_tokens_per_cpu_s": contiguous,
        "paged_vs_contiguous_decode": paged / contiguous,
        "paged_vs_contiguous_decode_wall": statistics.median(wall["paged"]) / statistics.median(wall["contiguous"]),
    }, indent=1))


if __name__ == "__main__":
    main()
