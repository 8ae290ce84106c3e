"""`fornax fnx2 golden PATH`, `fornax bench fnx2 [--json]` and `fornax fuzz fnx2`."""

from __future__ import annotations

import argparse
import json


def register(commands, benches) -> None:
    fnx2 = commands.add_parser("fnx2", help="FNX2 data-plane tools")
    tools = fnx2.add_subparsers(dest="fnx2_command", metavar="TOOL", required=True)
    golden = tools.add_parser("golden", help="rebuild and decode the FNX2 2.0 golden vector")
    golden.add_argument("path", help="path to fnx2_golden_v2.json")
    golden.set_defaults(func=_golden)
    bench = benches.add_parser("fnx2", help="FNX2 codec and channel vs memcpy, raw TCP, gRPC")
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.add_argument("--quick", action="store_true", help="fewer repetitions")
    bench.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio",
                       help="event loop of both ends of the FNX2 and raw-socket setups")
    bench.set_defaults(func=_bench)
    fuzz = commands.add_parser("fuzz", help="fuzz Fornax protocols against live receivers")
    targets = fuzz.add_subparsers(dest="fuzz_target", metavar="TARGET", required=True)
    fnx2_fuzz = targets.add_parser("fnx2", help="mutated FNX2 frames against a live receiver")
    fnx2_fuzz.add_argument("--frames", type=int, default=100_000, help="frames to send")
    fnx2_fuzz.add_argument("--seed", type=int, default=20261201, help="mutation seed")
    fnx2_fuzz.add_argument("--timeout-s", type=float, default=5.0,
                           help="seconds without an answer that count as a hang")
    fnx2_fuzz.add_argument("--json", action="store_true", help="print one JSON object")
    fnx2_fuzz.set_defaults(func=_fuzz)


def _fuzz(args: argparse.Namespace) -> int:
    """Exit 0 only when every frame was answered with no crash and no hang."""
    import asyncio

    from apps.fnx2.fuzz_harness import FuzzConfig, run_fuzz

    if args.frames < 1 or args.timeout_s <= 0:
        print("fuzz: --frames must be >= 1 and --timeout-s > 0")
        return 2
    report = asyncio.run(run_fuzz(FuzzConfig(args.frames, args.seed, args.timeout_s)))
    figures = report.to_json()
    if args.json:
        print(json.dumps(figures, indent=2, sort_keys=True))
    else:
        for key in ("frames", "answered", "crashes", "hangs", "reconnects",
                    "max_allocation_bytes", "rss_growth_bytes", "frames_per_s"):
            print(f"{key:22s} {figures[key]}")
        print(f"{'answer codes':22s} {figures['codes']}")
        for sample in figures["crash_samples"]:
            print(f"  {sample}")
        print("fuzz: OK (physical figures, this host)" if report.ok else "fuzz: FAILED")
    return 0 if report.ok else 1


def _golden(args: argparse.Namespace) -> int:
    from libs.fnx2.wire.errors import Fnx2Error
    from libs.fnx2.wire.golden import check_golden

    try:
        check = check_golden(args.path)
    except (OSError, ValueError, KeyError, Fnx2Error) as exc:
        print(f"golden: FAILED to rebuild: {exc}")
        return 1
    print(f"bytes {len(check.frame)} (expected {check.expected_bytes})")
    print(f"{check.sha256} (expected {check.expected_sha256})")
    print(f"decoded back: {'yes' if check.decoded_equal else 'NO'}; "
          f"lease ids: {'match' if check.lease_ids_match else 'MISMATCH'}")
    print("golden: OK (contract figure)" if check.ok else "golden: MISMATCH")
    return 0 if check.ok else 1


def _bench(args: argparse.Namespace) -> int:
    from apps.fnx2.bench import BenchConfig, run_all
    from libs.service.event_loop import EventLoopKind

    loop = EventLoopKind(args.loop)
    cfg = (BenchConfig(codec_reps=5, frames_per_run=6, runs=1, rtt_iters=100, loop=loop)
           if args.quick else BenchConfig(loop=loop))
    command = ("fornax bench fnx2" + (" --json" if args.json else "")
               + (" --quick" if args.quick else "") + f" --loop {args.loop}")
    figures = run_all(cfg, command)
    if args.json:
        print(json.dumps(figures, indent=2, sort_keys=True))
        return 0
    for key, value in figures.items():
        print(f"{key:34s} {value:.3f}" if isinstance(value, float) else f"{key:34s} {value}")
    return 0
