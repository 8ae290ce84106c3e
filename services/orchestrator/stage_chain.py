"""The client side of one installed stage pipeline: admission, FNX2 batches, cancel, release.

The orchestrator drives a `Route`: it admits a request on every stage (KV reserved, sampling
recorded on the final stage) over gRPC, sends ragged batches of token ids to stage 0 over
FNX2, receives the final stage's sampled tokens (or logits) back, and fans cancel and
release out to every stage, collecting each stage's KV epoch.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from fornax.stage_worker.v1 import stage_worker_pb2 as pb
from fornax.stage_worker.v1 import stage_worker_pb2_grpc as pb_grpc

from libs.fnx2.control import ChannelBinding
from libs.fnx2.messages import Batch, BatchDescriptor, Phase, SequenceSlice, SequenceStatus
from libs.fnx2.sender import Fnx2Client, SenderConfig
from libs.fnx2.tensor import DType, Tensor, TensorKind
from libs.model.sampling import SamplingParams
from libs.security.fnx2_tls import Fnx2Tls
from libs.service.channels import ChannelConfig, open_aio_channel

GATEWAY = "gateway"
UNLOAD_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RouteStage:
    index: int
    control_address: str  # gRPC host:port
    data_plane_address: str  # FNX2 host:port
    manifest_hash: str
    # The identity in that worker's certificate, which the previous hop checks; "" without TLS.
    data_plane_identity: str = ""


@dataclass(frozen=True)
class RoutePlan:
    plan_id: str
    plan_hash: str
    plan_generation_id: str
    stages: tuple[RouteStage, ...]


@dataclass(frozen=True)
class SliceInput:
    request_id: str
    lease_id: str
    sequence_no: int
    position_start: int
    kv_epoch: int
    token_ids: np.ndarray  # int32 [rows]
    deadline_budget_ns: int
    trace_id: str = ""
    span_id: str = ""


@dataclass(frozen=True)
class SliceOutput:
    request_id: str
    ok: bool
    rows: np.ndarray | None  # int32 [1] sampled token, or float32 [rows, vocab] logits
    kv_epoch_after: int
    error_code: str | None = None
    error_message: str | None = None
    execute_ns: int = 0
    queue_ns: int = 0


@dataclass(frozen=True)
class StageLoad:
    """One stage to load: its worker's gRPC address and its spec, next hop not yet known."""

    address: str
    spec: pb.StageSpec
    # The identity in the worker's certificate, which its previous hop checks; "" without TLS.
    identity: str = ""


async def load_route(loads: Sequence[StageLoad], load_timeout_s: float = 3600.0,
                     progress: Callable[[str], None] = lambda message: None,
                     channel: ChannelConfig = ChannelConfig()) -> RoutePlan:
    """Load last to first, so each stage is told its next hop's FNX2 address and manifest hash.

    Every spec carries the same plan binding; whatever a worker had loaded before is unloaded.
    """
    next_address, next_manifest, loaded = "", "", []
    for load in reversed(loads):
        spec = pb.StageSpec()
        spec.CopyFrom(load.spec)
        spec.next_hop_address, spec.next_hop_manifest_hash = next_address, next_manifest
        layers = spec.layer_range
        async with open_aio_channel(load.address, channel) as opened:
            stub = pb_grpc.StageWorkerServiceStub(opened)
            await stub.UnloadStage(pb.UnloadStageRequest(request_id=str(uuid.uuid4())), timeout=UNLOAD_TIMEOUT_S)
            progress(f"loading stage {spec.stage_index} (layers {layers.layer_start}-"
                     f"{layers.layer_end_exclusive - 1}) on {load.address}")
            reply = await stub.LoadStage(pb.LoadStageRequest(request_id=str(uuid.uuid4()), spec=spec),
                                         timeout=load_timeout_s)
        next_address, next_manifest = reply.data_plane_address, reply.manifest_hash
        loaded.append(RouteStage(spec.stage_index, load.address, reply.data_plane_address, reply.manifest_hash,
                                 load.identity))
    binding = loads[0].spec.plan
    return RoutePlan(binding.plan_id, binding.plan_hash, binding.plan_generation_id, tuple(reversed(loaded)))


def lease_id_for(plan: RoutePlan, request_id: str) -> str:
    from libs.fnx2.leases import derive_execution_lease_id

    return derive_execution_lease_id(plan.plan_generation_id, plan.plan_id, plan.plan_hash, request_id)


