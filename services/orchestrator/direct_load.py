"""Load a checkpoint straight onto running stage workers with an even layer split.

The orchestrator's installer goes through the planner and the artifact builder; this direct
path serves benchmarks and tests that measure the data plane rather than the install.
"""

from __future__ import annotations

import uuid

from fornax.common.v1 import common_pb2
from fornax.stage_worker.v1 import stage_worker_pb2 as pb
from fornax.stage_worker.v1 import stage_worker_pb2_grpc as pb_grpc

from libs.model.layout import even_layer_split
from libs.service.channels import open_channel
from services.orchestrator.stage_chain import RoutePlan, RouteStage

DTYPES = {"bf16": common_pb2.ELEMENT_TYPE_BF16, "fp16": common_pb2.ELEMENT_TYPE_FP16, "fp32": common_pb2.ELEMENT_TYPE_FP32}
BACKENDS = {"numpy": common_pb2.BACKEND_NUMPY, "max": common_pb2.BACKEND_MAX}
DIRECT_PLAN_HASH_PREFIX = "sha256:"


def load_checkpoint_route(workers: list[str], checkpoint: str, layers: int, *, boundary: str = "fp32",
                          backend: str = "numpy", logits: bool = False, timeout_s: float = 3600) -> RoutePlan:
    """Load stages last to first (each learns its next hop's address and manifest hash)."""
    count = len(workers)
    plan_hash = DIRECT_PLAN_HASH_PREFIX + uuid.uuid4().hex * 2
    binding = common_pb2.PlanBinding(plan_id=str(uuid.uuid4()), plan_hash=plan_hash, plan_generation_id=str(uuid.uuid4()))
    next_address, next_manifest, stages = "", "", []
    for index, (start, end) in reversed(list(enumerate(even_layer_split(layers, count)))):
        spec = pb.StageSpec(
            stage_index=index, stage_count=count,
            layer_range=common_pb2.LayerRange(layer_start=start, layer_end_exclusive=end),
            plan=binding, checkpoint_dir=str(checkpoint), backend=BACKENDS[backend],
            boundary_dtype=DTYPES[boundary], next_hop_address=next_address, next_hop_manifest_hash=next_manifest,
            output_mode=pb.OUTPUT_MODE_LOGITS if logits else pb.OUTPUT_MODE_SAMPLED_TOKENS, device="cpu",
        )
        with open_channel(workers[index]) as channel:
            stub = pb_grpc.StageWorkerServiceStub(channel)
            stub.UnloadStage(pb.UnloadStageRequest(request_id=str(uuid.uuid4())), timeout=60)
            loaded = stub.LoadStage(pb.LoadStageRequest(request_id=str(uuid.uuid4()), spec=spec), timeout=timeout_s)
        next_address, next_manifest = loaded.data_plane_address, loaded.manifest_hash
        stages.append(RouteStage(index, workers[index], loaded.data_plane_address, loaded.manifest_hash))
    return RoutePlan(binding.plan_id, binding.plan_hash, binding.plan_generation_id, tuple(reversed(stages)))
