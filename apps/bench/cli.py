"""`fornax bench serve [--json]`, `fornax bench grammar`, `fornax bench prefix [--json]` and
`fornax bench coldstart [--json]`."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from apps.bench.block_matmul_cli import register_block_matmul
from apps.bench.placement_core import PLACEMENT_REPEATS, PLACEMENT_WAVES

if TYPE_CHECKING:
    from apps.bench.serve import BenchOptions

DEFAULT_CHECKPOINT = Path(".cache/bench/small")


def _refused(exc: Exception, bench: str = "serve") -> int:
    """Say why a bench could not run, led by the error's stable reason code when it carries one; exit 2."""
    reason, text = getattr(exc, "reason", ""), str(exc)
    if reason and not text.startswith(reason):
        text = f"{reason}: {text}"
    print(f"fornax bench {bench}: {text}", file=sys.stderr)
    return 2


def _emit(report: dict, as_json: bool, render) -> None:
    """The report as JSON, or through `render` for people."""
    if as_json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        render(report)


def register(commands, benches) -> None:
    for add in (_register_serve, _register_gguf, _register_coldstart, _register_grammar, _register_placement,
                _register_tls_front, _register_prefix, _register_load, register_block_matmul):
        add(benches)


def _register_serve(benches) -> None:
    serve = benches.add_parser("serve", help="serving throughput, TTFT and ITL: 2-stage vs 1-stage vs transformers")
    serve.add_argument(
        "--checkpoint", help=f"checkpoint dir (default: the small preset, generated into {DEFAULT_CHECKPOINT})"
    )
    serve.add_argument("--backend", choices=("numpy", "max"), default="numpy")
    serve.add_argument("--weights", choices=("fp32", "bf16", "q8_0", "q4_k_m"), default="fp32",
                       help="also a 1-stage route on the checkpoint built in this policy (for --backend), side by "
                            "side with the float32 one: vs_fp32_c<N>, resident_vs_artifact; with --peer, "
                            "vs_llama_cpp_c<N> compares this route with a GGUF of the same quantization; with "
                            "--fleet, the policy of every host whose `weights:` the file does not set")
    serve.add_argument("--prompt-tokens", type=int, default=32)
    serve.add_argument("--max-tokens", type=int, default=16)
    serve.add_argument("--concurrency", help="comma-separated levels (default 1,8,32; 1,8,32,64 with "
                                              "--compare-routes)")
    serve.add_argument("--repeats", type=int, default=2, help="interleaved repetitions per level (best kept)")
    serve.add_argument("--fleet", help="measure a netns fleet from this fleet file instead (needs root); with "
                                        "--peer, llama.cpp then runs on the whole box once the fleet is down")
    serve.add_argument("--json", action="store_true")
    serve.add_argument("--compare-routes", action="store_true",
                       help="with --fleet: one route over every stage host vs two equal replica routes, both "
                            "planned and served in this run (chosen_vs_best_c<N>, planner_picked_faster)")
    serve.add_argument("--kill-at", type=float, metavar="SECONDS",
                       help="with --compare-routes: SIGKILL a stage of the first replica route this many seconds "
                            "into a level-32 window (lost requests, 5xx, largest inter-token gap)")
    serve.add_argument("--mixed", action="store_true",
                       help="ITL p99 of 32 decoding streams while 512-token prompts arrive, "
                            "with and without chunked prefill")
    serve.add_argument("--preset", choices=("tiny", "small"), default="small",
                       help="generated checkpoint preset when --checkpoint is not given")
    serve.add_argument("--peer", choices=("llama.cpp",),
                       help="also measure this peer side by side on the same prompts (needs --llama-server, --gguf)")
    serve.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio",
                       help="event loop of the in-process serving core (orchestrator side)")
    serve.add_argument("--llama-server", help="--peer llama.cpp: the llama-server binary")
    serve.add_argument("--gguf", help="--peer llama.cpp: the checkpoint converted to GGUF")
    serve.add_argument("--tokens-per-step", type=int, default=48,
                       help="--mixed: the chunked setting's token budget per step")
    serve.add_argument("--kv-dtype",
                       help="comma-separated KV dtypes (fp32,bf16,fp8): per dtype, the most concurrent sequences "
                            "one stage admits at --kv-limit-bytes and its decode tokens/s; sequences_vs_fp32_<dtype>")
    serve.add_argument("--kv-limit-bytes", type=int, default=128 << 20, help="--kv-dtype: the stage's KV limit")
    serve.add_argument("--sequence-tokens", type=int, default=1024, help="--kv-dtype: tokens per sequence")
    serve.add_argument("--decode-sequences", type=int, default=4,
                       help="--kv-dtype: admitted sequences that decode for the tokens/s figure")
    serve.add_argument("--decode-steps", type=int, default=4, help="--kv-dtype: decode steps per repeat")
    serve.set_defaults(func=cmd_serve)


