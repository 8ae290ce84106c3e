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
import time
from collections.abc import Sequence
from dataclasses import asdict, replace

import numpy as np

from libs.profiles.schema import route_key as make_route_key
from libs.service.errors import FailedPrecondition
from services.planner import domain as d
from services.planner import evidence, measured, replicas, stability
from services.planner.costs import CostTables, build_tables, decode_service_matrix, stage_memory, stage_time
from services.planner.feasibility import (
    explain_infeasible,
    node_rejection,
    route_rejections,
    smallest_stage_bytes,
    unevidenced_route_rejections,
)
from services.planner.inventory import EvidenceRef, Inventory, Node, Target, validate_target
from services.planner.model import ModelDescription
from services.planner.profiles import Problem as ProfileProblem
from services.planner.profiles import ProfileBook, ProfileRecordInput, Standing, book_from_records
from services.planner.search import Placement, Problem, method_name, solve


class EvidenceUnavailable(FailedPrecondition):
    default_reason = "NO_EVIDENCE_REGISTRY"


class DeploymentRefused(FailedPrecondition):
    """Deployment mode without the measured evidence it needs. The reason is the first
    problem's stable code; the message names every missing, expired or failed record."""

    def __init__(self, problems: list[ProfileProblem]) -> None:
        self.problems = tuple(problems)
        super().__init__("deployment refused: " + "; ".join(p.describe() for p in problems),
                         reason=problems[0].reason)


def plan(model: ModelDescription, inventory: Inventory, target: Target,
         resolver: evidence.Resolver | None = None, profiles: ProfileBook | None = None,
         now_unix_ns: int | None = None) -> d.PlanResult:
    """`profiles` set: plan from measured stage and link profiles (see `measured.py`); a
    deployment plan then needs every term measured and a passing route calibration, else
    `DeploymentRefused`. Unset: plan from the inventory's declared figures."""
    validate_target(target)
    if profiles is not None:
        now = time.time_ns() if now_unix_ns is None else now_unix_ns
        return plan_from_profiles(model, inventory, target, profiles, now)
    if target.mode == "deployment" and resolver is None:
        raise EvidenceUnavailable("deployment mode needs an evidence registry to resolve records", field="target.mode")
    result = _plan(model, inventory, target)
    if resolver is not None and target.mode == "deployment":
        result = evidence.gate(result, inventory, resolver)
    return result


def plan_routes(model: ModelDescription, inventory: Inventory, target: Target, routes: int | None,
                resolver: evidence.Resolver | None = None, profiles: ProfileBook | None = None,
                now_unix_ns: int | None = None) -> d.PlanResult:
    """Replica routes (`replicas`): `routes` pipelines (None: the count predicted fastest, fewer
    when within the measured spread), each planned by `plan` on its own hosts at its share of the
    target concurrency. With `profiles`, each layout's spread comes from the same placements
    predicted on the profiles' fastest and slowest runs (`stability.bounded_book`)."""
    validate_target(target)
    now = time.time_ns() if now_unix_ns is None else now_unix_ns

    def plan_route(group: Inventory, route_target: Target) -> d.PlanResult:
        return plan(model, group, route_target, resolver, profiles, now)

    band = None
    if profiles is not None:
        books = [stability.bounded_book(profiles, side) for side in (stability.HIGH, stability.LOW)]

        def band(group: Inventory, route_target: Target, route: d.Plan) -> tuple[float, float]:
            stages = [(s.node, s.layer_start, s.layer_end) for s in route.stages]
            slow, fast = (predict_placement(model, group, replace(route_target, mode="exploratory"), book, stages,
                                            now).prediction("decode_tokens_per_s") for book in books)
            return slow, fast

    return replicas.plan_routes(inventory, target, routes, plan_route, band)


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
        max_activations=node.activations,
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
        d.Prediction("decode_context_tokens", float(target.decode_context), "tokens"),
    )


def build_plan(tables: CostTables, target: Target, placement: Placement) -> d.Plan:
    stages = [_stage(tables, placement, i) for i in range(len(placement.nodes))]
    return _assemble(tables.model, target, stages, method_name(len(tables.nodes)))


def resolved_book(resolver: evidence.Resolver | None, records: Sequence[ProfileRecordInput]) -> ProfileBook:
    """The records as a book; with a resolver each is re-resolved with its blob's sha256 first,
    so only what the registry vouches for now counts."""
    book = book_from_records(records)
    if resolver is None or not records:
        return book
    resolutions = resolver.resolve([EvidenceRef(r.record_id, r.record_type, r.blob_sha256) for r in records])
    return book.with_standings({x.record_id: Standing(x.ok, x.reason, x.detail, x.evidence_class)
                                for x in resolutions})


