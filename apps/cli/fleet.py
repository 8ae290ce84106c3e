"""`fornax up`, `fornax status`, `fornax down`: a local fleet on 127.0.0.1, or with `--fleet FILE`
one host per network namespace and cgroup."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from apps.fleet.backend_report import fetch_board, render_board
from apps.fleet.compose import start_fleet
from apps.fleet.health import check_health
from apps.fleet.host_leave import clear_retired, retired_services
from apps.fleet.isolated import start_isolated_fleet
from apps.fleet.keeper import KEEPER_FLAG, keeper_pid, mark_ready, start_keeper, stop_keeper
from apps.fleet.launcher import FleetOptions, Launcher, LaunchError, stop_processes
from apps.fleet.netns import IsolationFailed, IsolationUnavailable, read_record, require_isolation, tear_down
from apps.fleet.route_status import route_report
from apps.fleet.route_wait import RouteFailed, wait_for_route
from apps.fleet.spec import FleetFileError, FleetSpec, load_fleet_spec
from apps.fleet.supervisor import KEPT_KINDS, FleetSupervisor, crashed
from libs.common.kinds import Backend, DType
from libs.security.cli_credentials import operator_credentials
from libs.service.channels import ChannelConfig
from libs.service.fleet_state import FleetState, fleet_path, read_fleet, write_fleet
from libs.service.progress import Progress
from libs.weights.policy import POLICIES

if TYPE_CHECKING:
    from apps.fleet.fleet_reference import ReferenceDecision
    from apps.fleet.route_layout import RouteLayout

BOUNDARY_DTYPES = ("bf16", "fp32")


def register(commands, benches) -> None:
    up = commands.add_parser("up", help="start the local fleet and wait until every service is SERVING")
    up.add_argument("--state-dir", default=".fornax", help="where fleet.json, logs and data live")
    up.add_argument("--foreground", action="store_true",
                    help="stay attached; Ctrl-C stops the fleet (without it a detached keeper process "
                         "holds the fleet and restarts dead stage workers)")
    up.add_argument(KEEPER_FLAG, action="store_true", help=argparse.SUPPRESS)
    up.add_argument("--stages", type=int, help="number of stage workers (default 2; a fleet file declares its own)")
    up.add_argument("--backend", choices=[backend.value for backend in Backend],
                    help="stage execution backend (default numpy; a fleet file declares one per host)")
    up.add_argument("--boundary-dtype", choices=BOUNDARY_DTYPES, default=None,
                    help="stage boundary dtype (default bf16; with --fleet, every hop the file does not set)")
    _add_weight_options(up)
    up.add_argument("--fleet", help="fleet file: each host its own network namespace, cgroup and link (needs root)")
    up.add_argument("--checkpoint", help="checkpoint directory, or a deepseek2 .gguf file, to serve")
    _add_route_options(up)
    up.add_argument("--mode", choices=("exploratory", "deployment"), default="exploratory",
                    help="deployment: install only a plan whose every host, layer kind and link has a valid "
                         "physical profile and whose route passed `fornax qualify`; refused otherwise")
    up.add_argument("--http-port", type=int, help="OpenAI-compatible API port on the orchestrator")
    up.add_argument("--read-root", action="append", default=[],
                    help="another directory InstallPlan may name checkpoints under (repeatable)")
    up.add_argument("--insecure", action="store_true",
                    help="plaintext gRPC with no certificates, authentication or audit identity (every service warns)")
    up.add_argument("--http-insecure", action="store_true",
                    help="with --fleet: serve the API as plain HTTP on the fabric address (default: https, fleet CA)")
    up.add_argument("--no-serve-while-compiling", dest="serve_while_compiling", action="store_false",
                    help="with --backend max, or a fleet file's MAX hosts: wait for MAX compiles instead of "
                         "serving on numpy reference workers meanwhile")
    up.add_argument("--max-switch", choices=("measured", "always"), default="measured",
                    help="with --backend max: move the serving numpy route to MAX only when each stage's MAX "
                         "decode step measured at least as fast on its host (measured), or unconditionally (always)")
    up.add_argument("--max-switch-rows", default="1,8",
                    help="the decode rows (concurrent sequences) the MAX switch is measured at, comma-separated")
    up.add_argument("--startup-timeout-s", type=float, default=180.0)
    up.add_argument("--install-timeout-s", type=float, default=3600.0,
                    help="how long to wait for the route (first MAX compiles take minutes)")
    up.set_defaults(func=cmd_up)

    status = commands.add_parser("status", help="health of every service in .fornax/fleet.json")
    status.add_argument("--state-dir", default=".fornax")
    status.set_defaults(func=cmd_status)

    down = commands.add_parser("down", help="stop the local fleet gracefully")
    down.add_argument("--state-dir", default=".fornax")
    down.add_argument("--grace-period-s", type=float, default=10.0)
    down.set_defaults(func=cmd_down)


def _fail(message: str) -> int:
    print(f"fornax: {message}", file=sys.stderr)
    return 2


def _add_weight_options(up: argparse.ArgumentParser) -> None:
    """What the stages hold (weight policy) and how a MAX stage multiplies block formats."""
    up.add_argument("--weights", choices=POLICIES, default=None,
                    help="weight policy of every stage: fp32 (default), bf16, q8_0 or q4_k_m; with --fleet, "
                         "every host whose `weights:` the file does not set")
    up.add_argument("--max-activations", choices=("int8", "float32"), default=None,
                    help="activations of the MAX stages' block-format weight products: int8 (default, MAX's "
                         "packed product) or float32 (exact to the dequantized product, slower); with --fleet, "
                         "every MAX host whose `max_activations:` the file does not set")


def _add_route_options(up: argparse.ArgumentParser) -> None:
    """`fornax up`'s replica routes: how many, and how long a lost one waits for its host."""
    up.add_argument("--routes", default="1",
                    help="with --fleet and --checkpoint: replica routes the stage hosts form, N or auto (the layout "
                         "`fornax plan --fleet FILE --routes ...` chooses); every route serves at once behind one API")
    up.add_argument("--rejoin-timeout", dest="rejoin_timeout_s", type=float, default=0.0, metavar="SECONDS",
                    help="with replica routes: a route whose stage host is gone this long leaves the serving set "
                         "(its streams replay on the routes left), while another route serves; 0 (default) = never")


