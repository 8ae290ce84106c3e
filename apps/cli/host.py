"""`fornax host drain NAME`: one host leaves the running fleet while it serves.
`fornax host add NAME --fleet FILE --checkpoint DIR`: a host of the file joins it (idle), and the
layout the join proposes is shown as a diff against the serving routes (apps/fleet/host_join.py);
a joined worker whose clock is skewed, or (with --profile) whose profile fails, is refused and
stopped (apps/fleet/join_checks.py).

The orchestrator takes the host's routes out (`DrainHost`: they finish or hand their greedy
streams to the routes that stay, and are unloaded); then the host's stage worker is marked
retired, so the supervisor does not bring it back, stopped, and dropped from the fleet file.
A refusal (the host serves no route, or its leaving would leave none) changes nothing.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path

import grpc

from apps.fleet.host_leave import HostLookupError, host_names, stage_worker_of, stop_retired_worker
from fornax.orchestrator.v1 import orchestrator_pb2 as pb
from fornax.orchestrator.v1 import orchestrator_pb2_grpc as pb_grpc
from libs.security.cli_credentials import operator_credentials
from libs.service.channels import ChannelConfig, open_channel
from libs.service.errors import FailedPrecondition
from libs.service.fleet_state import fleet_path, read_fleet
from libs.service.interceptors import reason_of

# The orchestrator's own work after the timeout: hand-over, unloading, the first replayed tokens.
RPC_SLACK_S = 120.0


def register(commands, benches) -> None:
    host = commands.add_parser("host", help="hosts joining and leaving the running fleet")
    actions = host.add_subparsers(dest="host_action", metavar="ACTION", required=True)
    drain = actions.add_parser("drain", help="take a host out of the serving routes, then stop its worker")
    drain.add_argument("name", help="the host (fleet file name) or its stage worker service (stage_worker_N)")
    drain.add_argument("--state-dir", default=".fornax", help="fleet state directory")
    drain.add_argument("--timeout-s", type=float, default=60.0,
                       help="how long the host's routes may take to finish their requests before their "
                            "greedy streams are handed to the routes that stay")
    drain.add_argument("--grace-period-s", type=float, default=10.0,
                       help="how long the stopped worker may take to exit before SIGKILL")
    drain.set_defaults(func=cmd_host_drain)
    add = actions.add_parser("add", help="bring a host of the fleet file up beside the running fleet, "
                                         "and show the layout it proposes")
    add.add_argument("name", help="the joining host, as the fleet file names it")
    add.add_argument("--fleet", required=True, help="the fleet file: the running hosts and the joining one")
    add.add_argument("--checkpoint", required=True, help="the served checkpoint (the proposal is planned for it)")
    add.add_argument("--routes", default="auto", help="the proposal's route count: auto or N")
    add.add_argument("--weights", help="weight policy for the proposal (default: the file's)")
    add.add_argument("--state-dir", default=".fornax", help="fleet state directory")
    add.add_argument("--keep-serving", action="store_true",
                     help="propose routes on the joining host alone, the serving routes kept as they are")
    add.add_argument("--apply", action="store_true",
                     help="install the proposal's added routes (only a proposal that removes no serving route)")
    add.add_argument("--startup-timeout-s", type=float, default=120.0)
    add.add_argument("--clock-tolerance-s", type=float, default=None,
                     help="refuse the host when its clock is further than this from this machine's "
                          "(default: the certificates' backdating, 300)")
    add.add_argument("--profile", action="store_true",
                     help="profile the joined worker's stage before it may take a route; a failed profile "
                          "refuses the join (the fleet must serve mTLS: profiles are signed)")
    add.set_defaults(func=cmd_host_add)


def cmd_host_drain(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir)
    state = read_fleet(state_dir)
    if state is None:
        return _fail(f"no fleet file at {fleet_path(state_dir)}; is a fleet running?")
    orchestrator = next((s for s in state.services if s.kind == "orchestrator"), None)
    if orchestrator is None:
        return _fail("the fleet has no orchestrator")
    try:
        worker = stage_worker_of(state, state_dir, args.name)
    except HostLookupError as exc:
        return _fail(str(exc))
    channel = ChannelConfig(credentials=operator_credentials(state_dir) if state.tls else None)
    try:
        reply = _drain_host(orchestrator.grpc, channel, worker.grpc, args.timeout_s)
    except grpc.RpcError as exc:
        return _fail(f"host {args.name} was not drained: {reason_of(exc) or exc.code().name}: {exc.details()}; "
                     "the serving routes are unchanged")
    names = host_names(state, state_dir)
    killed = stop_retired_worker(state_dir, state, worker, args.grace_period_s)
    print("\n".join(drain_report(args.name, reply, names, worker.name, killed)))
    return 0


def _drain_host(orchestrator: str, channel: ChannelConfig, worker_address: str,
                timeout_s: float) -> pb.DrainHostResponse:
    with open_channel(orchestrator, channel) as opened:
        return pb_grpc.OrchestratorServiceStub(opened).DrainHost(pb.DrainHostRequest(
            request_id=str(uuid.uuid4()), worker_address=worker_address, timeout_ns=int(timeout_s * 1e9)),
            timeout=timeout_s + RPC_SLACK_S)


def drain_report(host: str, reply: pb.DrainHostResponse, names: dict[str, str], service: str,
                 killed: bool) -> list[str]:
    """What the drain did, one fact a line; stage workers named by their hosts."""
    def route(addresses) -> str:
        return ">".join(names.get(a, a) for a in addresses)

    remaining = reply.status.routes or [reply.status]
    removed = ", ".join(route(r.worker_addresses) for r in reply.removed_routes)
    lines = [f"host {host} drained: routes removed: {removed}",
             f"routes serving: {', '.join(route(s.worker_address for s in r.stages) for r in remaining)}",
             f"requests: {reply.finished_requests} finished on the leaving routes, "
             f"{reply.handed_off_requests} handed off, {reply.ended_requests} ended",
             f"largest gap of a handed-off stream: {reply.largest_gap_ns / 1e9:.3f} s (physical, this host)",
             f"{service} stopped{' (SIGKILL after the grace period)' if killed else ''}; the supervisor keeps it down"]
    if reply.stored_route_set:
        lines.append(f"route set stored: {reply.stored_route_set}")
    return lines


def _fail(message: str) -> int:
    print(f"fornax host: {message}", file=sys.stderr)
    return 1


def cmd_host_add(args: argparse.Namespace) -> int:
    from apps.fleet.host_join import hosts_lock

    if args.clock_tolerance_s is not None and not args.clock_tolerance_s >= 0:
        return _fail(f"--clock-tolerance-s must be 0 or more seconds, got {args.clock_tolerance_s}")
    state_dir = Path(args.state_dir).resolve()
    with hosts_lock(state_dir):  # a second `host add` waits here
        return _host_add(args, state_dir)


def _host_add(args: argparse.Namespace, state_dir: Path) -> int:
    from apps.fleet.host_join import applicable, propose
    from apps.fleet.spec import FleetFileError, load_fleet_spec
    from libs.service.errors import FornaxError

    state = read_fleet(state_dir)
    orchestrator = next((s for s in state.services if s.kind == "orchestrator"), None) if state else None
    if state is None or orchestrator is None:
        return _fail(f"no running fleet with an orchestrator at {fleet_path(state_dir)}")
    channel = ChannelConfig(credentials=operator_credentials(state_dir) if state.tls else None)
    try:
        spec = load_fleet_spec(args.fleet)
        index, layout, serving = _join_plan(args, spec, state, state_dir, orchestrator.grpc, channel)
        diff = propose(serving, layout.routes if not args.keep_serving else (*serving, *layout.routes))
        added = applicable(diff) if args.apply else ()
    except FleetFileError as exc:
        return _fail(f"fleet file {args.fleet}: {exc}")
    except FornaxError as exc:
        return _fail(f"host {args.name} was not added: {exc.reason}: {exc.message}; nothing was started")
    except grpc.RpcError as exc:
        return _fail(f"the orchestrator did not answer ({exc.code().name}); nothing was started")
    entry = _bring_up(args, state_dir, spec, state, index)
    if entry is None:
        return 1
    refused = _check_joined(args, state_dir, spec, entry, channel)
    if refused is not None:
        return refused
    print(f"host {args.name} joined: {entry.name} at {entry.grpc} SERVING (certificate of the fleet CA)")
    print(f"proposed layout: {layout.description}{' beside the serving routes' if args.keep_serving else ''}, "
          f"predicted {layout.predicted_tok_s:.1f} decode tok/s (prediction from the file's declared figures; "
          + ("the profile above was not planned on)" if args.profile else "no profile was run)"))
    print("\n".join(diff.lines()))
    if not args.apply or not added:
        print("not applied: the new worker serves no route" + ("" if args.apply else
                                                               " (--apply installs the added routes)"))
        return 0
    return _apply(added, orchestrator.grpc, channel, {**host_names(state, state_dir), entry.grpc: args.name})


def _join_plan(args: argparse.Namespace, spec, state, state_dir: Path, orchestrator: str, channel: ChannelConfig):
    """(the worker's index, the proposed layout, the serving routes by host); raises a refusal."""
    from apps.fleet.host_join import joining_alone, joining_host, running_hosts
    from apps.fleet.route_layout import plan_layout

    host, index = joining_host(spec, args.name, running_hosts(spec, state_dir), [s.name for s in state.services])
    layout = plan_layout(joining_alone(spec, host) if args.keep_serving else spec, args.checkpoint, args.routes,
                         args.weights)
    return index, layout, _serving_routes(orchestrator, channel, host_names(state, state_dir))


def _apply(added, orchestrator: str, channel: ChannelConfig, names: dict[str, str]) -> int:
    """Installs the added routes (named by hosts) through AddRoutes."""
    address = {name: worker for worker, name in names.items()}
    request = pb.AddRoutesRequest(request_id=str(uuid.uuid4()), routes=[
        pb.RouteWorkers(worker_addresses=[address[h] for h in route]) for route in added])
    try:
        with open_channel(orchestrator, channel) as opened:
            reply = pb_grpc.OrchestratorServiceStub(opened).AddRoutes(request, timeout=RPC_SLACK_S + 480)
    except grpc.RpcError as exc:
        return _fail(f"the layout was not applied: {reason_of(exc) or exc.code().name}: {exc.details()}; "
                     "the serving routes are unchanged, the host stays joined")
    routes = reply.status.routes or [reply.status]
    print(f"applied: {len(added)} route(s) added; routes serving: "
          + ", ".join(">".join(names.get(s.worker_address, s.worker_address) for s in r.stages) for r in routes))
    return 0


def _bring_up(args: argparse.Namespace, state_dir: Path, spec, state, index: int):
    """Builds the host and starts its worker; None (and why, on stderr) when that failed."""
    from apps.fleet.host_join import set_up_host, start_worker
    from apps.fleet.launcher import FleetOptions, LaunchError
    from apps.fleet.netns import IsolationFailed, IsolationUnavailable

    options = FleetOptions(state_dir=state_dir, insecure=not state.tls, startup_timeout_s=args.startup_timeout_s)
    try:
        host = set_up_host(spec, state_dir, args.name)
        _, entry = start_worker(options, state, host, index)
    except (IsolationUnavailable, IsolationFailed, LaunchError, OSError) as exc:
        _fail(f"host {args.name} did not come up: {exc}; the serving routes are unchanged "
              "(`fornax down` removes what was built)")
        return None
    return entry


def _check_joined(args: argparse.Namespace, state_dir: Path, spec, entry, channel: ChannelConfig) -> int | None:
    """The joined worker's clock, then (--profile) its profile; a refusal stops it (1), None passes."""
    from apps.fleet.join_checks import DEFAULT_CLOCK_TOLERANCE_S, check_clock, profile_refusal, read_clock
    from libs.service.errors import FornaxError

    tolerance_s = DEFAULT_CLOCK_TOLERANCE_S if args.clock_tolerance_s is None else args.clock_tolerance_s
    try:
        try:
            worker_ns, reading = read_clock(entry.grpc, channel)
        except grpc.RpcError as exc:
            return _refuse(args, state_dir, entry, f"its clock could not be read ({exc.code().name})")
        check_clock(args.name, worker_ns, reading, tolerance_s)
        print(f"clock of {args.name}: {reading.offset_ns / 1e9:+.3f} s from this machine's "
              f"(+/- {reading.uncertainty_ns / 1e9:.3f} s; tolerance {tolerance_s:g} s)")
        if args.profile:
            try:
                print(_profile_joined(args, state_dir, spec, entry))
            except Exception as exc:  # noqa: BLE001 - any failure of the profile refuses the join
                raise profile_refusal(args.name, exc) from exc
    except FornaxError as exc:
        return _refuse(args, state_dir, entry, f"{exc.reason}: {exc.message}")
    return None


def _refuse(args: argparse.Namespace, state_dir: Path, entry, why: str) -> int:
    from apps.fleet.host_leave import stop_retired_worker

    state = read_fleet(state_dir)
    if state is not None:
        stop_retired_worker(state_dir, state, entry, 10.0)
    return _fail(f"host {args.name} was refused: {why}; its worker {entry.name} was stopped, "
                 "the serving routes are unchanged")


def _profile_joined(args: argparse.Namespace, state_dir: Path, spec, entry) -> str:
    """Profiles the joined worker's stage and stores it; one line saying what was stored."""
    import asyncio

    from apps.fleet.profiling import ProfileRequest, Worker, profile_fleet
    from libs.profiles.measure import Grid
    from libs.weights.policy import DEFAULT_POLICY

    credentials = operator_credentials(state_dir)
    state = read_fleet(state_dir)
    if credentials is None or state is None:
        raise FailedPrecondition("profiles are physical evidence and must be signed: the fleet must serve mTLS",
                                 reason="NO_SIGNING_IDENTITY")
    host = next(h for h in spec.hosts if h.name == args.name)
    worker = Worker(args.name, entry.grpc, host.weights or args.weights or DEFAULT_POLICY)
    request = ProfileRequest(str(Path(args.checkpoint).resolve()), Grid(), "fornax host add --profile")
    result = asyncio.run(profile_fleet([worker], state.entry("artifact_builder").grpc,
                                       state.entry("evidence_registry").grpc, request,
                                       ChannelConfig(credentials=credentials),
                                       lambda line: print(line, file=sys.stderr)))
    return f"profile of {args.name} stored: record {result.stages[0].record.record_id} (physical, this host)"


def _serving_routes(orchestrator: str, channel: ChannelConfig, names: dict[str, str]) -> list[tuple[str, ...]]:
    """The serving routes by host name, stage order."""
    with open_channel(orchestrator, channel) as opened:
        status = pb_grpc.OrchestratorServiceStub(opened).GetPlanStatus(pb.GetPlanStatusRequest(), timeout=10).current
    return [tuple(names.get(s.worker_address, s.worker_address) for s in route.stages)
            for route in (status.routes or [status]) if route.stages]