def plan_with_records(model: ModelDescription, inventory: Inventory, target: Target,
                      resolver: evidence.Resolver | None, records: Sequence[ProfileRecordInput],
                      now_unix_ns: int | None = None) -> d.PlanResult:
    """Plans from registry records as fetched; deployment mode without a resolver fails closed."""
    validate_target(target)
    if target.mode == "deployment" and resolver is None:
        raise EvidenceUnavailable("deployment mode needs an evidence registry to resolve records", field="target.mode")
    return plan_with_book(model, inventory, target, resolver, resolved_book(resolver, records), now_unix_ns)


def plan_with_book(model: ModelDescription, inventory: Inventory, target: Target,
                   resolver: evidence.Resolver | None, book: ProfileBook,
                   now_unix_ns: int | None = None) -> d.PlanResult:
    """`plan_with_records` on records already resolved into a book (`resolved_book`)."""
    validate_target(target)
    if target.mode == "deployment" and resolver is None:
        raise EvidenceUnavailable("deployment mode needs an evidence registry to resolve records", field="target.mode")
    return plan(model, inventory, target, profiles=book, now_unix_ns=now_unix_ns)


def predict_placement(model: ModelDescription, inventory: Inventory, target: Target, book: ProfileBook,
                      stages: Sequence[tuple[str, int, int]], now_unix_ns: int | None = None) -> d.Plan:
    """The same terms and predictions for a given placement ((node, start, end) per stage), e.g.
    the installed one, so a proposed placement can be compared with it on the same evidence."""
    now = time.time_ns() if now_unix_ns is None else now_unix_ns
    tables = measured.build_measured(model, inventory, inventory.nodes, target, book, now)
    index = {n.name: i for i, n in enumerate(tables.nodes)}
    unknown = [name for name, _, _ in stages if name not in index]
    if unknown:
        raise FailedPrecondition(f"placement names nodes {unknown} the inventory lacks", reason="UNKNOWN_NODE")
    placement = Placement(tuple(index[n] for n, _, _ in stages), (0, *(end for _, _, end in stages)), 0.0)
    planned = [_measured_stage(tables, placement, i) for i in range(len(stages))]
    key = make_route_key(model.model_snapshot, measured.route_stages(tables, placement.nodes, placement.cuts))
    return _assemble(model, target, planned, "given placement (evaluated, not searched)", key)


def plan_from_profiles(model: ModelDescription, inventory: Inventory, target: Target, book: ProfileBook,
                       now_ns: int) -> d.PlanResult:
    """Pure. The profile book's standings must already say what the registry vouches for."""
    exploratory = replace(target, mode="exploratory")  # capability checks only; evidence is judged below
    rejections: list[d.Rejection] = []
    capable: list[Node] = []
    for node in inventory.nodes:
        rejection = node_rejection(node, model, exploratory, 0)
        rejections.append(rejection) if rejection else capable.append(node)
    if not capable:
        return d.PlanResult(False, None, tuple(rejections), "no node offers the model's dtypes and operations",
                            d.NO_CAPABLE_NODE)
    tables = measured.build_measured(model, inventory, tuple(capable), target, book, now_ns)
    placement = solve(_measured_problem(tables, target), target.objective)
    choice = None
    if placement is not None and target.objective == "throughput":
        choice = _stable_choice(model, inventory, tuple(capable), target, book, now_ns, tables, placement)
        placement = choice.chosen
    if placement is None:
        return d.PlanResult(False, None, tuple(rejections),
                            f"no chain of {target.min_stages}..{target.max_stages} capable nodes holds contiguous "
                            "layer ranges in the memory their profiles (or declared figures) leave",
                            d.NO_FEASIBLE_PLACEMENT)
    key = make_route_key(model.model_snapshot, measured.route_stages(tables, placement.nodes, placement.cuts))
    calibration_id = ""
    if target.mode == "deployment":
        problems = measured.deployment_problems(tables, book, placement.nodes, placement.cuts, key, now_ns)
        if problems:
            raise DeploymentRefused(problems)
        found = book.calibration_record(key)
        calibration_id = found.record_id if found else ""
    stages = [_measured_stage(tables, placement, i) for i in range(len(placement.nodes))]
    names = [n.name for n in tables.nodes]
    plan_ = _assemble(tables.model, target, stages, method_name(len(capable)), key, calibration_id)
    return d.PlanResult(True, replace(plan_, choice=choice.describe(names) if choice else ""), tuple(rejections))


