"""`fornax max warmup`: fill the MAX compile cache for a checkpoint's architecture."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def register(commands, benches) -> None:  # noqa: ARG001  (no benches here)
    group = commands.add_parser("max", help="Modular MAX backend utilities")
    sub = group.add_subparsers(dest="max_command", metavar="ACTION", required=True)
    warm = sub.add_parser("warmup", help="compile every graph kind a checkpoint needs into the cache")
    warm.add_argument("--checkpoint", required=True, type=Path,
                      help="dir holding config.json, or a .gguf file (its stored formats' graph variants)")
    warm.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    warm.add_argument("--weight-dtype", default="float32", choices=("float32", "bfloat16"))
    warm.add_argument("--weights", default="fp32", choices=("fp32", "bf16", "q8_0", "q4_k_m"),
                      help="weight policy of the MAX stages: also compiles each graph variant its block formats "
                           "need (and sets the float dtype it implies)")
    warm.add_argument("--max-activations", default="int8", choices=("int8", "float32"),
                      help="the stages' block-format activations (a stage worker's --max-activations): the "
                           "graphs differ by mode, so warm the mode the route runs")
    warm.add_argument("--cache-dir", type=Path, default=None,
                      help="default: $FORNAX_COMPILE_CACHE_DIR or ~/.cache/fornax/max")
    warm.add_argument("--json", action="store_true")
    warm.set_defaults(func=_warmup)


def _warmup(args: argparse.Namespace) -> int:
    from apps.bench.stage_layers import host_description
    from libs.model.config import load_config
    from libs.model.graph_variants import checkpoint_graph_variants
    from libs.model.max_kernels import (
        MaxOptions,
        configure_max_process,
        default_cache_dir,
        max_build,
        warm_compile_cache,
    )
    from libs.service.progress import Progress

    cache_dir = args.cache_dir or default_cache_dir(os.environ)
    configure_max_process(os.environ, cache_dir)  # this command is its process's entry point
    cfg = load_config(args.checkpoint)
    bars: list[Progress] = []

    def on_graph(kind: str, done: int, total: int) -> None:
        if not bars:
            bars.append(Progress("max warmup", total, "graphs"))
        bars[0].update(done, f"compiling {kind}" if kind else "done")

    try:
        options = MaxOptions(device=args.device, weight_dtype=args.weight_dtype,
                             block_activations=args.max_activations)
        seconds = warm_compile_cache(cfg, options,
                                     on_graph, checkpoint_graph_variants(args.checkpoint, cfg, args.weights))
    finally:
        for bar in bars:
            bar.close()
    result = {
        "figure_class": "physical (wall seconds to compile or fetch each graph from the cache, this host)",
        "build": max_build(), "host": host_description(), "device": args.device,
        "weight_dtype": args.weight_dtype, "weights_policy": args.weights, "max_activations": args.max_activations,
        "cache_dir": str(cache_dir), "checkpoint": str(args.checkpoint), "seconds_per_graph": seconds,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"max warmup ({result['figure_class']}); {result['build']} on {result['host']}, device={args.device}")
        for kind, secs in seconds.items():
            print(f"  {kind:<12} {secs:8.1f} s")
        print(f"cache dir: {result['cache_dir']}")
    return 0
