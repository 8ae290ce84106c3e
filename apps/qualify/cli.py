"""`fornax qualify --fleet FILE --checkpoint DIR [--runs N]`: the physical qualification gate."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from apps.fleet.launcher import LaunchError
from apps.fleet.netns import IsolationFailed, IsolationUnavailable
from apps.fleet.route_wait import RouteFailed
from apps.fleet.spec import FleetFileError
from apps.qualify.gate import DEFAULT_TOLERANCE
from apps.qualify.reference_choice import AUTO, REFERENCES
from apps.qualify.run import QualifyConfig, QualifyError, qualify
from libs.weights.policy import DEFAULT_POLICY, POLICIES


def register(commands, benches) -> None:
    q = commands.add_parser("qualify", help="physical qualification gate of a fleet file's route: scenarios, "
                                            "parity and calibration, recorded in the registry")
    q.add_argument("--fleet", required=True, help="fleet file (hosts as network namespaces; needs root)")
    q.add_argument("--checkpoint", required=True, help="checkpoint directory to serve")
    q.add_argument("--runs", type=int, default=3, help="qualification runs (default 3)")
    q.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                   help="largest bottleneck prediction error that passes (default 0.25)")
    q.add_argument("--parity-tolerance", type=float, default=1e-4,
                   help="largest max |activation - reference| at any boundary and on the final logits (fp32)")
    q.add_argument("--state-dir", default=".fornax", help="the fleet's state dir; its registry keeps the records")
    q.add_argument("--out", default="qualify-report", help="directory for qualify.json and qualify.html")
    q.add_argument("--skew-hours", type=float, default=3.0, help="host clock skew for the expiry check")
    q.add_argument("--expiry-budget-s", type=float, default=1.0,
                   help="deadline budget of the expiry check's stream (it must not end by itself sooner)")
    q.add_argument("--expiry-tolerance-s", type=float, default=0.5)
    q.add_argument("--decode-tokens", type=int, default=24, help="greedy tokens per stream")
    q.add_argument("--numpy-only", action="store_true",
                   help="run every host on the numpy backend (no MAX compiles); the route key says so")
    q.add_argument("--install-timeout-s", type=float, default=3600.0)
    q.add_argument("--reference", choices=REFERENCES, default=AUTO,
                   help="whole: transformers holds the float32 model (greedy ids, every boundary); streamed: one "
                        "decoded layer at a time (the route's greedy tokens scored teacher forced, every "
                        "boundary); auto (default): streamed when the float32 model plus a margin exceeds the "
                        "memory available")
    q.add_argument("--weights", choices=POLICIES, default=DEFAULT_POLICY,
                   help="weight policy of every stage a fleet file's host does not set (as fornax up --weights)")
    q.set_defaults(func=cmd_qualify)


def cmd_qualify(args: argparse.Namespace) -> int:
    cfg = QualifyConfig(
        fleet_file=Path(args.fleet), checkpoint=Path(args.checkpoint), runs=args.runs, tolerance=args.tolerance,
        parity_tolerance=args.parity_tolerance, state_dir=Path(args.state_dir), out_dir=Path(args.out),
        skew_s=int(args.skew_hours * 3600), expiry_budget_s=args.expiry_budget_s,
        expiry_tolerance_s=args.expiry_tolerance_s, decode_tokens=args.decode_tokens,
        install_timeout_s=args.install_timeout_s, numpy_only=args.numpy_only, reference=args.reference,
        weights=args.weights,
        command=shlex.join(["fornax", *sys.argv[1:]]) if sys.argv[1:2] == ["qualify"] else
        shlex.join(["fornax", "qualify", "--fleet", args.fleet, "--checkpoint", args.checkpoint,
                    "--runs", str(args.runs)]))
    try:
        result = qualify(cfg)
    except (QualifyError, FleetFileError, IsolationUnavailable, IsolationFailed, LaunchError, RouteFailed,
            TimeoutError) as exc:
        print(f"fornax: qualify: {exc}", file=sys.stderr)
        return 2
    verdict = result.verdict
    print(f"qualification gate {'PASSED' if verdict.passed else 'FAILED'} after {len(result.runs)} run(s) "
          f"on route {verdict.calibration.route_key}")
    for line in verdict.describe():
        print(line)
    print("figures are physical: measured on")
    for line in result.facts.hosts:
        print(f"  {line}")
    print(f"  model snapshot {result.facts.model_snapshot}; command: {result.facts.command}")
    print(f"  {result.facts.skew}; load average {result.facts.load_average}")
    print(f"reference: {result.facts.reference}")
    print(f"parity gates: {result.facts.gates}")
    print(f"records: {', '.join(result.record_ids)} (signed by the orchestrator's fleet identity)")
    print(f"report: {result.html_path}  artifact: {result.json_path}")
    return 0 if verdict.passed else 1