def _measured_problem(tables: measured.MeasuredTables, target: Target) -> Problem:
    return Problem(measured.service_matrix(tables), tables.link_decode_s, target.min_stages, target.max_stages)


def _stable_choice(model: ModelDescription, inventory: Inventory, nodes: tuple[Node, ...], target: Target,
                   book: ProfileBook, now_ns: int, tables: measured.MeasuredTables,
                   fastest: Placement) -> stability.Choice:
    """The fastest placement unless another within the measured spread is the previous or the
    simpler one; for a deployment, the qualified one (`stability`)."""
    low, high = (_measured_problem(measured.build_measured(model, inventory, nodes, target,
                                                           stability.bounded_book(book, side), now_ns), target)
                 for side in (stability.LOW, stability.HIGH))
    hosts, backends = [measured.host_of(n) for n in nodes], [str(n.backend) for n in nodes]
    previous = stability.previous_placement(book, model.model_snapshot, hosts, backends)
    qualified = (stability.previous_placement(book, model.model_snapshot, hosts, backends, passing_only=True)
                 if target.mode == "deployment" else None)
    return stability.choose(_measured_problem(tables, target), low, high, fastest, previous, qualified)


def _measured_stage(t: measured.MeasuredTables, placement: Placement, i: int) -> d.PlannedStage:
    v = placement.nodes[i]
    node = t.nodes[v]
    a, b = placement.cuts[i], placement.cuts[i + 1]
    nxt = placement.nodes[i + 1] if i + 1 < len(placement.nodes) else None
    prev = placement.nodes[i - 1] if i > 0 else None
    weights, kv, activation = measured.stage_memory(t, v, a, b)
    decode, prefill = measured.stage_costs(t, v, a, b, nxt)
    reserve = t.costs[v].reserve_bytes
    memory = weights + kv + activation + reserve
    return d.PlannedStage(
        stage_index=i, node=node.name, backend=node.backend, build=node.build, layer_start=a, layer_end=b,
        owns_embeddings=a == 0, owns_head=b == t.num_layers, weight_bytes=weights, kv_bytes=kv,
        activation_bytes=activation, reserve_bytes=reserve, node_memory_bytes=node.memory_bytes,
        decode=decode, prefill=prefill, terms=measured.stage_terms(t, v, a, b, nxt, prev, decode, memory),
        host=measured.host_of(node), max_activations=node.activations)


def _stage_content(s: d.PlannedStage) -> dict[str, object]:
    """A stage's part of the plan hash: its placement and what it runs. A MAX stage's activations
    count (another mode is another compiled graph); they are left out when empty, so a plan without
    MAX stages keeps the hash it had before the field existed."""
    content: dict[str, object] = {
        "node": s.node, "backend": s.backend, "build": s.build, "layer_start": s.layer_start,
        "layer_end_exclusive": s.layer_end, "owns_embeddings": s.owns_embeddings, "owns_head": s.owns_head}
    if s.max_activations:
        content["max_activations"] = s.max_activations
    return content


def _assemble(model: ModelDescription, target: Target, stages: list[d.PlannedStage], method: str,
              route_key: str = "", calibration_id: str = "") -> d.Plan:
    microbatches = math.ceil(target.concurrency / target.microbatch_rows)
    stages, bottleneck, cycle = _with_queueing(stages, microbatches)
    content: dict[str, object] = {
        "model_snapshot": model.model_snapshot,
        "mode": target.mode,
        "target": asdict(target),
        "stages": [_stage_content(s) for s in stages],
    }
    if route_key:
        content["route_key"] = route_key
    plan_id, plan_hash = d.plan_identity(content)
    ids = tuple(dict.fromkeys(rid for s in stages for t in s.terms for rid in t.record_ids))
    return d.Plan(
        plan_id=plan_id, plan_hash=plan_hash, mode=target.mode, objective=target.objective,
        model_snapshot=model.model_snapshot, method=method, stages=tuple(stages),
        predictions=_predictions(stages, target, bottleneck, cycle, microbatches),
        evidence_ids=ids + ((calibration_id,) if calibration_id else ()), route_key=route_key,
        calibration_id=calibration_id,
    )
