"""`fornax profile --fleet FILE --checkpoint DIR`: measure every stage host and every link of the
fleet, store each profile as a signed physical record in the fleet's registry, and print them.

It uses the fleet running from --state-dir, or brings the fleet file's hosts up (network
namespaces and cgroups, no route installed) and takes them down again afterwards; the registry's
state stays under the state directory, so a later `fornax up` or `fornax qualify` finds the records.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
from pathlib import Path

from apps.fleet.profiling import FleetProfiles, ProfileRequest, Worker, profile_fleet
from apps.fleet.spec import FleetFileError, load_fleet_spec
from libs.profiles.measure import Grid
from libs.profiles.schema import Calibration, Figure, LayerKindProfile, StageProfile
from libs.security.cli_credentials import operator_credentials
from libs.service.channels import ChannelConfig
from libs.service.errors import FornaxError
from libs.service.fleet_state import FleetState, fleet_path
from libs.weights.policy import DEFAULT_POLICY, POLICIES

EVIDENCE = "PHYSICAL"
# A serving window's tokens per stream. It measures from every stream's first token until the
# first stream ends (on the tiny checkpoint one prompt ends after 38 tokens), so asking for more
# than qualify's 24 gives each window more decode microbatches for the cost of a few hundred ms;
# the route's own spread between bring-ups is what a window cannot narrow.
WINDOW_DECODE_TOKENS = 64


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def register(commands, benches) -> None:
    grid = Grid()
    p = commands.add_parser("profile", help="measure every stage host and link; store signed physical profiles")
    p.add_argument("--fleet", help="fleet file; its hosts are brought up unless a fleet already runs")
    p.add_argument("--checkpoint", required=True, help="checkpoint directory whose layers are profiled")
    p.add_argument("--state-dir", default=".fornax")
    p.add_argument("--runs", type=int, default=grid.runs, help="repeated runs of every figure (default 3)")
    p.add_argument("--prefill-lengths", type=_ints, default=grid.prefill_lengths,
                   help="prompt lengths S, comma-separated (default 16,128,512)")
    p.add_argument("--decode-batches", type=_ints, default=grid.decode_batches,
                   help="decode microbatch sizes, comma-separated (default 1,8,32)")
    p.add_argument("--decode-contexts", type=_ints, default=grid.decode_contexts,
                   help="past tokens of each decode row, comma-separated: every decode figure is measured at "
                        "each (default 32,128,512)")
    p.add_argument("--min-run-ms", type=int, default=round(grid.min_run_s * 1000),
                   help="each run repeats a call for at least this long (default 300: three CFS periods)")
    p.add_argument("--valid-for-s", type=int, default=7 * 24 * 3600, help="validity window of each record")
    p.add_argument("--weights", choices=POLICIES, default=None,
                   help="weight policy the profiles time: fp32 (default), bf16, q8_0 or q4_k_m; with --fleet, every "
                        "host whose `weights:` the file does not set (as `fornax up` serves them)")
    p.add_argument("--all-at-once", action="store_true",
                   help="time every stage host at once, as a route keeps them busy (default: one host at a time)")
    p.add_argument("--json", action="store_true", help="print the stored profiles as JSON")
    p.add_argument("--serving-window", action=argparse.BooleanOptionalAction, default=True,
                   help="with --fleet: end by serving a short decode on the plan the fresh profiles give, and store "
                        "how far each host's compute and wire in the route were from the profiles (data plane and "
                        "control services on its cores) for the planner (default on; needs the fleet's hosts to "
                        "itself)")
    p.add_argument("--window-runs", type=int, default=3, help="decode windows the serving window measures")
    p.add_argument("--window-decode-tokens", type=int, default=WINDOW_DECODE_TOKENS,
                   help="greedy tokens each serving-window stream asks for; a window measures until the first "
                        f"stream ends (default {WINDOW_DECODE_TOKENS}: more decode microbatches per window than "
                        "qualify's 24)")
    p.add_argument("--startup-timeout-s", type=float, default=180.0)
    p.set_defaults(func=cmd_profile)


def _fail(message: str) -> int:
    print(f"fornax profile: {message}", file=sys.stderr)
    return 2


def workers_of(state: FleetState, stage_hosts: list[str] | None, weights: list[str | None] | None = None,
               default_weights: str = DEFAULT_POLICY) -> list[Worker]:
    """The fleet's stage workers in index order, named by their fleet host (or their service name),
    each with the weight policy its host serves (`weights`, one per stage host, None where unset)."""
    entries = sorted((s for s in state.services if s.kind == "stage_worker"),
                     key=lambda s: int(s.name.rsplit("_", 1)[1]))
    if stage_hosts is not None and len(stage_hosts) != len(entries):
        raise ValueError(f"the fleet file names {len(stage_hosts)} stage hosts, the running fleet has {len(entries)}")
    return [Worker(stage_hosts[i] if stage_hosts else e.name, e.grpc,
                   (weights[i] if weights else None) or default_weights) for i, e in enumerate(entries)]


def cmd_profile(args: argparse.Namespace) -> int:
    from apps.cli.fleet import _running_fleet

    if args.runs < 1:
        return _fail(f"--runs must be at least 1, got {args.runs}")
    if not Path(args.checkpoint, "config.json").is_file():
        return _fail(f"--checkpoint {args.checkpoint!r} has no config.json")
    checkpoint = str(Path(args.checkpoint).resolve())
    spec = None
    if args.fleet:
        try:
            spec = load_fleet_spec(args.fleet)
        except FleetFileError as exc:
            return _fail(f"fleet file {args.fleet}: {exc}")
    stage_hosts = [h.name for h in spec.stage_hosts] if spec else None
    host_weights = [h.weights for h in spec.stage_hosts] if spec else None
    state = _running_fleet(args.state_dir)
    launcher = None
    if state is None:
        if spec is None:
            return _fail(f"no fleet runs from {fleet_path(args.state_dir)}; give --fleet FILE to bring one up")
        try:
            state, launcher = _bring_up(args, spec, checkpoint)
        except Exception as exc:  # noqa: BLE001 - reported, and nothing is left running
            return _fail(f"the fleet failed to start: {exc}")
    try:
        code = _profile(args, state, stage_hosts, host_weights, checkpoint)
    finally:
        if launcher is not None:
            _take_down(args.state_dir, launcher)
    return _then_serving_window(args, checkpoint, code, brought_up=launcher is not None)


def _then_serving_window(args: argparse.Namespace, checkpoint: str, code: int, brought_up: bool) -> int:
    if code or not args.serving_window or not args.fleet:
        return code
    if not brought_up:
        print("fornax profile: no serving window: it brings the fleet's hosts up itself, and a fleet runs from "
              f"{args.state_dir}", file=sys.stderr)
        return code
    return _serving_window(args, checkpoint)


def _serving_window(args: argparse.Namespace, checkpoint: str) -> int:
    """Serve the plan the fresh profiles give for a few decode windows, and store the calibration
    as a SERVING_WINDOW record: per stage, measured against predicted compute and wire."""
    from apps.qualify.run import QualifyError, qualify

    try:
        cfg = window_config(args, checkpoint)
    except ValueError as exc:
        return _fail(str(exc))
    print(f"serving window: {args.window_runs} decode window(s) on the plan the fresh profiles give", file=sys.stderr)
    try:
        result = qualify(cfg)
    except QualifyError as exc:
        return _fail(f"serving window: {exc}")
    for line in window_lines(result.verdict.calibration, result.record_ids):
        print(line, file=sys.stderr if args.json else sys.stdout)  # --json: stdout holds the profiles alone
    return 0 if not result.verdict.calibration.failures else 1


def window_config(args: argparse.Namespace, checkpoint: str):
    """The serving window's qualify configuration; ValueError names a flag out of range."""
    from apps.qualify.run import QualifyConfig

    if args.window_runs < 1:
        raise ValueError(f"--window-runs must be at least 1, got {args.window_runs}")
    if args.window_decode_tokens < 2:
        raise ValueError(f"--window-decode-tokens must be at least 2, got {args.window_decode_tokens}")
    state_dir = Path(args.state_dir)
    command = "fornax " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["profile"] else "fornax profile"
    return QualifyConfig(fleet_file=Path(args.fleet), checkpoint=Path(checkpoint), runs=args.window_runs,
                         state_dir=state_dir, out_dir=state_dir / "serving-window", command=command,
                         serving_window=True, decode_tokens=args.window_decode_tokens)