def _register_gguf(benches) -> None:
    gguf = benches.add_parser("gguf", help="convert a checkpoint to GGUF with llama.cpp's converter "
                                           "(for serve --peer llama.cpp)")
    gguf.add_argument("--llama-cpp", required=True,
                      help="a llama.cpp source tree holding convert_hf_to_gguf.py "
                           "(llama-cpp-python's sdist: vendor/llama.cpp)")
    gguf.add_argument("--checkpoint", help=f"checkpoint dir (default: the preset, generated into {DEFAULT_CHECKPOINT})")
    gguf.add_argument("--preset", choices=("tiny", "small"), default="small",
                      help="generated checkpoint preset when --checkpoint is not given")
    gguf.add_argument("--outtype", choices=("f32", "f16", "bf16", "q8_0"), default="f32",
                      help="the converter's output type (q8_0: half the disk of bf16, e.g. for a model that is then "
                           "re-quantized with llama-quantize --allow-requantize)")
    gguf.add_argument("--outfile", required=True, help="the GGUF to write")
    gguf.set_defaults(func=cmd_gguf)


def _register_coldstart(benches) -> None:
    cold = benches.add_parser("coldstart", help="cold `fornax up` with empty caches: first token, MAX switch, losses")
    cold.add_argument("--stages", type=int, default=2)
    cold.add_argument("--trickle-interval-s", type=float, default=0.5, help="one request started per interval")
    cold.add_argument("--timeout-s", type=float, default=1800.0)
    cold.add_argument("--keep-dir", action="store_true", help="keep the temporary HOME, caches and logs")
    cold.add_argument("--json", action="store_true")
    cold.set_defaults(func=cmd_coldstart)


def _register_grammar(benches) -> None:
    grammar = benches.add_parser("grammar", help="per-token mask cost of the structured-output grammar engines")
    grammar.add_argument("--checkpoint", help=f"checkpoint dir (default: the small preset in {DEFAULT_CHECKPOINT})")
    grammar.add_argument("--walks", type=int, default=20, help="seeded random walks per engine")
    grammar.add_argument("--max-steps", type=int, default=200, help="tokens per walk at most")
    grammar.set_defaults(func=cmd_grammar)


