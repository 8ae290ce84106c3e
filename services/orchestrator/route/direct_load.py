"""Load a checkpoint straight onto running stage workers: an even split, or explicit layer ranges.

The orchestrator's installer goes through the planner and the artifact builder; this direct
path serves benchmarks and tests that measure the data plane rather than the install.
"""

from __future__ import annotations

import asyncio
import uuid

from fornax.common.v1 import common_pb2
from fornax.stage_worker.v1 import stage_worker_pb2 as pb
from libs.common.kinds import Backend, DType
from libs.common.proto import BACKEND_TO_PB, DTYPE_TO_PB
from libs.model.layout import even_layer_split
from services.orchestrator.route.stage_chain import RoutePlan, StageLoad, load_route

DIRECT_PLAN_HASH_PREFIX = "sha256:"


def checkpoint_stage_loads(workers: list[str], checkpoint: str, layer_ranges: list[tuple[int, int]], *,
                           backends: list[str], boundary: str = "fp32", logits: bool = False,
                           kv_dtype: str = "", max_activations: str = "") -> list[StageLoad]:
    """One stage per worker, in worker order: stage i runs `layer_ranges[i]` (half-open) on
    `backends[i]`, read straight from the checkpoint (the worker's read roots must allow it).
    `kv_dtype` sets every stage's KV element type, `max_activations` every MAX stage's
    block-format activations (a numpy stage refuses one); empty leaves each worker's own."""
    count = len(workers)
    if not count == len(layer_ranges) == len(backends):
        raise ValueError(f"{count} workers need as many layer ranges and backends")
    plan_hash = DIRECT_PLAN_HASH_PREFIX + uuid.uuid4().hex * 2
    binding = common_pb2.PlanBinding(
        plan_id=str(uuid.uuid4()), plan_hash=plan_hash, plan_generation_id=str(uuid.uuid4())
    )
    return [StageLoad(workers[index], pb.StageSpec(
        stage_index=index, stage_count=count,
        layer_range=common_pb2.LayerRange(layer_start=start, layer_end_exclusive=end),
        plan=binding, checkpoint_dir=str(checkpoint), backend=BACKEND_TO_PB[Backend(backends[index])],
        boundary_dtype=DTYPE_TO_PB[DType(boundary)],
        output_mode=pb.OUTPUT_MODE_LOGITS if logits else pb.OUTPUT_MODE_SAMPLED_TOKENS, device="cpu",
        kv_dtype=kv_dtype, max_activations=max_activations if backends[index] == Backend.MAX.value else "",
    )) for index, (start, end) in enumerate(layer_ranges)]


def load_checkpoint_route(workers: list[str], checkpoint: str, layers: int, *, boundary: str = "fp32",
                          backend: str = "numpy", logits: bool = False, timeout_s: float = 3600,
                          kv_dtype: str = "", max_activations: str = "") -> RoutePlan:
    """Blocking; one stage per worker, in worker order, layers split evenly."""
    loads = checkpoint_stage_loads(workers, checkpoint, even_layer_split(layers, len(workers)),
                                   backends=[backend] * len(workers), boundary=boundary, logits=logits,
                                   kv_dtype=kv_dtype, max_activations=max_activations)
    return asyncio.run(load_route(loads, load_timeout_s=timeout_s))
