"""One background MAX graph compile, as its own low-priority process.

`python -m libs.model.compile_job --checkpoint DIR --graph dense_layer --cache-dir D [--cpus 0-1]
[--activations int8,float32]`

The process first pins itself to the given CPUs (the stage's share) and drops its priority
(nice 19, or SCHED_IDLE with `--priority idle`), so a stage serving on the same CPUs keeps
its share. It then compiles the graph into
the cache dir, records the cache marker, and prints one JSON line: the result.
Exit status 0 on success, 1 when the compile failed (the line says why).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from enum import Enum
from pathlib import Path

from libs.model.compile_cache import GraphName, GraphTarget, config_sha256, record_compiled
from libs.service.affinity import parse_cpu_set


def die_with_parent() -> None:
    """A compile outliving its orchestrator would hold the CPUs for nothing (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Priority(Enum):
    # nice 19: a CFS weight of 15 against 1024 for a serving thread, so serving keeps ~98.5 %
    # of a contended CPU, yet the compile still progresses on a host others keep busy.
    NICE = "nice"
    # SCHED_IDLE: runs only when the CPU would otherwise idle; on a shared, loaded host a
    # compile can starve for a long time.
    IDLE = "idle"


def lower_priority(cpus: tuple[int, ...], priority: Priority) -> str:
    """Pin to `cpus` (when given) and yield the CPU to serving; returns the policy applied."""
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
    if priority is Priority.IDLE and hasattr(os, "SCHED_IDLE"):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return "SCHED_IDLE"
    os.nice(19 - os.nice(0))
    return "nice 19"


def compile_graph(checkpoint: Path, name: GraphName, cache_dir: Path, device: str,
                  weight_dtype: str, weights_policy: str = "fp32",
                  activations: tuple[str, ...] = ("int8",)) -> tuple[GraphTarget, float]:
    """Compile the graph kind `name` in every variant a MAX stage holding `weights_policy` (or,
    for a GGUF file, the formats it stores) needs (one per distinct set of block formats), under
    each of `activations` (the MAX stages' block-format activations), recording a marker for each."""
    from libs.model.config import load_config
    from libs.model.graph_variants import checkpoint_graph_variants
    from libs.model.max_kernels import configure_max_process, max_build, stderr_progress

    cfg = load_config(checkpoint)
    variants = checkpoint_graph_variants(checkpoint, cfg, weights_policy)
    dtype = variants.weight_dtype if variants else weight_dtype
    quants = variants.quant.get(name, ((),)) if variants else ((),)
    configure_max_process(os.environ, cache_dir)  # this job is its process's entry point
    from libs.model import max_runtime  # imports max; only after the environment is set

    started = time.perf_counter()
    target = GraphTarget(name, max_build(), device, dtype, config_sha256(cfg))
    for mode in activations:
        runtime = max_runtime.shared_runtime(cfg, device, dtype, stderr_progress, mode)
        for quant in quants:
            runtime.compiled(max_runtime.GraphKind(name.value), quant)
            target = GraphTarget(name, max_build(), device, dtype, config_sha256(cfg), quant, mode)
            record_compiled(cache_dir, target, time.perf_counter() - started)
    return target, time.perf_counter() - started


def parse_activations(raw: str) -> tuple[str, ...]:
    """`int8,float32` -> the distinct modes, in order; an unknown one is an argparse error."""
    from libs.common.kinds import BLOCK_ACTIVATIONS

    modes = tuple(dict.fromkeys(part.strip() for part in raw.split(",") if part.strip()))
    unknown = [mode for mode in modes if mode not in BLOCK_ACTIVATIONS]
    if unknown or not modes:
        raise argparse.ArgumentTypeError(f"activations {raw!r}: each one of {', '.join(BLOCK_ACTIVATIONS)}")
    return modes


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m libs.model.compile_job")
    parser.add_argument("--checkpoint", required=True, type=Path, help="a checkpoint directory or a .gguf file")
    parser.add_argument("--graph", required=True, choices=[n.value for n in GraphName])
    parser.add_argument("--cache-dir", required=True, type=Path)
    parser.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument("--weight-dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--weights", default="fp32", choices=("fp32", "bf16", "q8_0", "q4_k_m"),
                        help="the weight policy of the MAX stages: compiles every graph variant it needs")
    parser.add_argument("--activations", type=parse_activations, default=("int8",),
                        help="the MAX stages' block-format activations, comma-separated: compiles each")
    parser.add_argument("--cpus", type=parse_cpu_set, default=())
    parser.add_argument("--priority", choices=[p.value for p in Priority], default=Priority.NICE.value)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    die_with_parent()  # MAX sizes its thread pool from the affinity mask set below
    policy = lower_priority(args.cpus, Priority(args.priority))
    name = GraphName(args.graph)
    result: dict[str, object] = {"graph": name.value, "policy": policy, "cpus": list(args.cpus)}
    try:
        target, seconds = compile_graph(args.checkpoint, name, args.cache_dir, args.device, args.weight_dtype,
                                        args.weights, args.activations)
    except Exception as exc:  # noqa: BLE001  (any compile failure is reported, never hidden)
        result.update(state="failed", error=f"{type(exc).__name__}: {exc}")
        print(json.dumps(result), flush=True)
        return 1
    result.update(state="done", seconds=round(seconds, 3), key=target.key, build=target.build)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # After a cold compile, max 26.7's runtime aborts in its own teardown ("terminate called
    # without an active exception", exit 134) although the graph and its marker are written.
    # The result line is out and flushed, so the job ends here without that teardown.
    os._exit(code)