def _register_placement(benches) -> None:
    placement = benches.add_parser("placement", help="calibrated placement vs an even layer split on a netns "
                                                    "fleet of two unlike hosts (needs root)")
    placement.add_argument("--fleet", required=True, help="fleet file with two stage hosts")
    placement.add_argument("--checkpoint", help=f"checkpoint dir (default: the small preset in {DEFAULT_CHECKPOINT})")
    placement.add_argument("--preset", choices=("tiny", "small"), default="small",
                           help="generated checkpoint preset when --checkpoint is not given")
    placement.add_argument("--prompt-tokens", type=int, default=16)
    placement.add_argument("--max-tokens", type=int, default=24)
    placement.add_argument("--concurrency", type=int, default=8)
    placement.add_argument("--repeats", type=int, default=PLACEMENT_REPEATS,
                           help=f"interleaved repetitions per split, best kept (default {PLACEMENT_REPEATS})")
    placement.add_argument("--waves", type=int, default=PLACEMENT_WAVES,
                           help="timed passes of the load per run, after one untimed pass on the freshly loaded "
                                f"route (default {PLACEMENT_WAVES})")
    placement.add_argument("--state-dir", default=".fornax",
                           help="where `fornax profile` stored this fleet's profile records (the calibrated plan's "
                                "evidence)")
    placement.add_argument("--every-split", action="store_true",
                           help="also serve every other placement of the layers on the two hosts (both host "
                                "orders, every cut), interleaved, and report each one's tokens/s")
    placement.add_argument("--json", action="store_true")
    placement.set_defaults(func=cmd_placement)


def _register_tls_front(benches) -> None:
    front = benches.add_parser("tls-front", help="latency the TLS front adds: unary and stream, vs gRPC core TLS")
    front.add_argument("--calls", type=int, default=400, help="unary calls per configuration")
    front.add_argument("--streams", type=int, default=40, help="streams per configuration")
    front.add_argument("--stream-messages", type=int, default=64, help="messages (tokens) per stream")
    front.add_argument("--front-loop", choices=("asyncio", "uvloop"), default="uvloop")
    front.add_argument("--json", action="store_true")
    front.set_defaults(func=cmd_tls_front)


def _register_prefix(benches) -> None:
    prefix = benches.add_parser("prefix", help="TTFT with prompt-prefix reuse off and on: a growing chat and an "
                                               "agent's shared system prompt, 2-stage route")
    prefix.add_argument("--checkpoint", help=f"checkpoint dir (default: the preset, in {DEFAULT_CHECKPOINT})")
    prefix.add_argument("--preset", choices=("tiny", "small"), default="small",
                        help="generated checkpoint preset when --checkpoint is not given")
    prefix.add_argument("--backend", choices=("numpy", "max"), default="numpy")
    prefix.add_argument("--turns", type=int, default=10)
    prefix.add_argument("--turn-tokens", type=int, default=200, help="new user tokens per chat turn")
    prefix.add_argument("--agent-system-tokens", type=int, default=1500)
    prefix.add_argument("--agent-calls", type=int, default=32)
    prefix.add_argument("--max-tokens", type=int, default=8)
    prefix.add_argument("--fleet", help="run through a netns fleet from this fleet file instead, over its HTTPS "
                                        "front (needs root)")
    prefix.add_argument("--json", action="store_true")
    prefix.set_defaults(func=cmd_prefix)


def _register_load(benches) -> None:
    load = benches.add_parser("load", help="many small streaming requests against a running fleet: lost and p99")
    load.add_argument("--state-dir", default=".fornax", help="the running fleet's state directory")
    load.add_argument("--api", help="API base URL (default: the fleet file's)")
    load.add_argument("--requests", type=int, help="default 1000 (200000 with --long)")
    load.add_argument("--concurrency", type=int, default=64)
    load.add_argument("--prompt-tokens", type=int, help="default 8 (2 with --long)")
    load.add_argument("--max-tokens", type=int, help="default 8 (1 with --long)")
    load.add_argument("--long", action="store_true", help="200,000 tiny requests (no capacity cliff, no leak)")
    load.add_argument("--cacert", help="CA bundle verifying an https API (default: the fleet file's fleet CA)")
    load.add_argument("--json", action="store_true")
    load.set_defaults(func=cmd_load)


