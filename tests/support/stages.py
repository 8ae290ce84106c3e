"""Start stage-worker processes and load a pipeline onto them, the way the orchestrator does."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import grpc
from fornax.common.v1 import common_pb2
from fornax.stage_worker.v1 import stage_worker_pb2 as pb
from fornax.stage_worker.v1 import stage_worker_pb2_grpc as pb_grpc

from libs.gateway.route import RoutePlan, RouteStage
from tests.support.procs import ServiceProc

PLAN_HASH = "sha256:" + "ab" * 32
DTYPES = {"bf16": common_pb2.ELEMENT_TYPE_BF16, "fp32": common_pb2.ELEMENT_TYPE_FP32}


@dataclass
class StageFleet:
    procs: list[ServiceProc]
    addresses: list[str]

    def stub(self, index: int) -> pb_grpc.StageWorkerServiceStub:
        return pb_grpc.StageWorkerServiceStub(grpc.insecure_channel(self.addresses[index]))

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop()


def start_workers(count: int, workdir: Path, backend: str = "numpy") -> StageFleet:
    procs = [
        ServiceProc("services.stage_worker", workdir / f"w{i}", env={"FORNAX_STAGE_INDEX": str(i), "FORNAX_BACKEND": backend})
        for i in range(count)
        if (workdir / f"w{i}").mkdir(parents=True, exist_ok=True) is None
    ]
    return StageFleet(procs, [p.wait_serving() for p in procs])


def even_ranges(layers: int, stages: int) -> list[tuple[int, int]]:
    bounds = [round(i * layers / stages) for i in range(stages + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def load_pipeline(fleet: StageFleet, checkpoint: Path, layers: int, boundary: str = "fp32",
                  logits: bool = False, backend: str = "numpy") -> RoutePlan:
    """Load stages last to first, so each stage knows its next hop's manifest hash."""
    count = len(fleet.addresses)
    binding = common_pb2.PlanBinding(plan_id=str(uuid.uuid4()), plan_hash=PLAN_HASH, plan_generation_id=str(uuid.uuid4()))
    next_addr, next_hash, stages = "", "", []
    for index, (start, end) in reversed(list(enumerate(even_ranges(layers, count)))):
        stub = fleet.stub(index)
        stub.UnloadStage(pb.UnloadStageRequest(request_id=str(uuid.uuid4())), timeout=60)
        spec = pb.StageSpec(
            stage_index=index, stage_count=count,
            layer_range=common_pb2.LayerRange(layer_start=start, layer_end_exclusive=end),
            plan=binding, checkpoint_dir=str(checkpoint),
            backend=common_pb2.BACKEND_NUMPY if backend == "numpy" else common_pb2.BACKEND_MAX,
            boundary_dtype=DTYPES[boundary], next_hop_address=next_addr, next_hop_manifest_hash=next_hash,
            output_mode=pb.OUTPUT_MODE_LOGITS if logits else pb.OUTPUT_MODE_SAMPLED_TOKENS, device="cpu",
        )
        loaded = stub.LoadStage(pb.LoadStageRequest(request_id=str(uuid.uuid4()), spec=spec), timeout=600)
        next_addr, next_hash = loaded.data_plane_address, loaded.manifest_hash
        stages.append(RouteStage(index, fleet.addresses[index], loaded.data_plane_address, loaded.manifest_hash))
    return RoutePlan(binding.plan_id, binding.plan_hash, binding.plan_generation_id, tuple(reversed(stages)))
