"""Protobuf <-> planner domain values. Protobuf messages stop here."""

from __future__ import annotations

from fornax.common.v1 import common_pb2 as common
from fornax.evidence_registry.v1 import evidence_registry_pb2 as registry_pb
from fornax.planner.v1 import planner_pb2 as pb
from libs.common.kinds import Backend, DType
from libs.common.proto import BACKEND_FROM_PB, BACKEND_TO_PB, DTYPE_TO_PB, backend_from_pb, dtype_from_pb
from libs.service.errors import InvalidArgument
from services.planner import domain as d
from services.planner.inventory import (
    DEFAULT_MAX_STAGES,
    EvidenceRef,
    Inventory,
    Link,
    Node,
    Target,
    check_max_activations,
    validate_target,
)
from services.planner.model import LayerCost, ModelDescription
from services.planner.profiles import ProfileRecordInput

OBJECTIVES = {"throughput": pb.OBJECTIVE_THROUGHPUT, "latency": pb.OBJECTIVE_LATENCY}
OBJECTIVES_BACK = {v: k for k, v in OBJECTIVES.items()}
MODES = {"exploratory": pb.PLAN_MODE_EXPLORATORY, "deployment": pb.PLAN_MODE_DEPLOYMENT}
MODES_BACK = {v: k for k, v in MODES.items()}
RECORD_TYPES = {
    "model": registry_pb.RECORD_TYPE_MODEL, "capability": registry_pb.RECORD_TYPE_CAPABILITY,
    "measurement": registry_pb.RECORD_TYPE_MEASUREMENT, "calibration": registry_pb.RECORD_TYPE_CALIBRATION,
    "route": registry_pb.RECORD_TYPE_ROUTE, "qualification": registry_pb.RECORD_TYPE_QUALIFICATION,
}
RECORD_TYPES_BACK = {v: k for k, v in RECORD_TYPES.items()}


BAD_ENUM = "BAD_ENUM"


def _enum(table: dict, value: int, field: str) -> str:
    if value not in table:
        raise InvalidArgument(f"unsupported or unspecified value {value}", reason=BAD_ENUM, field=field)
    return table[value]


def _evidence(items, field: str) -> tuple[EvidenceRef, ...]:
    refs = []
    for i, x in enumerate(items):
        if not x.record_id:
            raise InvalidArgument("record_id is required", field=f"{field}[{i}].record_id")
        kind = _enum(RECORD_TYPES_BACK, x.type, f"{field}[{i}].type")
        refs.append(EvidenceRef(x.record_id, kind, x.expected_blob_sha256))
    return tuple(refs)


def _evidence_to_proto(refs: tuple[EvidenceRef, ...]) -> list[pb.EvidenceRef]:
    return [pb.EvidenceRef(record_id=r.record_id, type=RECORD_TYPES[r.record_type], expected_blob_sha256=r.sha256)
            for r in refs]


def _refuse_untyped(ids, field: str) -> None:
    if len(ids):
        raise InvalidArgument("untyped evidence ids are not accepted; use the typed evidence field",
                              reason="UNTYPED_EVIDENCE", field=field)


def model_from_proto(m: pb.ModelDescription) -> ModelDescription:
    if not m.layers:
        raise InvalidArgument("the model has no layers", field="model.layers")
    if m.hidden_size == 0 or m.vocab_size == 0:
        raise InvalidArgument("hidden_size and vocab_size must be positive", field="model.hidden_size")
    for i, x in enumerate(m.layers):
        if x.index != i:
            raise InvalidArgument(f"layer {i} carries index {x.index}", field=f"model.layers[{i}].index")
        if x.dense_weight_bytes > x.weight_bytes:
            raise InvalidArgument("dense bytes exceed the layer's bytes", field=f"model.layers[{i}].dense_weight_bytes")
    layers = tuple(
        LayerCost(
            index=x.index,
            is_moe=x.is_moe,
            weight_bytes=x.weight_bytes,
            dense_weight_bytes=x.dense_weight_bytes,
            flops_per_token=x.flops_per_token,
            attention_flops_per_context_token=x.attention_flops_per_context_token,
            kv_bytes_per_token=x.kv_bytes_per_token,
            scratch_bytes_per_row=x.scratch_bytes_per_row,
            kv_scale_bytes_per_block=x.kv_scale_bytes_per_block,
        )
        for x in m.layers
    )
    if m.experts_per_token > m.routed_experts:
        raise InvalidArgument("experts_per_token exceeds routed_experts", field="model.experts_per_token")
    return ModelDescription(
        model_snapshot=m.model_snapshot, hidden_size=m.hidden_size, vocab_size=m.vocab_size, layers=layers,
        embedding_bytes=m.embedding_bytes, head_bytes=m.head_bytes, tied_embeddings=m.tied_embeddings,
        routed_experts=m.routed_experts, experts_per_token=m.experts_per_token, shared_experts=m.shared_experts,
        expert_bytes=m.expert_bytes, weight_dtype=dtype_from_pb(m.weight_dtype, "model.weight_dtype", reason=BAD_ENUM),
        required_operations=tuple(m.required_operations), weights_policy=m.weights_policy,
        weight_formats=tuple((_backend_name(f.backend, "model.weight_formats.backend"), tuple(f.formats))
                             for f in m.weight_formats),
    )