def _checkpoint(path: str | None, preset: str = "small") -> str:
    if path:
        return path
    target = DEFAULT_CHECKPOINT.parent / preset
    if not (target / "config.json").exists():
        from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint

        print(f"generating the {preset} preset into {target}", file=sys.stderr)
        write_checkpoint(CheckpointRequest(preset, target, seed=0))
    return str(target)


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
    from libs.service.event_loop import EventLoopKind

    _quiet_logs()
    if args.mixed:
        return _mixed(args)
    if args.kv_dtype:
        return _kv_capacity(args)

    try:
        levels = _levels(args)
    except ValueError as exc:
        return _refused(exc)
    if args.compare_routes:
        return _compare_routes(args, levels)
    if args.fleet:
        return _serve_fleet(args, levels)
    try:
        llama = _llama_peer(args, levels)
    except ValueError as exc:
        return _refused(exc)
    options = BenchOptions(
        _checkpoint(args.checkpoint, args.preset),
        args.prompt_tokens,
        args.max_tokens,
        args.backend,
        levels,
        args.repeats,
        llama,
        EventLoopKind(args.loop),
        args.weights,
    )
    from apps.bench.llama_peer import PeerError

    try:
        report = run(options, "fornax " + " ".join(sys.argv[1:]))
    except PeerError as exc:
        return _refused(exc)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return 0
    _print_serve(report, options)
    return 0


def _levels(args: argparse.Namespace) -> tuple[int, ...]:
    """--concurrency, and the flags --compare-routes needs or allows, checked before anything starts."""
    if args.compare_routes and not args.fleet:
        raise ValueError("COMPARE_ROUTES_WITHOUT_FLEET: --compare-routes needs --fleet FILE")
    if args.peer and args.compare_routes:
        raise ValueError("PEER_WITH_COMPARE_ROUTES: --peer measures the fleet's route (or the local setups), not "
                         "--compare-routes' layouts")
    if args.kill_at is not None and not args.compare_routes:
        raise ValueError("KILL_AT_WITHOUT_COMPARE_ROUTES: --kill-at needs --compare-routes (it kills a replica "
                         "route's stage)")
    text = args.concurrency or ("1,8,32,64" if args.compare_routes else "1,8,32")
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"BAD_CONCURRENCY: --concurrency takes comma-separated integers, got {text!r}") from None


def _compare_routes(args: argparse.Namespace, levels: tuple[int, ...]) -> int:
    from apps.bench.fleet_layouts import LayoutBenchOptions, check_options, print_report, run_layout_bench
    from apps.bench.layout_compare import LayoutPickError
    from apps.fleet.netns import IsolationFailed, IsolationUnavailable
    from apps.fleet.spec import FleetFileError, load_fleet_spec

    try:
        spec = load_fleet_spec(args.fleet)
        options = LayoutBenchOptions(args.fleet, spec, "", args.prompt_tokens, args.max_tokens, levels,
                                     args.kill_at)
        try:
            check_options(options)  # before a checkpoint is generated
        except ValueError as exc:
            return _refused(exc)
        options = replace(options, checkpoint=str(Path(_checkpoint(args.checkpoint, args.preset)).resolve()))
        report = run_layout_bench(options, "fornax " + " ".join(sys.argv[1:]),
                                  lambda message: print(f"  {message}", file=sys.stderr))
    except (FleetFileError, IsolationUnavailable, IsolationFailed, LayoutPickError) as exc:
        return _refused(exc)
    _emit(report, args.json, print_report)
    return 0


def _print_serve(report: dict, options: BenchOptions) -> None:
    """The human-readable `bench serve` report: one row per setup and level, then the ratios."""
    prov = report["provenance"]
    print(f"# {prov['label']}: {prov['hardware']}; {prov['backend_build']}; {prov['transformers_build']}")
    print(f"# model {prov['model_snapshot']}; prompt {options.prompt_tokens} tokens, {options.max_tokens} new tokens")
    print(f"{'setup':<18}{'conc':>5}{'tok/s':>10}{'TTFT p50':>10}{'TTFT p99':>10}{'ITL p50':>10}{'ITL p99':>10}")
    for name in ("pipeline_2_stage", "pipeline_1_stage", "transformers", "llama_cpp"):
        for level, f in report.get(name, {}).items():
            print(f"{name:<18}{level[1:]:>5}{f['output_tokens_per_s']:>10.1f}{f['ttft_p50_s']:>10.3f}"
                  f"{f['ttft_p99_s']:>10.3f}{f['itl_p50_s']:>10.3f}{f['itl_p99_s']:>10.3f}")
    for key in sorted(k for k in report if k.startswith(("two_vs", "pipeline_vs", "one_stage_vs", "vs_llama"))):
        print(f"{key} = {report[key]:.2f}")
    for level, agreement in report.get("greedy_vs_llama_cpp", {}).items():
        print(f"greedy ids, 1-stage vs llama.cpp, {level}: {agreement['identical_streams']}/{agreement['streams']} "
              f"streams identical, {agreement['agreeing_prefix_tokens']}/{agreement['tokens']} tokens before a "
              f"difference")