def window_lines(c: Calibration, record_ids: tuple[str, ...]) -> list[str]:
    """What the serving window measured per stage against the fresh profiles' prediction."""
    record = next((r for r in record_ids if r.startswith("calibration-")), "")
    lines = [f"{EVIDENCE} serving window on route {c.route_key} (record {record or 'not stored'}): per decode "
             f"microbatch, measured over {c.runs} run(s) (physical) against the fresh profiles (prediction)"]
    for stage in sorted(c.stages, key=lambda s: s.stage_index):
        terms = []
        for term in ("compute", "wire"):
            measured, predicted = stage.measured_terms.get(term), stage.predicted_terms.get(term, 0.0)
            if measured is None or (term == "wire" and not predicted):
                continue
            terms.append(f"{term} {_fig(measured, 1e3, ' ms')} against {predicted * 1e3:.4g} ms predicted: "
                         f"{measured.median / predicted:.3g}x" if predicted else "no prediction")
        lines.append(f"  stage {stage.stage_index} {stage.host} [{stage.layer_start},{stage.layer_end}): "
                     + "; ".join(terms))
    lines += [f"  FAILED {f}" for f in c.failures]
    lines.append("  every later plan resting on these profiles scales the host's decode compute and the link's wire "
                 "term by these factors (`fornax plan --explain` names this record)" if not c.failures else
                 "  a window with a failed check feeds nothing back")
    return lines


