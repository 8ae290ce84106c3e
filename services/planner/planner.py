"""The planner core: feasibility first, then the bottleneck-minimising placement.

Pure: typed values in, a `PlanResult` out. Deployment mode consults a `Resolver` (the
evidence registry behind an interface) and fails closed.

Predicted figures (all predictions of the cost model in `costs.py`, never measurements):
- the pipeline keeps `m = ceil(concurrency / microbatch_rows)` decode microbatches in flight
  in a closed loop (each sequence needs its previous token). One pass of a microbatch through
  every stage and route takes `S`; the busiest stage or route takes `B` per microbatch; so a
  cycle takes `max(S, m * B)` and decode yields `concurrency / cycle` tokens/s;
- the queueing `cycle - S` builds in front of the bottleneck; each stage's exposed wait is its
  idle time per microbatch period `cycle / m`;
- TTFT is one request's prefill of `prefill_tokens` through every stage and route;
- bubble is the mean idle fraction of the stages.
"""

from __future__ import annotations

import math
from dataclasses import asdict, replace

import numpy as np

from libs.service.errors import FailedPrecondition
from services.planner import domain as d
from services.planner import evidence
from services.planner.costs import CostTables, build_tables, decode_service_matrix, stage_memory, stage_time
from services.planner.feasibility import (
    explain_infeasible,
    node_rejection,
    route_rejections,
    smallest_stage_bytes,
    unevidenced_route_rejections,
)
from services.planner.inventory import Inventory, Node, Target, validate_target
from services.planner.model import ModelDescription
from services.planner.search import Placement, Problem, method_name, solve


class EvidenceUnavailable(FailedPrecondition):
    default_reason = "NO_EVIDENCE_REGISTRY"


def plan(model: ModelDescription, inventory: Inventory, target: Target,
         resolver: evidence.Resolver | None = None) -> d.PlanResult:
    validate_target(target)
    if target.mode == "deployment" and resolver is None:
        raise EvidenceUnavailable("deployment mode needs an evidence registry to resolve records", field="target.mode")
    result = _plan(model, inventory, target)
    if resolver is not None and target.mode == "deployment":
        result = evidence.gate(result, inventory, resolver)
    return result


def _plan(model: ModelDescription, inventory: Inventory, target: Target) -> d.PlanResult:
    probe = build_tables(model, inventory, inventory.nodes, target)
    smallest = smallest_stage_bytes(probe) if model.num_layers else 0
    rejections: list[d.Rejection] = []
    capable: list[Node] = []
    for node in inventory.nodes:
        rejection = node_rejection(node, model, target, smallest)
        rejections.append(rejection) if rejection else capable.append(node)
    if not capable:
        gap = min(smallest + n.reserve_bytes - n.memory_bytes for n in inventory.nodes)
        return d.PlanResult(False, None, tuple(rejections), "no node can hold any stage of this model",
                            d.NO_CAPABLE_NODE, float(max(gap, 0)))
    routes = route_rejections(inventory, tuple(capable))
    rejections += routes
    if target.mode == "deployment":
        usable, unevidenced = evidence.evidenced_links(inventory)
        rejections += unevidenced_route_rejections(unevidenced, {n.name for n in capable})
        inventory = replace(inventory, links=usable)
    tables = build_tables(model, inventory, tuple(capable), target)
    problem = Problem(decode_service_matrix(tables), tables.link_decode_s, target.min_stages, target.max_stages)
    placement = solve(problem, target.objective)
    if placement is None:
        why = explain_infeasible(tables, target, len(routes))
        return d.PlanResult(False, None, tuple(rejections), why.detail, why.reason, max(why.shortfall_bytes, 0.0))
    return d.PlanResult(True, build_plan(tables, target, placement), tuple(rejections))


