"""The route as `fornax status` reports it: the orchestrator's plan state and each stage's.

Service health alone says a process answers; this says whether the route can serve: a
stage that is dead, stopped or unloaded, or a drained route, shows here.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from fornax.orchestrator.v1 import orchestrator_pb2 as orch_pb
from fornax.orchestrator.v1 import orchestrator_pb2_grpc as orch_grpc
from fornax.stage_worker.v1 import stage_worker_pb2 as sw_pb
from fornax.stage_worker.v1 import stage_worker_pb2_grpc as sw_grpc
from libs.service.channels import ChannelConfig, open_channel
from libs.service.fleet_state import FleetState

CALL_TIMEOUT_S = 2.0
IDLE = "IDLE (in no serving route)"


@dataclass(frozen=True)
class RouteReport:
    state: str  # SERVING, DEGRADED, DRAINED, ... or UNREACHABLE
    reason: str
    stage_states: dict[str, str]  # stage worker name -> LOADED state or UNREACHABLE
    # The route's measured service against its plan's predictions: NO_PREDICTION, UNMEASURED,
    # CALIBRATED or UNCALIBRATED, and why (both figures, which is which); empty when untracked.
    calibration: str = ""
    calibration_reason: str = ""
    # Stage worker name -> its paged KV in blocks and its prefix hits (loaded stages only).
    stage_kv: dict[str, str] | None = None
    # Replica routes (one line each: state, reason, stages with worker and layers); empty for one route.
    replicas: tuple[str, ...] = ()
    # Replica routes taken out of the serving set (one line each: reason, host, workers), latest last.
    removed: tuple[str, ...] = ()

    @property
    def healthy(self) -> bool:
        """No route yet (or one installing) is not a fault; a serving route needs every
        stage loaded; anything else (degraded, drained, failed, unreachable) is a fault."""
        if self.state in ("EMPTY", "INSTALLING"):
            return True
        return self.state == "SERVING" and all(s in ("READY", "EXECUTING", IDLE)
                                               for s in self.stage_states.values())

    def render(self) -> str:
        line = f"route: {self.state}" + (f" ({self.reason})" if self.reason else "")
        stages = ", ".join(f"{name} {state}" for name, state in self.stage_states.items())
        line += f"\nstages: {stages}" if stages else ""
        for index, replica in enumerate(self.replicas):
            line += f"\nroute {index}: {replica}"
        for removed in self.removed:
            line += f"\nremoved route: {removed}"
        if self.stage_kv:
            line += "\nkv: " + "; ".join(f"{name} {kv}" for name, kv in self.stage_kv.items())
        return line + (f"\ncalibration: {self.calibration}: {self.calibration_reason}" if self.calibration else "")


def route_report(state: FleetState, channel: ChannelConfig = ChannelConfig()) -> RouteReport | None:
    orchestrator = next((s for s in state.services if s.kind == "orchestrator"), None)
    if orchestrator is None:
        return None
    healths = {s.name: _stage_health(s.grpc, channel) for s in state.services if s.kind == "stage_worker"}
    stages = {name: h[0] for name, h in healths.items()}
    kv = {name: h[1] for name, h in healths.items() if h[1]}
    try:
        with open_channel(orchestrator.grpc, channel) as opened:
            reply = orch_grpc.OrchestratorServiceStub(opened).GetPlanStatus(
                orch_pb.GetPlanStatusRequest(), timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as exc:
        return RouteReport("UNREACHABLE", exc.code().name, stages, stage_kv=kv)
    status = reply.current
    stages = idle_outside_routes(stages, {s.name: s.grpc for s in state.services},
                                 {stage.worker_address for stage in status.stages})
    calibration = ""
    if status.HasField("calibration"):
        calibration = orch_pb.CalibrationState.Name(status.calibration.state).removeprefix("CALIBRATION_STATE_")
    return RouteReport(orch_pb.RouteState.Name(status.state).removeprefix("ROUTE_STATE_"),
                       status.reason, stages, calibration, status.calibration.reason, kv,
                       tuple(replica_line(route) for route in status.routes),
                       tuple(removed_line(route) for route in status.removed_routes))


def idle_outside_routes(stages: dict[str, str], addresses: dict[str, str], serving: set[str]) -> dict[str, str]:
    """A stage worker in no serving route (a host drain left it, or the planner left it out) is
    IDLE, not a fault; with no stage serving yet every worker shows its own state."""
    if not serving:
        return stages
    return {name: state if addresses.get(name) in serving else IDLE for name, state in stages.items()}


def replica_line(route: orch_pb.PlanStatus) -> str:
    """One replica route: its state (and why), then each stage's worker, layers and health."""
    state = orch_pb.RouteState.Name(route.state).removeprefix("ROUTE_STATE_")
    stages = ", ".join(
        f"stage {s.stage_index} {s.worker_address} layers {s.layer_range.layer_start}-"
        f"{s.layer_range.layer_end_exclusive} {'ok' if s.healthy else s.condition or 'down'}" for s in route.stages)
    return state + (f" ({route.reason})" if route.reason else "") + f": {stages}"


def removed_line(route: orch_pb.RemovedRoute) -> str:
    """A route that left the serving set: why (REJOIN_TIMEOUT, HOST_DRAINED), its host, its workers."""
    reason = orch_pb.RouteRemovalReason.Name(route.reason).removeprefix("ROUTE_REMOVAL_REASON_")
    return (f"{reason} host {route.host_worker_address}: {' > '.join(route.worker_addresses)}"
            + (f" ({route.detail})" if route.detail else ""))


def kv_summary(reply: sw_pb.GetHealthResponse) -> str:
    """A loaded stage's paged KV: free of total blocks, cached ones, evictions, and the prefix
    hit rate over the blocks looked up since the stage loaded."""
    if not reply.kv_blocks_total:
        return ""
    looked = reply.prefix_hit_blocks + reply.prefix_missed_blocks
    hits = (f", prefix hit rate {100 * reply.prefix_hit_blocks / looked:.1f}% "
            f"({reply.prefix_hit_blocks}/{looked} blocks)") if looked else ""
    return (f"{reply.kv_blocks_free}/{reply.kv_blocks_total} blocks free of {reply.kv_block_tokens} tokens "
            f"({reply.kv_blocks_cached} cached, {reply.kv_evicted_blocks} evicted){hits}")


def _stage_health(address: str, channel: ChannelConfig) -> tuple[str, str]:
    try:
        with open_channel(address, channel) as opened:
            reply = sw_grpc.StageWorkerServiceStub(opened).GetHealth(
                sw_pb.GetHealthRequest(), timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as exc:
        return ("UNRESPONSIVE" if exc.code() is grpc.StatusCode.DEADLINE_EXCEEDED else "UNREACHABLE"), ""
    return sw_pb.StageState.Name(reply.state).removeprefix("STAGE_STATE_"), kv_summary(reply)