def _validate_up(args: argparse.Namespace) -> str | None:
    if args.fleet and (args.stages is not None or args.backend is not None):
        return "--fleet declares every host's backend and the stages; drop --stages and --backend"
    if args.routes != "1" and not (args.fleet and args.checkpoint):
        return "--routes lays replica routes on a fleet file's hosts: it needs --fleet and --checkpoint"
    if args.routes != "auto" and not (args.routes.isdigit() and int(args.routes) >= 1):
        return f"BAD_ROUTE_COUNT: --routes takes auto or a count >= 1, got {args.routes!r}"
    if not args.rejoin_timeout_s >= 0:  # also refuses nan
        return f"--rejoin-timeout takes seconds >= 0 (0 = never), got {args.rejoin_timeout_s:g}"
    if args.max_activations and not args.fleet and args.backend != "max":
        return ("MAX_ACTIVATIONS_BACKEND: --max-activations sets the block-format activations of MAX stages; "
                f"--backend {args.backend or 'numpy'} runs none")
    if args.stages is not None and not 1 <= args.stages <= 16:
        return f"--stages must be between 1 and 16, got {args.stages}"
    if args.checkpoint and _is_gguf(args.checkpoint):
        return _validate_gguf_up(args)
    if args.checkpoint and not Path(args.checkpoint, "config.json").is_file():
        return f"--checkpoint {args.checkpoint!r} has no config.json"
    from libs.service.errors import InvalidArgument
    from services.orchestrator.route.backend_choice import parse_rows

    try:
        parse_rows(args.max_switch_rows, "--max-switch-rows")
    except InvalidArgument as exc:
        return f"{exc.reason}: {exc.message}"
    return None