def model_to_proto(m: ModelDescription) -> pb.ModelDescription:
    return pb.ModelDescription(
        model_snapshot=m.model_snapshot, hidden_size=m.hidden_size, vocab_size=m.vocab_size,
        layers=[pb.LayerDescription(
            index=x.index, is_moe=x.is_moe, weight_bytes=x.weight_bytes,
            active_weight_bytes_per_token=x.active_weight_bytes_per_token(m.expert_bytes, m.experts_per_token),
            flops_per_token=x.flops_per_token, kv_bytes_per_token=x.kv_bytes_per_token,
            dense_weight_bytes=x.dense_weight_bytes,
            attention_flops_per_context_token=x.attention_flops_per_context_token,
            scratch_bytes_per_row=x.scratch_bytes_per_row,
            kv_scale_bytes_per_block=x.kv_scale_bytes_per_block) for x in m.layers],
        embedding_bytes=m.embedding_bytes, head_bytes=m.head_bytes, routed_experts=m.routed_experts,
        experts_per_token=m.experts_per_token, shared_experts=m.shared_experts, expert_bytes=m.expert_bytes,
        weight_dtype=DTYPE_TO_PB[m.weight_dtype], required_operations=list(m.required_operations),
        tied_embeddings=m.tied_embeddings, weights_policy=m.weights_policy,
        weight_formats=[pb.BackendWeightFormats(backend=BACKEND_TO_PB[Backend(b)], formats=list(f))
                        for b, f in m.weight_formats],
    )


def _backend_name(value: int, field: str) -> str:
    return str(backend_from_pb(value, field, reason=BAD_ENUM))


def _node_from_proto(n: pb.Node, i: int) -> Node:
    at = f"inventory.nodes[{i}]"
    if not n.name:
        raise InvalidArgument("node name is required", field=f"{at}.name")
    for name in ("memory_bytes", "compute_flops", "memory_bandwidth_bytes_per_s"):
        if not getattr(n, name) > 0:
            raise InvalidArgument("must be positive", field=f"{at}.{name}")
    _refuse_untyped(n.evidence_record_ids, f"{at}.evidence_record_ids")
    backend = backend_from_pb(n.backend, f"{at}.backend", reason=BAD_ENUM)
    return Node(
        name=n.name,
        backend=backend,
        memory_bytes=n.memory_bytes,
        compute_flops=n.compute_flops,
        memory_bandwidth_bytes_per_s=n.memory_bandwidth_bytes_per_s,
        dtypes=tuple(dtype_from_pb(x, f"{at}.dtypes", reason=BAD_ENUM) for x in n.dtypes),
        operations=tuple(n.operations),
        build=n.build,
        reserve_bytes=n.reserve_bytes,
        evidence=_evidence(n.evidence, f"{at}.evidence"),
        host=n.host,
        weight_formats=tuple(n.weight_formats),
        max_activations=check_max_activations(n.max_activations, backend, f"{at}.max_activations"),
    )


def _link_from_proto(x: pb.Link, i: int, names: set[str]) -> Link:
    at = f"inventory.links[{i}]"
    for side in ("from_node", "to_node"):
        if getattr(x, side) not in names:
            raise InvalidArgument(f"unknown node {getattr(x, side)!r}", field=f"{at}.{side}")
    if x.from_node == x.to_node:
        raise InvalidArgument("a link joins two different nodes", field=f"{at}.to_node")
    if not x.bandwidth_bytes_per_s > 0:
        raise InvalidArgument("must be positive", field=f"{at}.bandwidth_bytes_per_s")
    _refuse_untyped(x.evidence_record_ids, f"{at}.evidence_record_ids")
    return Link(x.from_node, x.to_node, x.bandwidth_bytes_per_s, x.latency_ns, _evidence(x.evidence, f"{at}.evidence"))


