"""What qualify reads from a live fleet over gRPC (as the operator): stage health and phase
totals, capabilities, the installed plan and its predictions, and generations."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import grpc

from apps.qualify.gate import PredictedStage
from apps.qualify.phases import PhaseSnapshot
from fornax.orchestrator.v1 import orchestrator_pb2 as orch_pb
from fornax.orchestrator.v1 import orchestrator_pb2_grpc as orch_grpc
from fornax.planner.v1 import planner_pb2 as plan_pb
from fornax.planner.v1 import planner_pb2_grpc as plan_grpc
from fornax.stage_worker.v1 import stage_worker_pb2 as sw_pb
from fornax.stage_worker.v1 import stage_worker_pb2_grpc as sw_grpc
from libs.service.channels import ChannelConfig, open_aio_channel, open_channel

RPC_TIMEOUT_S = 10.0


@dataclass
class StageHealth:
    kv_bytes_used: int
    live_sequences: int
    inflight_batches: int
    plan_generation_id: str
    plan_id: str
    plan_hash: str
    phases: PhaseSnapshot


def stage_health(address: str, channel: ChannelConfig) -> StageHealth:
    with open_channel(address, channel) as ch:
        r = sw_grpc.StageWorkerServiceStub(ch).GetHealth(sw_pb.GetHealthRequest(), timeout=RPC_TIMEOUT_S)
    t = r.phase_totals
    return StageHealth(r.kv_bytes_used, r.live_sequences, r.inflight_batches, r.plan.plan_generation_id,
                       r.plan.plan_id, r.plan.plan_hash,
                       PhaseSnapshot(t.queue_ns, t.compute_ns, t.pack_ns, t.transfer_ns, t.unpack_ns, t.batches))


def capabilities(address: str, channel: ChannelConfig) -> sw_pb.GetCapabilitiesResponse:
    with open_channel(address, channel) as ch:
        return sw_grpc.StageWorkerServiceStub(ch).GetCapabilities(sw_pb.GetCapabilitiesRequest(),
                                                                  timeout=RPC_TIMEOUT_S)


def plan_status(address: str, channel: ChannelConfig) -> orch_pb.PlanStatus:
    with open_channel(address, channel) as ch:
        return orch_grpc.OrchestratorServiceStub(ch).GetPlanStatus(orch_pb.GetPlanStatusRequest(),
                                                                   timeout=RPC_TIMEOUT_S).current


def planner_plan_id(plan_hash: str) -> str:
    """The planner's id of a plan: `plan-` and the first 16 hex digits of its content hash
    (services.planner.domain.plan_identity). The route's binding carries only the hash; its
    plan_id is the FNX2 UUID derived from it."""
    return "plan-" + plan_hash.removeprefix("sha256:")[:16]


def plan_evidence_ids(plan: plan_pb.Plan) -> list[str]:
    """The profile records the plan's terms rest on (its own calibration, if any, excluded):
    what a calibration of this route qualifies."""
    return [r for r in plan.evidence_record_ids if r != plan.calibration_record_id]


def installed_plan(planner: str, plan_hash: str, channel: ChannelConfig) -> plan_pb.Plan:
    with open_channel(planner, channel) as ch:
        plan = plan_grpc.PlannerServiceStub(ch).GetPlan(plan_pb.GetPlanRequest(plan_id=planner_plan_id(plan_hash)),
                                                        timeout=RPC_TIMEOUT_S).plan
    if plan.plan_hash != plan_hash:
        raise ValueError(f"the planner's plan {plan.plan_id} has hash {plan.plan_hash}, the route runs {plan_hash}")
    return plan


def predicted_stages(plan: plan_pb.Plan, hosts: list[str], backends: list[str]) -> list[PredictedStage]:
    """The plan's decode-microbatch cost terms per stage (predictions), on the host serving it
    (the plan's own host name when it states one, else the fleet host of the stage's worker)."""
    out = []
    for s in plan.stages:
        c = s.decode_cost
        out.append(PredictedStage(
            s.stage_index, s.host or hosts[s.stage_index], backends[s.stage_index], s.layer_range.layer_start,
            s.layer_range.layer_end_exclusive,
            {"compute": c.compute_s, "pack": c.pack_s, "wire": c.wire_s, "unpack": c.unpack_s, "queue": c.queue_s,
             "exposed_wait": c.exposed_wait_s}))
    return out


@dataclass
class Generated:
    request_id: str  # qualify's label, e.g. qualify-r1-decode-0
    prompt: tuple[int, ...]
    wire_id: str = ""  # the request's id on the route (a UUID, as FNX2 requires)
    token_ids: list[int] = field(default_factory=list)
    code: str | None = None  # the gRPC status name when the stream ended with an error
    error: str = ""
    started: float = 0.0  # time.monotonic() of the call
    first_token_at: float | None = None
    ended: float = 0.0


class Generator:
    """Greedy generations through the orchestrator's Generate RPC, one aio channel."""

    def __init__(self, orchestrator: str, channel: ChannelConfig, model: str = "fornax") -> None:
        self._channel = open_aio_channel(orchestrator, channel)
        self._stub = orch_grpc.OrchestratorServiceStub(self._channel)
        self._model = model
        self._wire_ids: dict[str, str] = {}

    def wire_id(self, label: str) -> str:
        return self._wire_ids.setdefault(label, str(uuid.uuid4()))

    async def close(self) -> None:
        await self._channel.close()

    async def generate(self, request_id: str, prompt: tuple[int, ...], max_tokens: int, budget_s: float = 0.0,
                       progress=None) -> Generated:
        out = Generated(request_id, prompt, self.wire_id(request_id), started=time.monotonic())
        request = orch_pb.GenerateRequest(
            request_id=out.wire_id, model=self._model, token_ids=orch_pb.TokenIds(ids=list(prompt)),
            sampling=orch_pb.SamplingParams(temperature=0.0, max_tokens=max_tokens),
            deadline_budget_ns=int(budget_s * 1e9))
        try:
            async for event in self._stub.Generate(request):
                if event.token_ids and out.first_token_at is None:
                    out.first_token_at = time.monotonic()
                out.token_ids.extend(event.token_ids)
                if progress is not None:
                    progress(out)
        except grpc.aio.AioRpcError as exc:
            out.code = exc.code().name
            out.error = exc.details() or ""
        out.ended = time.monotonic()
        return out

    async def cancel(self, request_id: str) -> bool:
        reply = await self._stub.Cancel(orch_pb.CancelRequest(request_id=str(uuid.uuid4()),
                                                              target_request_id=self.wire_id(request_id)),
                                        timeout=RPC_TIMEOUT_S)
        return reply.found