def _is_gguf(path: str) -> bool:
    return Path(path).suffix == ".gguf" and Path(path).is_file()


def _validate_gguf_up(args: argparse.Namespace) -> str | None:
    """A GGUF serves in the formats it stores: on numpy stages, on MAX stages (each tensor in its
    stored format where MAX runs it in-graph, else converted once at build time and listed), and
    on a fleet file's hosts, each with its backend. A MAX stage compiles its graph variants from
    those formats when it loads, so `--backend max` waits for the compiles: serving on numpy
    meanwhile would switch on a measurement taken on float32 weights, which a GGUF has not."""
    if args.weights not in (None, "fp32"):
        return f"--checkpoint {args.checkpoint!r} is a GGUF: its tensors keep their stored formats; drop --weights"
    if args.backend == "max" and args.serve_while_compiling:
        return (f"--checkpoint {args.checkpoint!r} is a GGUF: on --backend max it serves once its MAX stages have "
                "compiled (the numpy-to-MAX switch is measured on float32 weights, not on a GGUF's stored "
                "formats); add --no-serve-while-compiling")
    return None


def _gguf_fleet_refusal(args: argparse.Namespace, spec: FleetSpec) -> str | None:
    """A fleet file's per-host weight policy cannot apply to a GGUF either."""
    hosts = [h.name for h in spec.hosts if h.weights not in (None, "fp32")]
    if hosts:
        return (f"--checkpoint {args.checkpoint!r} is a GGUF: its tensors keep their stored formats; drop "
                f"`weights:` from host(s) {', '.join(hosts)} in {args.fleet}")
    return None


def _running_fleet(state_dir: str) -> FleetState | None:
    if keeper_pid(state_dir) is not None:
        return read_fleet(state_dir) or FleetState(services=(), api="")
    state = read_fleet(state_dir)
    if state and any(_pid_alive(s.pid) for s in state.services):
        return state
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def cmd_up(args: argparse.Namespace) -> int:
    problem = _validate_up(args)
    if problem:
        return _fail(problem)
    if not args.keeper and _running_fleet(args.state_dir):  # the keeper is checked before it starts
        return _fail(f"a fleet is already running from {fleet_path(args.state_dir)}; run `fornax down` first")
    try:  # a bad fleet file, a host that cannot isolate or an unplannable layout is refused before anything starts
        spec = _fleet_spec(args)
        layout = _route_layout(args, spec)
    except _UpRefused as exc:
        return _fail(str(exc))
    if not args.foreground:  # the same fleet, held by a detached keeper that supervises it
        return start_keeper(args.state_dir, _up_argv(args))
    references = _reference_decision(args, spec, layout)
    for line in references.lines:  # per host: serving at once, or why it waits and for how long
        print(f"cold start: {line}", file=sys.stderr)
    start = _fleet_starter(args, spec, layout, references.reference_hosts)
    clear_retired(Path(args.state_dir))
    # Until the fleet is held, SIGTERM unwinds like Ctrl-C, so whatever started is stopped again.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        state, launcher = start()
    except (LaunchError, IsolationUnavailable, IsolationFailed) as exc:
        return _fail(f"fleet failed to start: {exc}")
    except KeyboardInterrupt:
        return _fail("interrupted while starting; every service started so far was stopped")
    try:  # a SIGTERM anywhere before the fleet is held (even while printing) stops what started
        return _serve(args, state, launcher)
    except KeyboardInterrupt:
        _stop(args.state_dir, launcher)
        return _fail("interrupted while installing the route; the fleet was stopped")


class _UpRefused(Exception):
    """`fornax up` refuses before anything starts; the message is the whole explanation."""