def _bring_up(args: argparse.Namespace, spec, checkpoint: str):
    from apps.fleet.isolated import start_isolated_fleet
    from apps.fleet.launcher import FleetOptions

    options = FleetOptions(state_dir=Path(args.state_dir).resolve(), read_roots=(checkpoint,),
                           startup_timeout_s=args.startup_timeout_s)
    print(f"bringing up {args.fleet}: " + ", ".join(
        f"{h.name} ({h.backend.value}, {h.cpu_cores:g} cores)" for h in spec.hosts), file=sys.stderr)
    return start_isolated_fleet(options, spec)


def _take_down(state_dir: str, launcher) -> None:
    from apps.fleet.netns import tear_down

    launcher.stop_all()
    left = tear_down(Path(state_dir))
    if left:
        print(f"fornax profile: could not remove: {', '.join(left)}", file=sys.stderr)


def _profile(args: argparse.Namespace, state: FleetState, stage_hosts: list[str] | None,
             host_weights: list[str | None] | None, checkpoint: str) -> int:
    try:
        workers = workers_of(state, stage_hosts, host_weights, args.weights or DEFAULT_POLICY)
        builder, registry = state.entry("artifact_builder").grpc, state.entry("evidence_registry").grpc
    except (KeyError, ValueError) as exc:
        return _fail(f"the running fleet does not fit: {exc}")
    credentials = operator_credentials(args.state_dir)
    if credentials is None:
        return _fail("profiles are physical evidence and must be signed: the fleet must serve mTLS "
                     f"(no operator certificate under {args.state_dir})")
    grid = Grid(args.prefill_lengths, args.decode_batches, args.decode_contexts, args.runs, args.min_run_ms / 1000)
    command = "fornax " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["profile"] else "fornax profile"
    request = ProfileRequest(checkpoint, grid, command, link_runs=args.runs, valid_for_s=args.valid_for_s,
                             concurrent=args.all_at_once)
    try:
        result = asyncio.run(profile_fleet(workers, builder, registry, request, ChannelConfig(credentials=credentials),
                                           lambda line: print(line, file=sys.stderr)))
    except FornaxError as exc:
        return _fail(f"{exc.reason}: {exc.message}")
    except Exception as exc:  # noqa: BLE001 - gRPC errors carry their status and details
        return _fail(_describe_error(exc))
    print(json.dumps(to_document(result), indent=2, sort_keys=True) if args.json else render(result))
    return 0


def _describe_error(exc: Exception) -> str:
    import grpc

    if isinstance(exc, grpc.aio.AioRpcError):
        from libs.service.interceptors import reason_of

        return f"{exc.code().name} {reason_of(exc) or ''}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"


# ---- output --------------------------------------------------------------------------------

def _fig(figure: Figure, scale: float = 1.0, unit: str = "") -> str:
    return (f"{figure.median * scale:.4g}{unit} [{figure.low * scale:.4g}..{figure.high * scale:.4g}, "
            f"spread {figure.spread:.0%}, n={figure.runs}]")


