"""`fornax host drain NAME`: one host leaves the running fleet while it serves.

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