def cmd_gguf(args: argparse.Namespace) -> int:
    from apps.bench.gguf_convert import ConvertError, convert

    try:
        out = convert(Path(args.llama_cpp), Path(_checkpoint(args.checkpoint, args.preset)), Path(args.outfile),
                      args.outtype)
    except ConvertError as exc:
        return _refused(exc, "gguf")
    print(out)
    return 0


def _llama_peer(args: argparse.Namespace, levels: tuple[int, ...]):
    """The llama.cpp peer's options, checked before anything starts; None without --peer."""
    from apps.bench.llama_peer import LlamaPeerOptions, PeerError, check_options
    from libs.service.affinity import usable_cpus

    if args.peer is None:
        if args.llama_server or args.gguf:
            raise ValueError("PEER_ARGS_WITHOUT_PEER: --llama-server and --gguf need --peer llama.cpp")
        return None
    if not (args.llama_server and args.gguf):
        raise ValueError("PEER_ARGS_MISSING: --peer llama.cpp needs --llama-server PATH and --gguf PATH")
    options = LlamaPeerOptions(args.llama_server, args.gguf, slots=max(levels),
                               context_per_slot=args.prompt_tokens + args.max_tokens + 16,
                               threads=len(usable_cpus()))
    try:
        check_options(options)
    except PeerError as exc:
        raise ValueError(f"{exc.reason}: {exc}") from None
    return options


def _serve_fleet(args: argparse.Namespace, levels: tuple[int, ...]) -> int:
    from apps.bench.fleet_serve import FleetBenchOptions, FleetBenchRefused, check_options, run_fleet_bench
    from apps.bench.llama_peer import PeerError
    from apps.fleet.netns import IsolationFailed, IsolationUnavailable
    from apps.fleet.spec import FleetFileError, load_fleet_spec

    try:
        llama = _llama_peer(args, levels)  # before a checkpoint is generated or a fleet starts
        if llama is not None:  # its GGUF may be gigabytes, read cold once the fleet is down
            llama = replace(llama, startup_timeout_s=1800.0)
        spec = load_fleet_spec(args.fleet)
        options = FleetBenchOptions(args.fleet, spec, _checkpoint(args.checkpoint), args.prompt_tokens,
                                    args.max_tokens, levels, weights=args.weights, llama=llama)
        check_options(options)
        report = run_fleet_bench(options, "fornax " + " ".join(sys.argv[1:]))
    except (FleetFileError, IsolationUnavailable, IsolationFailed, ValueError, FleetBenchRefused, PeerError) as exc:
        return _refused(exc)
    _emit(report, args.json, _print_fleet)
    if report.get("peer_error"):  # the fleet's figures are printed; the peer's are missing
        print(f"fornax bench serve: llama.cpp peer failed: {report['peer_error']['message']}", file=sys.stderr)
        return 1
    return 0