def _kind_rows(kind: LayerKindProfile) -> list[str]:
    per = " per layer" if kind.kind in ("dense", "moe") else ""
    rows = [f"    {kind.kind}: resident {kind.resident_bytes} B{per}, KV {kind.kv_bytes_per_token} B/token{per}"]
    rows += [f"      prefill S={s}: {_fig(f, 1e6, ' us/token')}" for s, f in sorted(kind.prefill_s_per_token.items())]
    by_context: dict[int | None, dict[int, Figure]] = {None: kind.decode_s_per_microbatch}
    if kind.decode_s_by_context:
        by_context = dict(sorted(kind.decode_s_by_context.items()))
    for context, table in by_context.items():
        past = f" past={context}" if context is not None else ""
        rows += [f"      decode batch={b}{past}: {_fig(f, 1e3, ' ms/microbatch')}" for b, f in sorted(table.items())]
    return rows


def _resident_rows(p: StageProfile) -> list[str]:
    """The worker's own resident memory beyond weights and KV: the reserve the planner holds back."""
    resident = p.runtime_resident
    if resident is None:
        return []
    rows = [f"    runtime reserve {resident.reserve_bytes / 2**20:.1f} MiB (largest sample; resident less weights "
            "and KV, what the planner holds back on this host):"]
    mib = 2**20
    return rows + [f"      {s.point}: resident {s.rss_bytes / mib:.1f} MiB (anonymous {s.anon_bytes / mib:.1f}), "
                   f"weight file pages {s.weight_file_bytes / mib:.1f}, weight copies {s.weight_copy_bytes / mib:.1f}, "
                   f"KV {s.kv_bytes / mib:.1f} -> {s.runtime_bytes / mib:.1f} MiB" for s in resident.samples]


def render(result: FleetProfiles) -> str:
    lines = [f"model snapshot {result.model_snapshot}; every figure below is {EVIDENCE}: measured on the named "
             "host, median [min..max, spread, runs]"]
    for stored in result.stages:
        p = stored.profile
        lines.append(f"{EVIDENCE} stage profile {p.host.host} (record {stored.record.record_id})")
        lines.append(f"  host: {p.host.describe()}")
        mode = f" timed in {p.activations_label}" if p.max_activations else ""
        lines.append(f"  build: {p.backend_build}{mode} on {p.device}; snapshot {p.model_snapshot}; dtype {p.dtype}; "
                     f"weights {p.weights_policy}; "
                     f"decode pasts {list(p.decode_contexts)} tokens, concurrency {p.concurrency}; {p.timing_label}")
        lines.append(f"  command: {p.command}; measured by {p.worker}; valid {p.valid_for_s} s")
        for kind in p.kinds:
            lines += _kind_rows(kind)
        if p.step_grid():
            lines.append("    step (served decode microbatch beyond its layers: executor, KV, unpack/pack):")
            lines += [f"      decode batch={b} past={c}: {_fig(f, 1e3, ' ms/microbatch')}"
                      for c, table in sorted(p.step_grid().items()) for b, f in sorted(table.items())]
        lines += _resident_rows(p)
    for link in result.links:
        lp = link.profile
        lines.append(f"{EVIDENCE} link profile {lp.from_host} -> {lp.to_host} over {lp.transport} "
                     f"(record {link.record.record_id})")
        lines.append(f"  32 KiB round trip: {_fig(lp.rtt_32kib_s, 1e3, ' ms')}")
        lines.append(f"  16 MiB throughput: {_fig(lp.throughput_bytes_per_s, 1e-6, ' MB/s')}")
        lines.append(f"  host: {link.record.content.provenance.hardware}; build: "
                     f"{link.record.content.provenance.backend_build}; command: {lp.command}")
    return "\n".join(lines)


def to_document(result: FleetProfiles) -> dict:
    from libs.profiles.schema import to_json

    def entry(stored) -> dict:
        return {"evidence_class": "physical", "record_id": stored.record.record_id,
                "subject": stored.record.content.subject, "profile": json.loads(to_json(stored.profile))}

    return {"model_snapshot": result.model_snapshot, "stages": [entry(s) for s in result.stages],
            "links": [entry(link) for link in result.links]}