def inventory_from_request(request: pb.CreatePlanRequest) -> Inventory:
    inv = request.inventory
    if not inv.nodes:
        raise InvalidArgument("the inventory has no nodes", field="inventory.nodes")
    nodes = tuple(_node_from_proto(n, i) for i, n in enumerate(inv.nodes))
    names = {n.name for n in nodes}
    if len(names) != len(nodes):
        raise InvalidArgument("node names must be unique", field="inventory.nodes")
    _refuse_untyped(request.model_evidence_record_ids, "model_evidence_record_ids")
    return Inventory(
        nodes=nodes, links=tuple(_link_from_proto(x, i, names) for i, x in enumerate(inv.links)),
        model_evidence=_evidence(request.model_evidence, "model_evidence"),
    )


def inventory_to_request(inventory: Inventory, request: pb.CreatePlanRequest) -> None:
    for n in inventory.nodes:
        request.inventory.nodes.append(pb.Node(
            name=n.name, backend=BACKEND_TO_PB[n.backend], memory_bytes=n.memory_bytes, compute_flops=n.compute_flops,
            memory_bandwidth_bytes_per_s=n.memory_bandwidth_bytes_per_s, dtypes=[DTYPE_TO_PB[x] for x in n.dtypes],
            operations=list(n.operations), build=n.build, reserve_bytes=n.reserve_bytes,
            evidence=_evidence_to_proto(n.evidence), host=n.host, weight_formats=list(n.weight_formats),
            max_activations=n.max_activations))
    for x in inventory.links:
        request.inventory.links.append(pb.Link(
            from_node=x.from_node, to_node=x.to_node, bandwidth_bytes_per_s=x.bandwidth_bytes_per_s,
            latency_ns=x.latency_ns, evidence=_evidence_to_proto(x.evidence)))
    request.model_evidence.extend(_evidence_to_proto(inventory.model_evidence))


def profiles_from_request(request: pb.CreatePlanRequest) -> list[ProfileRecordInput] | None:
    """None when the request does not ask to plan from profiles."""
    if not request.HasField("profiles"):
        return None
    out = []
    for i, r in enumerate(request.profiles.records):
        if not r.record_id:
            raise InvalidArgument("record_id is required", field=f"profiles.records[{i}].record_id")
        kind = _enum(RECORD_TYPES_BACK, r.type, f"profiles.records[{i}].type")
        out.append(ProfileRecordInput(r.record_id, kind, r.blob, tuple(sorted(r.labels.items())),
                                      r.evidence_class))
    return out


def profiles_to_request(records: list[ProfileRecordInput], request: pb.CreatePlanRequest) -> None:
    request.profiles.SetInParent()
    for r in records:
        request.profiles.records.append(pb.ProfileRecord(
            record_id=r.record_id, type=RECORD_TYPES[r.record_type], blob=r.blob, labels=dict(r.labels),
            evidence_class=r.evidence_class))


def target_from_proto(t: pb.Target) -> Target:
    """Unset fields take the documented defaults: exploratory, throughput, bf16 boundaries."""
    target = Target(
        context_tokens=t.context_tokens,
        concurrency=t.concurrency,
        objective=_enum(OBJECTIVES_BACK, t.objective, "target.objective") if t.objective else "throughput",
        min_stages=t.min_stages or 1,
        max_stages=t.max_stages or DEFAULT_MAX_STAGES,
        mode=_enum(MODES_BACK, t.mode, "target.mode") if t.mode else "exploratory",
        boundary_dtype=dtype_from_pb(t.boundary_dtype, "target.boundary_dtype", reason=BAD_ENUM)
        if t.boundary_dtype
        else DType.BF16,
        prefill_tokens=t.prefill_tokens or Target.prefill_tokens,
        decode_microbatch_rows=t.decode_microbatch_rows,
    )
    return validate_target(target)


def target_to_proto(t: Target) -> pb.Target:
    return pb.Target(
        context_tokens=t.context_tokens,
        concurrency=t.concurrency,
        objective=OBJECTIVES[t.objective],
        min_stages=t.min_stages,
        max_stages=t.max_stages,
        mode=MODES[t.mode],
        boundary_dtype=DTYPE_TO_PB[t.boundary_dtype],
        prefill_tokens=t.prefill_tokens,
        decode_microbatch_rows=t.decode_microbatch_rows,
    )


def _cost(c: d.StageCost) -> pb.StageCost:
    return pb.StageCost(compute_s=c.compute_s, pack_s=c.pack_s, wire_s=c.wire_s, unpack_s=c.unpack_s,
                        queue_s=c.queue_s, exposed_wait_s=c.exposed_wait_s)


def _cost_back(c: pb.StageCost) -> d.StageCost:
    return d.StageCost(c.compute_s, c.pack_s, c.wire_s, c.unpack_s, c.queue_s, c.exposed_wait_s)