def _print_fleet(report: dict) -> None:
    """The human-readable `bench serve --fleet` report."""
    prov = report["provenance"]
    print(f"# {prov['label']}; fleet {prov['fleet_file']} sha256:{prov['fleet_file_sha256']}; {prov['hardware']}")
    print(f"{'conc':>5}{'tok/s':>10}{'TTFT p50':>10}{'TTFT p99':>10}{'ITL p50':>10}{'ITL p99':>10}  hop bytes/token")
    for level, f in report["levels"].items():
        hops = ", ".join(f"{h['boundary_payload_bytes_per_token']:.0f}" for h in f["hops"].values())
        print(f"{level[1:]:>5}{f['output_tokens_per_s']:>10.1f}{f['ttft_p50_s']:>10.3f}{f['ttft_p99_s']:>10.3f}"
              f"{f['itl_p50_s']:>10.3f}{f['itl_p99_s']:>10.3f}  {hops}")
    for level, f in (report.get("llama_cpp") or {}).items():
        print(f"{'llama.cpp ' + level[1:]:>15}{f['output_tokens_per_s']:>10.1f}  "
              f"vs_llama_cpp_{level} = {report.get(f'vs_llama_cpp_{level}')}")
    for level, f in report["levels"].items():
        if f.get("pipeline"):
            p = f["pipeline"]
            print(f"{level}: pipeline efficiency {p['pipeline_efficiency']:.3f} (slowest {p['slowest_stage']} "
                  f"alone {p['slowest_stage_alone_tokens_per_s']:.1f} tok/s)")
        for name, stage in f["stages"].items():
            if "busy_fraction" in stage:
                print(f"  {name}: busy {stage['busy_fraction']:.1%}  waiting for input "
                      f"{stage['input_wait_fraction']:.1%}  waiting for credit {stage['credit_wait_fraction']:.1%}")
    for host, ratios in report["peak_rss_vs_limit"].items():
        print(f"host {host}: peak vs limit {ratios}; OOM kills {report['hosts_memory'][host].get('oom_kills')}")
    agreement = report["agreement"]
    if agreement["top1_agreement"] is None:
        print(f"top-1 agreement: not measured: {agreement['reason']}")
    else:
        print(f"top-1 agreement with transformers fp32 at hops {agreement['hop_boundary_dtypes']}: "
              f"{agreement['top1_agreement']:.4f} over {agreement['positions']} positions")


def _kv_capacity(args: argparse.Namespace) -> int:
    from apps.bench.kv_capacity import KvCapacityOptions, check_options, run
    from libs.service.errors import FornaxError

    options = KvCapacityOptions(
        "", tuple(x.strip() for x in args.kv_dtype.split(",") if x.strip()), args.backend, args.kv_limit_bytes,
        args.sequence_tokens, args.decode_sequences, args.decode_steps, args.repeats)
    try:
        check_options(options)  # before a checkpoint is generated or loaded
        options = replace(options, checkpoint=_checkpoint(args.checkpoint, args.preset))
        report = run(options, "fornax " + " ".join(sys.argv[1:]))
    except (FornaxError, ValueError) as exc:
        return _refused(exc)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return 0
    print(f"# KV limit {options.kv_limit_bytes} bytes, {options.sequence_tokens}-token sequences, one stage")
    print(f"{'kv dtype':<9}{'block B':>9}{'blocks':>8}{'seqs':>6}{'admitted':>10}{'decode tok/s':>14}")
    for name, row in report["kv_dtypes"].items():
        print(f"{name:<9}{row['block_bytes']:>9}{row['blocks_at_limit']:>8}{row['sequences']:>6}"
              f"{row.get('sequences_admitted', '-'):>10}{row.get('decode_tokens_per_s', float('nan')):>14.1f}")
    for key in sorted(k for k in report if k.startswith("sequences_vs_fp32_")):
        print(f"{key} = {report[key]:.3f} (contract)")
    for key, label in report["figures"].items():
        print(f"# {key}: {label}")
    return 0


