"""`fornax bench block-matmul`: one linear product in one-op MAX graphs, side by side (a
benchmark: physical figures of this host, named with its CPU and load average)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os


def register_block_matmul(benches) -> None:
    bm = benches.add_parser("block-matmul", help="one linear product in one-op MAX graphs: float32 matmul, "
                                                 "qmatmul (int8 activations) and the float32 Mojo custom op")
    bm.add_argument("--rows", default="1,8,512", help="activation rows M, comma-separated")
    bm.add_argument("--in-dim", type=int, default=2048, help="K")
    bm.add_argument("--out-dim", type=int, default=5632, help="N")
    bm.add_argument("--formats", default="q8_0,q4_k,q6_k,q4_0,q5_0,q5_1")
    bm.add_argument("--runs", type=int, default=10, help="timed runs per cell (the minimum is reported)")
    bm.add_argument("--json", action="store_true")
    bm.set_defaults(func=cmd_block_matmul)


def cmd_block_matmul(args: argparse.Namespace) -> int:
    from libs.model.max_kernels import configure_max_process, default_cache_dir, max_build

    cache = default_cache_dir(os.environ)
    configure_max_process(os.environ, cache)
    from apps.bench.block_matmul import render, run_bench
    from libs.model.custom_kernels import gguf_matmul_package
    from libs.service.host import cpu_name

    rows = tuple(int(r) for r in args.rows.split(","))
    cells = run_bench(rows, args.in_dim, args.out_dim, tuple(args.formats.split(",")), args.runs,
                      gguf_matmul_package(cache, max_build()))
    load = os.getloadavg()
    evidence = f"physical: {cpu_name()}, {max_build()}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    if args.json:
        print(json.dumps({"cells": [dataclasses.asdict(c) for c in cells], "loadavg": load, "evidence": evidence},
                         indent=2))
    else:
        print(f"[M, {args.in_dim}] x [{args.in_dim}, {args.out_dim}], min of {args.runs} runs ({evidence})")
        print(render(cells))
    return 0