def _fleet_spec(args: argparse.Namespace) -> FleetSpec | None:
    """The fleet file's spec (None without `--fleet`), its hosts checked able to isolate."""
    if not args.fleet:
        return None
    try:
        spec = load_fleet_spec(args.fleet, DType(args.boundary_dtype) if args.boundary_dtype else None)
        gguf_problem = _gguf_fleet_refusal(args, spec) if args.checkpoint and _is_gguf(args.checkpoint) else None
        if gguf_problem:
            raise _UpRefused(gguf_problem)
        if args.max_activations and not any(h.backend is Backend.MAX for h in spec.stage_hosts):
            raise _UpRefused(f"MAX_ACTIVATIONS_BACKEND: --max-activations sets MAX stages; {args.fleet} has "
                             "no max stage host")
        require_isolation(spec)
    except FleetFileError as exc:
        raise _UpRefused(f"fleet file {args.fleet}: {exc}") from exc
    except IsolationUnavailable as exc:
        raise _UpRefused(f"fleet failed to start: {exc}") from exc
    return spec


def _route_layout(args: argparse.Namespace, spec: FleetSpec | None) -> RouteLayout | None:
    """The planner's replica-route layout for `--routes` other than 1 on a fleet file."""
    if spec is None or args.routes == "1":
        return None
    from apps.fleet.route_layout import plan_layout
    from libs.service.errors import FornaxError

    try:
        return plan_layout(spec, args.checkpoint, args.routes, args.weights)
    except FornaxError as exc:
        raise _UpRefused(f"--routes {args.routes}: {exc.reason}: {exc.message}") from exc


def _reference_decision(args: argparse.Namespace, spec: FleetSpec | None,
                        layout: RouteLayout | None) -> ReferenceDecision:
    """Which of a fleet file's MAX hosts run a numpy reference worker while their graphs compile."""
    from apps.fleet.fleet_reference import NO_REFERENCE
    from apps.fleet.fleet_reference_inputs import reference_decision

    if spec is None:
        return NO_REFERENCE
    return reference_decision(spec, args.checkpoint, args.weights, serve_while_compiling=args.serve_while_compiling,
                              replica_routes=layout is not None and bool(layout.groups),
                              max_activations=args.max_activations or "", deployment=args.mode == "deployment")


def _fleet_starter(args: argparse.Namespace, spec: FleetSpec | None, layout: RouteLayout | None,
                   reference_hosts: frozenset[str] = frozenset()) -> Callable[[], tuple[FleetState, Launcher]]:
    """What starts the fleet (isolated hosts from the file, or local processes), announced on stderr."""
    options = _options(args)
    if layout is not None:
        print(f"replica routes: {layout.description}, predicted {layout.predicted_tok_s:.1f} decode tok/s "
              "(prediction from the file's declared figures)", file=sys.stderr)
        options = dataclasses.replace(options, route_groups=layout.groups)
    if spec is not None:
        print(f"starting fleet {args.fleet}: " + ", ".join(
            f"{h.name} ({h.backend.value}, {h.cpu_cores:g} cores)" for h in spec.hosts), file=sys.stderr)
        return partial(start_isolated_fleet, options, spec, reference_hosts)
    transport = (
        "INSECURE plaintext gRPC" if args.insecure else f"mTLS, certificates in {Path(args.state_dir, 'certs')}"
    )
    print(
        f"starting fleet: {options.stages} stage workers, backend {options.backend}, {transport}", file=sys.stderr
    )
    return partial(start_fleet, options)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _up_argv(args: argparse.Namespace) -> list[str]:
    """`up` with the parsed options, paths made absolute (the keeper shares the cwd anyway)."""
    argv = ["up", "--state-dir", str(Path(args.state_dir).resolve()),
            "--startup-timeout-s", str(args.startup_timeout_s), "--install-timeout-s", str(args.install_timeout_s)]
    for flag, value in (("--stages", args.stages), ("--backend", args.backend),
                        ("--boundary-dtype", args.boundary_dtype), ("--http-port", args.http_port),
                        ("--weights", args.weights), ("--max-activations", args.max_activations)):
        if value is not None:
            argv += [flag, str(value)]
    for flag, path in (("--fleet", args.fleet), ("--checkpoint", args.checkpoint)):
        if path:
            argv += [flag, str(Path(path).resolve())]
    for root in args.read_root:
        argv += ["--read-root", str(Path(root).resolve())]
    argv += ["--mode", args.mode, "--routes", args.routes, "--rejoin-timeout", str(args.rejoin_timeout_s)]
    if args.insecure:
        argv.append("--insecure")
    if args.http_insecure:
        argv.append("--http-insecure")
    if not args.serve_while_compiling:
        argv.append("--no-serve-while-compiling")
    argv += ["--max-switch", args.max_switch, "--max-switch-rows", args.max_switch_rows]
    return argv