class Route:
    def __init__(self, plan: RoutePlan, channel: ChannelConfig = ChannelConfig(),
                 data_plane_tls: Fnx2Tls | None = None):
        self.plan = plan
        self._tls = data_plane_tls
        self._channels = [open_aio_channel(s.control_address, channel) for s in plan.stages]
        self._stubs = [pb_grpc.StageWorkerServiceStub(c) for c in self._channels]
        self._client: Fnx2Client | None = None
        self._batch_numbers = itertools.count()

    async def open(self) -> None:
        first = self.plan.stages[0]
        binding = ChannelBinding(
            self.plan.plan_id, self.plan.plan_hash, first.manifest_hash, "stage-0", self.plan.plan_generation_id
        )
        host, _, port = first.data_plane_address.rpartition(":")
        if self._tls is not None:
            self._client = await self._tls.connect(host, int(port), SenderConfig(binding), first.data_plane_identity)
        else:
            self._client = await Fnx2Client.connect(host, int(port), SenderConfig(binding))

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
        for channel in self._channels:
            await channel.close()

    async def admit(self, request_id: str, reserve_tokens: int, sampling: SamplingParams,
                    logits: bool = False) -> None:
        """Reserve KV on every stage; on any refusal, undo the reservations that succeeded."""
        mode = pb.OUTPUT_MODE_LOGITS if logits else pb.OUTPUT_MODE_SAMPLED_TOKENS
        message = pb.AdmitSequenceRequest(
            request_id=str(uuid.uuid4()),
            target_request_id=request_id,
            execution_lease_id=lease_id_for(self.plan, request_id),
            reserve_tokens=reserve_tokens,
            sampling=pb.SamplingSpec(
                temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                seed=sampling.stream_seed,
            ),
            output_mode=mode,
        )
        outcomes = await asyncio.gather(*(stub.AdmitSequence(message) for stub in self._stubs), return_exceptions=True)
        failure = next((o for o in outcomes if isinstance(o, BaseException)), None)
        if failure is not None:
            await self.release(request_id)
            raise failure

    async def run(self, phase: Phase, inputs: list[SliceInput], traceparent: str | None = None) -> list[SliceOutput]:
        """One ragged batch through every stage; outputs in input order."""
        batch = self._batch(phase, inputs, traceparent)
        result = await self._client.submit(batch)
        by_id = {r.request_id: r for r in result.results}
        outputs = []
        for item in inputs:
            r = by_id[item.request_id]
            ok = r.status is SequenceStatus.OK
            rows = np.array(result.rows_for(r)) if ok else None
            outputs.append(
                SliceOutput(item.request_id, ok, rows, r.kv_epoch_after, r.error_code, r.error_message,
                            r.timings.execute_ns, r.timings.queue_ns)
            )
        return outputs

    def _batch(self, phase: Phase, inputs: list[SliceInput], traceparent: str | None = None) -> Batch:
        slices, row = [], 0
        for item in inputs:
            count = int(item.token_ids.shape[0])
            slices.append(
                SequenceSlice(
                    item.request_id, item.sequence_no, row, count, item.position_start, item.kv_epoch,
                    item.deadline_budget_ns, item.lease_id, item.trace_id or item.request_id,
                    item.span_id or item.request_id,
                )
            )
            row += count
        ids = np.concatenate([np.asarray(i.token_ids, dtype=np.int32) for i in inputs])
        descriptor = BatchDescriptor(str(uuid.uuid4()), next(self._batch_numbers), phase, row, tuple(slices))
        return Batch(
            self.plan.plan_id, self.plan.plan_hash, self.plan.stages[0].manifest_hash, GATEWAY, "stage-0",
            descriptor, Tensor.from_array(TensorKind.TOKEN_IDS, DType.INT32, ids), traceparent,
        )

    async def cancel(self, request_id: str) -> list[int]:
        message = pb.CancelRequestRequest(request_id=str(uuid.uuid4()), target_request_id=request_id)
        replies = await asyncio.gather(*(stub.CancelRequest(message) for stub in self._stubs))
        return [reply.kv_epoch for reply in replies]

    async def release(self, request_id: str) -> list[int]:
        """Free the request's KV on every stage; returns each stage's final KV epoch."""
        message = pb.ReleaseRequestRequest(request_id=str(uuid.uuid4()), target_request_id=request_id)
        replies = await asyncio.gather(*(stub.ReleaseRequest(message) for stub in self._stubs), return_exceptions=True)
        failure = next((r for r in replies if isinstance(r, BaseException)), None)
        if failure is not None:
            raise failure
        return [reply.kv_epoch for reply in replies]

    async def health(self) -> list[pb.GetHealthResponse]:
        return list(await asyncio.gather(*(stub.GetHealth(pb.GetHealthRequest()) for stub in self._stubs)))
