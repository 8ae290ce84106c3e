"""`fornax model ...`, `fornax parity` and `fornax bench stage` commands.

Heavy imports (torch, transformers, max) happen inside the command functions.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from apps.cli import served_parity
from libs.model.kv_blocks import KV_DTYPES
from libs.model.presets import PRESETS


def register(commands, benches) -> None:
    model = commands.add_parser("model", help="model checkpoints and tokenizer")
    sub = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    make = sub.add_parser("make-test-checkpoint", help="write a deterministic random-weight checkpoint")
    make.add_argument("--preset", required=True, choices=sorted(PRESETS))
    make.add_argument("--out", required=True, type=Path)
    make.add_argument("--seed", type=int, default=0)
    make.add_argument("--max-shard-bytes", type=int, default=None, help="shard size limit (bytes)")
    make.set_defaults(func=_make_checkpoint)
    tok = sub.add_parser("build-tokenizer", help="retrain the committed byte-level BPE tokenizer")
    tok.add_argument("--out", type=Path, default=None, help="output dir (default: the committed assets)")
    tok.set_defaults(func=_build_tokenizer)

    _register_parity(commands)
    _register_bench_stage(benches)


def _register_parity(commands) -> None:
    parity = commands.add_parser("parity", help="check stage execution against Hugging Face transformers (a GGUF: "
                                                "against numpy stages over the file's own weights; --served: the "
                                                "running fleet against the layer-streamed reference)")
    parity.add_argument("--checkpoint", type=Path, help="a checkpoint directory or a deepseek2 .gguf file (gated on "
                        "top-1 agreement >= 0.95 with numpy stages over its stored tensors); required but with "
                        "--served, where it replaces the route's artifacts as the reference's weights")
    parity.add_argument("--stages", type=int, default=1)
    parity.add_argument("--backend", choices=("numpy", "max"), help="the stages' backend (required but with "
                        "--served, where it is the backend --checkpoint is encoded for; default: the route's)")
    parity.add_argument("--device", default="cpu")
    parity.add_argument("--decode-steps", type=int, default=8)
    parity.add_argument("--tolerance", type=float, default=1e-4)
    parity.add_argument("--weights", choices=("fp32", "bf16", "q8_0", "q4_k_m"), default="fp32",
                        help="weight policy of the stages; the reference runs the same weights dequantized")
    parity.add_argument("--against-source", action="store_true",
                        help="also report top-1 agreement and mean KL against the unquantized checkpoint")
    parity.add_argument("--kv-dtype", choices=tuple(KV_DTYPES), default="fp32",
                        help="KV element type of the stages (fp8: numpy backend only); other than fp32, also "
                             "reports the logit error against float32 KV and gates on top-1 agreement with it")
    parity.add_argument("--max-activations", choices=("int8", "float32"), default="int8",
                        help="a MAX stage's block-format products: int8 (MAX's packed product, activations "
                             "quantized per 32-block) or float32 (the Mojo op: each block decoded, float32 FMA)")
    parity.add_argument("--reference", choices=("transformers", "streamed"), default="transformers",
                        help="transformers: the whole model in float32, every boundary; streamed: one decoder layer "
                             "at a time (any size), gated on the final logits' top-1 >= 0.95")
    parity.add_argument("--json", action="store_true")
    served_parity.add_arguments(parity)
    parity.set_defaults(func=_parity)


def _register_bench_stage(benches) -> None:
    bench = benches.add_parser("stage", help="per-layer prefill/decode latency: numpy, max, transformers")
    bench.add_argument("--checkpoint", type=Path, default=None, help="default: a generated small-preset dir")
    bench.add_argument("--backends", default="numpy,max,transformers")
    bench.add_argument("--layers", type=int, default=2, help="layers to time (from layer 0)")
    bench.add_argument("--repeats", type=int, default=3)
    bench.add_argument("--weights", choices=("fp32", "bf16", "q8_0", "q4_k_m"), default="fp32",
                       help="weight policy every backend runs (MAX in the formats a MAX stage holds); adds a triad "
                            "bandwidth measurement and each decode step's weight bytes read per second")
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(func=_bench_stage)


def _make_checkpoint(args: argparse.Namespace) -> int:
    from libs.model.checkpoint_gen import DEFAULT_MAX_SHARD_BYTES, CheckpointRequest, write_checkpoint

    request = CheckpointRequest(
        preset=args.preset, out_dir=args.out, seed=args.seed,
        max_shard_bytes=args.max_shard_bytes or DEFAULT_MAX_SHARD_BYTES,
    )
    summary = write_checkpoint(request, progress=lambda line: print(line, file=sys.stderr))
    print(
        f"checkpoint {summary.out_dir}: preset={args.preset} seed={args.seed} "
        f"parameters={summary.parameter_count} bytes={summary.total_bytes} shards={len(summary.shard_files)}"
    )
    return 0


def _build_tokenizer(args: argparse.Namespace) -> int:
    from libs.model.tokenizer_build import ASSETS, build_assets

    out = args.out or ASSETS
    build_assets(out)
    print(f"tokenizer written to {out}")
    return 0


def _parity(args: argparse.Namespace) -> int:
    from libs.model.gguf_source import is_gguf_file

    if args.served:
        return served_parity.run(args)
    missing = [flag for flag, value in (("--checkpoint", args.checkpoint), ("--backend", args.backend)) if not value]
    if missing:
        print(f"parity: {' and '.join(missing)} required (or --served)", file=sys.stderr)
        return 2

    if is_gguf_file(args.checkpoint):
        from apps.cli.gguf_parity import run as run_gguf_parity

        return run_gguf_parity(args)
    from libs.model.parity import ParityRequest, format_report, run_parity

    request = ParityRequest(
        checkpoint_dir=args.checkpoint, stages=args.stages, backend=args.backend, device=args.device,
        decode_steps=args.decode_steps, tolerance=args.tolerance, weights=args.weights,
        against_source=args.against_source, kv_dtype=args.kv_dtype, reference=args.reference,
        max_activations=args.max_activations,
    )
    from libs.service.errors import FornaxError

    try:
        report = run_parity(request)
    except FornaxError as exc:
        print(f"parity: {exc}", file=sys.stderr)
        return 2
    print(format_report(report, as_json=args.json))
    return 0 if report.passed else 1


def _bench_stage(args: argparse.Namespace) -> int:
    import os

    from apps.bench.stage_layers import run_bench_cli
    from libs.model.max_kernels import configure_max_process, default_cache_dir

    # this command is its process's entry point: MAX graphs compile into, or load from, the
    # shared Fornax compile cache like every other entry point's
    configure_max_process(os.environ, default_cache_dir(os.environ))

    return run_bench_cli(args)