def _mixed(args: argparse.Namespace) -> int:
    from apps.bench.mixed import MixedOptions, measure_mixed
    from apps.bench.serve import BenchOptions, provenance

    if args.tokens_per_step < 1:
        print("serve --mixed: --tokens-per-step must be >= 1", file=sys.stderr)
        return 2
    checkpoint = _checkpoint(args.checkpoint, args.preset)
    options = MixedOptions(checkpoint, args.backend, tokens_per_step=args.tokens_per_step)
    report = measure_mixed(options)
    report["provenance"] = provenance(BenchOptions(checkpoint, backend=args.backend),
                                      "fornax " + " ".join(sys.argv[1:]))
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return 0
    prov = report["provenance"]
    print(f"# {prov['label']}: {prov['hardware']}; {prov['backend_build']}; model {prov['model_snapshot']}")
    for prefix, name in (("", "chunked"), ("unchunked_", "unchunked")):
        print(f"{name:<10} ITL p99 plain {report[prefix + 'itl_p99_plain_s']:.4f}s  "
              f"mixed {report[prefix + 'itl_p99_mixed_s']:.4f}s  "
              f"mixed/plain {report[prefix + 'itl_p99_mixed_vs_plain']:.2f}")
    return 0


def cmd_grammar(args: argparse.Namespace) -> int:
    from apps.bench.grammar import run

    report = run(_checkpoint(args.checkpoint), args.walks, args.max_steps,
                 "fornax " + " ".join(sys.argv[1:]))
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0


def cmd_prefix(args: argparse.Namespace) -> int:
    from apps.bench.prefix import PrefixBenchOptions, run

    _quiet_logs()
    options = PrefixBenchOptions(_checkpoint(args.checkpoint, args.preset), args.backend, args.turns,
                                 args.turn_tokens, args.agent_system_tokens, agent_calls=args.agent_calls,
                                 max_tokens=args.max_tokens)
    command = "fornax " + " ".join(sys.argv[1:])
    if args.fleet:
        from apps.bench.prefix_fleet import PrefixFleetOptions, run_prefix_fleet
        from apps.fleet.netns import IsolationFailed, IsolationUnavailable
        from apps.fleet.spec import FleetFileError, load_fleet_spec

        try:
            report = run_prefix_fleet(PrefixFleetOptions(args.fleet, load_fleet_spec(args.fleet), options), command)
        except (FleetFileError, IsolationUnavailable, IsolationFailed) as exc:
            return _refused(exc, "prefix")
    else:
        report = run(options, command)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        for key in ("cached_turn10_vs_turn1_ttft", "uncached_vs_cached_turn10_ttft", "uncached_vs_cached_agent_ttft",
                    "greedy_outputs_identical"):
            print(f"{key}: {report[key]}")
        print(f"({report['evidence_class']}: {report['hardware']}; {report['command']})")
    return 0 if report["greedy_outputs_identical"] else 1


def cmd_tls_front(args: argparse.Namespace) -> int:
    from apps.bench.tls_front import FrontBenchOptions, render, run
    from libs.service.event_loop import EventLoopKind

    options = FrontBenchOptions(calls=args.calls, streams=args.streams, stream_messages=args.stream_messages,
                                front_loop=EventLoopKind(args.front_loop))
    report = run(options, "fornax " + " ".join(sys.argv[1:]))
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else render(report))
    return 0


def cmd_load(args: argparse.Namespace) -> int:
    import asyncio

    from apps.bench.load import LONG_REQUESTS, LoadOptions, report, run_load
    from libs.service.fleet_state import read_fleet

    state = read_fleet(args.state_dir)
    api = args.api or (state.api if state else None)
    if not api:
        print(f"fornax: no --api and no running fleet in {args.state_dir}", file=sys.stderr)
        return 2
    options = LoadOptions(
        api=api.rstrip("/"), api_key=state.api_key if state else None,
        ca_file=args.cacert or (state.api_ca if state and not args.api else None),
        requests=args.requests or (LONG_REQUESTS if args.long else 1000),
        concurrency=args.concurrency,
        prompt_tokens=args.prompt_tokens or (2 if args.long else 8),
        max_tokens=args.max_tokens or (1 if args.long else 8))
    outcomes, wall_s = asyncio.run(run_load(
        options, lambda done: print(f"  {done} requests done", file=sys.stderr)))
    figures = report(options, outcomes, wall_s, "fornax " + " ".join(sys.argv[1:]))
    if args.json:
        print(json.dumps(figures, indent=2, sort_keys=True))
    else:
        print(f"# {figures['provenance']['label']}: {figures['provenance']['hardware']}")
        print(f"requests {figures['requests']}  lost {figures['lost']}  p50 {figures['p50_s']}  "
              f"p99 {figures['p99_s']}  req/s {figures['requests_per_s']}")
    return 0 if figures["lost"] == 0 else 1