def _options(args: argparse.Namespace) -> FleetOptions:
    return FleetOptions(
        state_dir=Path(args.state_dir).resolve(),
        stages=args.stages or 2,
        backend=args.backend or "numpy",
        boundary_dtype=args.boundary_dtype or "bf16",
        weights=args.weights or "fp32",
        max_activations=args.max_activations or "",
        checkpoint=args.checkpoint,
        http_port=args.http_port,
        api_key=os.environ.get("FORNAX_API_KEY") or None,
        startup_timeout_s=args.startup_timeout_s,
        insecure=args.insecure,
        http_insecure=args.http_insecure,
        read_roots=tuple(args.read_root),
        serve_while_compiling=args.serve_while_compiling,
        max_switch=args.max_switch,
        max_switch_rows=args.max_switch_rows,
        plan_mode=args.mode,
        rejoin_timeout_s=args.rejoin_timeout_s,
    )


def _serve(args: argparse.Namespace, state: FleetState, launcher) -> int:
    path = write_fleet(args.state_dir, state)
    print(render_table(state, {s.name: "SERVING" for s in state.services}))
    print(f"fleet file: {path}")
    if args.checkpoint:
        try:
            # planning, plan, artifacts, one load per stage, warming: an estimate (compile
            # lines of a cold MAX cache are steps too), so the bar ends only when ready.
            stages = sum(1 for s in state.services if s.kind == "stage_worker")
            with Progress("installing route", stages + 5, "steps") as bar:
                wait_for_route(state, args.install_timeout_s, bar.step)
                bar.finish("route ready")
        except (RouteFailed, TimeoutError) as exc:
            _stop(args.state_dir, launcher)
            hint = ("; deployment mode needs valid stage/link profiles (`fornax profile`) and a passing route "
                    "calibration (`fornax qualify`) in the fleet's registry") if args.mode == "deployment" else ""
            return _fail(f"the route did not come up: {exc}{hint}")
        print(curl_example(state))
        print("\n".join(render_board(fetch_board(state))), file=sys.stderr)
    if not args.foreground:
        return 0
    if args.keeper:
        mark_ready(args.state_dir)
    return _stay_attached(args.state_dir, launcher)


def _stop(state_dir: str, launcher) -> None:
    launcher.stop_all()
    tear_down(Path(state_dir))
    fleet_path(state_dir).unlink(missing_ok=True)


def curl_example(state: FleetState) -> str:
    auth = ' -H "Authorization: Bearer $FORNAX_API_KEY"' if state.api_key else ""
    auth += f" --cacert {state.api_ca}" if state.api_ca else ""
    body = '{"model": "fornax", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 32, "stream": true}'
    return (
        f"serving the OpenAI-compatible API at {state.api}\n"
        f"curl -N {state.api}/chat/completions -H 'Content-Type: application/json'{auth} -d '{body}'"
    )


