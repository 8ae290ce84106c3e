"""`fornax bench serve [--json]`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT_CHECKPOINT = Path(".cache/bench/small")


def register(commands, benches) -> None:
    serve = benches.add_parser("serve", help="serving throughput, TTFT and ITL: 2-stage vs 1-stage vs transformers")
    serve.add_argument("--checkpoint", help=f"checkpoint dir (default: the small preset, generated into {DEFAULT_CHECKPOINT})")
    serve.add_argument("--backend", choices=("numpy", "max"), default="numpy")
    serve.add_argument("--prompt-tokens", type=int, default=32)
    serve.add_argument("--max-tokens", type=int, default=16)
    serve.add_argument("--concurrency", default="1,8,32", help="comma-separated levels")
    serve.add_argument("--repeats", type=int, default=2, help="interleaved repetitions per level (best kept)")
    serve.add_argument("--fleet", help="measure a netns fleet from this fleet file instead (needs root)")
    serve.add_argument("--json", action="store_true")
    serve.set_defaults(func=cmd_serve)


def _checkpoint(path: str | None) -> str:
    if path:
        return path
    if not (DEFAULT_CHECKPOINT / "config.json").exists():
        from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint

        print(f"generating the small preset into {DEFAULT_CHECKPOINT}", file=sys.stderr)
        write_checkpoint(CheckpointRequest("small", DEFAULT_CHECKPOINT, seed=0))
    return str(DEFAULT_CHECKPOINT)


def _quiet_logs() -> None:
    """Service logs of the in-process serving core go to stderr, warnings only: stdout is the report."""
    import logging

    import structlog

    structlog.configure(
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    )


def cmd_serve(args: argparse.Namespace) -> int:
    from apps.bench.serve import BenchOptions, run

    _quiet_logs()

    levels = tuple(int(x) for x in args.concurrency.split(",") if x.strip())
    if args.fleet:
        return _serve_fleet(args, levels)
    options = BenchOptions(_checkpoint(args.checkpoint), args.prompt_tokens, args.max_tokens, args.backend, levels,
                           args.repeats)
    report = run(options, "fornax " + " ".join(sys.argv[1:]))
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return 0
    prov = report["provenance"]
    print(f"# {prov['label']}: {prov['hardware']}; {prov['backend_build']}; {prov['transformers_build']}")
    print(f"# model {prov['model_snapshot']}; prompt {options.prompt_tokens} tokens, {options.max_tokens} new tokens")
    print(f"{'setup':<18}{'conc':>5}{'tok/s':>10}{'TTFT p50':>10}{'TTFT p99':>10}{'ITL p50':>10}{'ITL p99':>10}")
    for name in ("pipeline_2_stage", "pipeline_1_stage", "transformers"):
        for level, f in report[name].items():
            print(f"{name:<18}{level[1:]:>5}{f['output_tokens_per_s']:>10.1f}{f['ttft_p50_s']:>10.3f}"
                  f"{f['ttft_p99_s']:>10.3f}{f['itl_p50_s']:>10.3f}{f['itl_p99_s']:>10.3f}")
    for key in sorted(k for k in report if k.startswith(("two_vs", "pipeline_vs"))):
        print(f"{key} = {report[key]:.2f}")
    return 0


def _serve_fleet(args: argparse.Namespace, levels: tuple[int, ...]) -> int:
    from apps.bench.fleet_serve import FleetBenchOptions, run_fleet_bench
    from apps.fleet.netns import IsolationFailed, IsolationUnavailable
    from apps.fleet.spec import FleetFileError, load_fleet_spec

    try:
        spec = load_fleet_spec(args.fleet)
        options = FleetBenchOptions(args.fleet, spec, _checkpoint(args.checkpoint), args.prompt_tokens,
                                    args.max_tokens, levels)
        report = run_fleet_bench(options, "fornax " + " ".join(sys.argv[1:]))
    except (FleetFileError, IsolationUnavailable, IsolationFailed) as exc:
        print(f"fornax: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return 0
    prov = report["provenance"]
    print(f"# {prov['label']}; fleet {prov['fleet_file']} sha256:{prov['fleet_file_sha256']}; {prov['hardware']}")
    print(f"{'conc':>5}{'tok/s':>10}{'TTFT p50':>10}{'TTFT p99':>10}{'ITL p50':>10}{'ITL p99':>10}  hop bytes/token")
    for level, f in report["levels"].items():
        hops = ", ".join(f"{h['boundary_payload_bytes_per_token']:.0f}" for h in f["hops"].values())
        print(f"{level[1:]:>5}{f['output_tokens_per_s']:>10.1f}{f['ttft_p50_s']:>10.3f}{f['ttft_p99_s']:>10.3f}"
              f"{f['itl_p50_s']:>10.3f}{f['itl_p99_s']:>10.3f}  {hops}")
    agreement = report["agreement"]
    print(f"top-1 agreement with transformers fp32 at hops {agreement['hop_boundary_dtypes']}: "
          f"{agreement['top1_agreement']:.4f} over {agreement['positions']} positions")
    return 0