def plan_to_proto(p: d.Plan) -> pb.Plan:
    return pb.Plan(
        plan_id=p.plan_id, plan_hash=p.plan_hash, mode=MODES[p.mode], method=p.method,
        objective=OBJECTIVES[p.objective], model_snapshot=p.model_snapshot, label=p.label,
        stages=[pb.PlannedStage(
            stage_index=s.stage_index, node=s.node, backend=BACKEND_TO_PB[Backend(s.backend)], build=s.build,
            layer_range=common.LayerRange(layer_start=s.layer_start, layer_end_exclusive=s.layer_end),
            owns_embeddings=s.owns_embeddings, owns_head=s.owns_head, weight_bytes=s.weight_bytes,
            kv_bytes=s.kv_bytes, activation_bytes=s.activation_bytes, memory_bytes=s.memory_bytes,
            reserve_bytes=s.reserve_bytes, decode_cost=_cost(s.decode), prefill_cost=_cost(s.prefill),
            terms=[pb.TermEvidence(term=t.term, evidence_class=t.evidence_class, record_ids=list(t.record_ids),
                                   note=t.note, value=t.value, unit=t.unit) for t in s.terms],
            host=s.host, max_activations=s.max_activations,
        ) for s in p.stages],
        evidence_record_ids=list(p.evidence_ids), route_key=p.route_key, calibration_record_id=p.calibration_id,
        placement_choice=p.choice,
        predictions=[common.Figure(name=x.name, value=x.value, unit=x.unit, prediction=True,
                                   evidence_class=common.EVIDENCE_CLASS_PHYSICAL
                                   if p.from_profiles and not p.declared_terms else common.EVIDENCE_CLASS_REFERENCE,
                                   model_snapshot=p.model_snapshot)
                     for x in p.predictions],
    )


def plan_from_proto(p: pb.Plan) -> d.Plan:
    """For clients (the CLI, tests); node memory is not carried on the wire and reads as 0."""
    return d.Plan(
        plan_id=p.plan_id, plan_hash=p.plan_hash, mode=MODES_BACK[p.mode], objective=OBJECTIVES_BACK[p.objective],
        model_snapshot=p.model_snapshot, method=p.method,
        stages=tuple(d.PlannedStage(
            stage_index=s.stage_index, node=s.node, backend=BACKEND_FROM_PB[s.backend], build=s.build,
            layer_start=s.layer_range.layer_start, layer_end=s.layer_range.layer_end_exclusive,
            owns_embeddings=s.owns_embeddings, owns_head=s.owns_head, weight_bytes=s.weight_bytes,
            kv_bytes=s.kv_bytes, activation_bytes=s.activation_bytes, reserve_bytes=s.reserve_bytes,
            node_memory_bytes=0, decode=_cost_back(s.decode_cost), prefill=_cost_back(s.prefill_cost),
            terms=tuple(d.TermEvidence(t.term, t.evidence_class, tuple(t.record_ids), t.note, t.value, t.unit)
                        for t in s.terms),
            host=s.host, max_activations=s.max_activations,
        ) for s in p.stages),
        predictions=tuple(d.Prediction(x.name, x.value, x.unit) for x in p.predictions),
        evidence_ids=tuple(p.evidence_record_ids), route_key=p.route_key, calibration_id=p.calibration_record_id,
        choice=p.placement_choice,
    )


def result_to_proto(r: d.PlanResult) -> pb.CreatePlanResponse:
    response = pb.CreatePlanResponse(
        feasible=r.feasible, infeasibility=r.infeasibility, infeasibility_reason=r.infeasibility_reason,
        shortfall_bytes=r.shortfall_bytes,
        rejections=[pb.Rejection(subject=x.subject, reason=x.reason, detail=x.detail, required=x.required,
                                 available=x.available) for x in r.rejections],
        evidence_failures=[pb.EvidenceFailure(record_id=x.record_id, subject=x.subject, reason=x.reason,
                                              detail=x.detail) for x in r.evidence_failures],
    )
    if r.plan is not None:
        response.plan.CopyFrom(plan_to_proto(r.plan))
    return response


def result_from_proto(r: pb.CreatePlanResponse) -> d.PlanResult:
    return d.PlanResult(
        feasible=r.feasible, plan=plan_from_proto(r.plan) if r.HasField("plan") else None,
        rejections=tuple(d.Rejection(x.subject, x.reason, x.detail, x.required, x.available) for x in r.rejections),
        infeasibility=r.infeasibility, infeasibility_reason=r.infeasibility_reason, shortfall_bytes=r.shortfall_bytes,
        evidence_failures=tuple(d.EvidenceFailure(x.record_id, x.subject, x.reason, x.detail)
                                for x in r.evidence_failures),
    )