def _stage(tables: CostTables, placement: Placement, i: int) -> d.PlannedStage:
    node_idx = placement.nodes[i]
    node = tables.nodes[node_idx]
    start, end = placement.cuts[i], placement.cuts[i + 1]
    nxt = placement.nodes[i + 1] if i + 1 < len(placement.nodes) else None
    mem = stage_memory(tables, start, end)
    decode, prefill = (stage_time(tables, node_idx, start, end, nxt, prefill=p) for p in (False, True))
    return d.PlannedStage(
        stage_index=i, node=node.name, backend=node.backend, build=node.build,
        layer_start=start, layer_end=end, owns_embeddings=start == 0, owns_head=end == tables.num_layers,
        weight_bytes=mem.weight_bytes, kv_bytes=mem.kv_bytes, activation_bytes=mem.activation_bytes,
        reserve_bytes=node.reserve_bytes, node_memory_bytes=node.memory_bytes,
        decode=d.StageCost(decode.compute_s, decode.pack_s, decode.wire_s, decode.unpack_s),
        prefill=d.StageCost(prefill.compute_s, prefill.pack_s, prefill.wire_s, prefill.unpack_s),
    )


def _with_queueing(stages: list[d.PlannedStage], microbatches: int) -> tuple[list[d.PlannedStage], float, float]:
    """Adds queue and exposed-wait terms; returns (stages, bottleneck_s, cycle_s)."""
    service = [s.decode.service_s for s in stages]
    wires = [s.decode.wire_s for s in stages]
    bottleneck = max(service + wires)
    pass_s = sum(service) + sum(wires)
    cycle = max(pass_s, microbatches * bottleneck)
    period = cycle / microbatches
    busiest = int(np.argmax([max(a, b) for a, b in zip(service, wires, strict=True)]))
    out = []
    for i, s in enumerate(stages):
        queue = cycle - pass_s if i == busiest else 0.0
        cost = replace(s.decode, queue_s=queue, exposed_wait_s=max(period - s.decode.service_s, 0.0))
        out.append(replace(s, decode=cost))
    return out, bottleneck, cycle


def _predictions(stages: list[d.PlannedStage], target: Target, bottleneck: float, cycle: float,
                 microbatches: int) -> tuple[d.Prediction, ...]:
    ttft = sum(s.prefill.service_s + s.prefill.wire_s for s in stages)
    period = cycle / microbatches
    busy = sum(s.decode.service_s for s in stages) / (len(stages) * period)
    return (
        d.Prediction("decode_tokens_per_s", target.concurrency / cycle, "tokens/s"),
        d.Prediction("per_sequence_tokens_per_s", 1.0 / cycle, "tokens/s"),
        d.Prediction("ttft_s", ttft, "s"),
        d.Prediction("bubble_fraction", max(1.0 - busy, 0.0), "fraction"),
        d.Prediction("bottleneck_s", bottleneck, "s"),
        d.Prediction("decode_cycle_s", cycle, "s"),
        d.Prediction("decode_microbatches", float(microbatches), "count"),
        d.Prediction("decode_microbatch_rows", float(target.microbatch_rows), "rows"),
    )


def build_plan(tables: CostTables, target: Target, placement: Placement) -> d.Plan:
    microbatches = math.ceil(target.concurrency / target.microbatch_rows)
    stages = [_stage(tables, placement, i) for i in range(len(placement.nodes))]
    stages, bottleneck, cycle = _with_queueing(stages, microbatches)
    content: dict[str, object] = {
        "model_snapshot": tables.model.model_snapshot,
        "mode": target.mode,
        "target": asdict(target),
        "stages": [
            {"node": s.node, "backend": s.backend, "build": s.build, "layer_start": s.layer_start,
             "layer_end_exclusive": s.layer_end, "owns_embeddings": s.owns_embeddings, "owns_head": s.owns_head}
            for s in stages
        ],
    }
    plan_id, plan_hash = d.plan_identity(content)
    return d.Plan(
        plan_id=plan_id, plan_hash=plan_hash, mode=target.mode, objective=target.objective,
        model_snapshot=tables.model.model_snapshot, method=method_name(len(tables.nodes)),
        stages=tuple(stages), predictions=_predictions(stages, target, bottleneck, cycle, microbatches),
    )