def _stay_attached(state_dir: str, launcher) -> int:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print("fleet running in the foreground (stage workers and the orchestrator are restarted if they die); "
          "Ctrl-C stops it",
          file=sys.stderr)
    def record_pids() -> None:
        state = read_fleet(state_dir)
        if state is not None:
            order = [s.name for s in state.services]  # a drained host's worker has left it
            entries = sorted((s.entry() for s in launcher.started if s.spec.name in order),
                             key=lambda e: order.index(e.name))
            write_fleet(state_dir, dataclasses.replace(state, services=tuple(entries)))

    supervisor = FleetSupervisor(launcher, KEPT_KINDS, on_restart=record_pids,
                                 keep_down=partial(retired_services, Path(state_dir))).start()
    exited = None
    while not stop.wait(0.5):
        exited = next((s for s in launcher.started if fleet_stops_for(s.spec.kind, s.process.poll())), None)
        if exited:
            print(f"fornax: {exited.spec.name} exited with {exited.process.returncode}; stopping", file=sys.stderr)
            break
    supervisor.stop()
    launcher.stop_all()
    left = tear_down(Path(state_dir))
    fleet_path(state_dir).unlink(missing_ok=True)
    print("fleet stopped" + (f"; left behind: {', '.join(left)}" if left else ""), file=sys.stderr)
    return 1 if exited else 0


def fleet_stops_for(kind: str, returncode: int | None) -> bool:
    """A service that exited stops the fleet, unless the supervisor starts it again: a stage
    worker whatever its exit (a retired one stays down), an orchestrator that crashed."""
    if returncode is None or kind == "stage_worker":
        return False
    return kind not in KEPT_KINDS or not crashed(returncode)


def render_table(state: FleetState, health: dict[str, str]) -> str:
    rows = [("SERVICE", "GRPC", "METRICS", "PID", "HEALTH")]
    rows += [(s.name, s.grpc, s.metrics, str(s.pid), health.get(s.name, "?")) for s in state.services]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    if state.api:
        lines.append(f"api: {state.api}")
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    state = read_fleet(args.state_dir)
    if state is None:
        return _fail(f"no fleet file at {fleet_path(args.state_dir)}; is a fleet running?")
    credentials = operator_credentials(args.state_dir) if state.tls else None
    health = {s.name: check_health(s.grpc, credentials=credentials) for s in state.services}
    print(render_table(state, health))
    route = route_report(state, ChannelConfig(credentials=credentials))
    if route is not None:
        print(route.render())
    print("\n".join(render_board(fetch_board(state))))
    route_ok = route is None or route.healthy
    return 0 if route_ok and all(status == "SERVING" for status in health.values()) else 1


def cmd_down(args: argparse.Namespace) -> int:
    state = read_fleet(args.state_dir)
    isolated = read_record(Path(args.state_dir)) is not None
    # A background fleet's keeper stops its own fleet (so it restarts nothing meanwhile);
    # what it leaves behind is stopped below.
    stop_keeper(args.state_dir, 3 * args.grace_period_s + 15.0)
    if state is None and not isolated:
        return _fail(f"no fleet file at {fleet_path(args.state_dir)}; nothing to stop")
    killed: list[str] = []
    if state is not None:
        # Front door first, so no new work arrives while the rest drains.
        ordered = sorted(state.services, key=lambda s: s.kind != "orchestrator")
        killed = stop_processes([(s.name, s.pid) for s in ordered], args.grace_period_s)
        fleet_path(args.state_dir).unlink(missing_ok=True)
    left = tear_down(Path(args.state_dir)) if isolated else []
    if killed:
        print(f"fornax: forced SIGKILL after the grace period: {', '.join(killed)}", file=sys.stderr)
    if left:
        print(f"fornax: could not remove: {', '.join(left)}", file=sys.stderr)
    if killed or left:
        return 1
    print(f"stopped {len(state.services) if state else 0} services" + ("; hosts removed" if isolated else ""))
    return 0