def cmd_coldstart(args: argparse.Namespace) -> int:
    from apps.bench.coldstart import ColdstartOptions, run

    report = run(ColdstartOptions(args.stages, trickle_interval_s=args.trickle_interval_s,
                                  timeout_s=args.timeout_s, keep_dir=args.keep_dir),
                 "fornax " + " ".join(sys.argv[1:]))
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(f"# {report['figure_class']}; {report['host']}")
        for key in ("seconds_to_first_token", "seconds_to_final_backend", "requests_lost_during_switch",
                    "requests_sent", "final_backend", "failure"):
            print(f"{key} = {report[key]}")
    ok = report["final_backend"] == "max" and report["requests_lost_during_switch"] == 0
    return 0 if ok else 1


def cmd_placement(args: argparse.Namespace) -> int:
    from apps.bench.placement import PlacementBenchError, PlacementBenchOptions, every_split_lines, run_placement_bench
    from apps.fleet.netns import IsolationFailed, IsolationUnavailable
    from apps.fleet.spec import FleetFileError, load_fleet_spec

    _quiet_logs()
    try:
        spec = load_fleet_spec(args.fleet)
        checkpoint = str(Path(_checkpoint(args.checkpoint, args.preset)).resolve())
        options = PlacementBenchOptions(args.fleet, spec, checkpoint, prompt_tokens=args.prompt_tokens,
                                        max_tokens=args.max_tokens, concurrency=args.concurrency,
                                        repeats=args.repeats, waves=args.waves, profiles_state_dir=args.state_dir,
                                        every_split=args.every_split)
        report = run_placement_bench(options, "fornax " + " ".join(sys.argv[1:]),
                                     lambda message: print(f"  {message}", file=sys.stderr))
    except (FleetFileError, IsolationUnavailable, IsolationFailed, PlacementBenchError) as exc:
        return _refused(exc, "placement")
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return 0
    prov = report["provenance"]
    print(f"# {prov['label']}; fleet {prov['fleet_file']} sha256:{prov['fleet_file_sha256']}; {prov['hardware']}; "
          f"model {prov['model_snapshot']}; load average {prov['load_average']}")
    for host, facts in prov["hosts"].items():
        print(f"# host {host}: {facts['backend_build']}, quota {facts['cpu_quota_cores']:g} cores")
    for name in ("even", "calibrated"):
        split = report[name]
        stages = ", ".join(f"{s['host']} [{s['layer_start']},{s['layer_end_exclusive']}) "
                           f"measured {s['measured_decode_service_s']:.4f}s "
                           f"predicted {s['predicted_decode_service_s']:.4f}s (prediction) "
                           f"at {s['measured_rows_per_microbatch']:.3g} rows"
                           for s in split["stages"])
        print(f"{name:<11} physical {split['output_tokens_per_s']:.1f} tok/s; {stages}")
    same = " (the calibrated split is the even split: the ratio is run-to-run noise)" \
        if report["calibrated_equals_even"] else ""
    print(f"calibrated_vs_even_tok_s = {report['calibrated_vs_even_tok_s']:.2f} (physical){same}")
    print(f"bottleneck_prediction_error = {report['bottleneck_prediction_error']:.3f} "
          "(physical measurement vs the planner's profile-based prediction)")
    print("\n".join(every_split_lines(report)))
    return 0
