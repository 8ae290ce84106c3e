from dataclasses import replace

import pytest

from fornax.planner.v1 import planner_pb2 as pb
from libs.service.errors import InvalidArgument
from services.planner import convert
from services.planner.inventory import EvidenceRef, Inventory, Link, Target
from services.planner.planner import plan
from tests.unit.planner.factories import full_mesh, node, tiny_model


def test_model_round_trips_and_reports_active_bytes():
    model = tiny_model(layers=4, dense_layers=1)
    message = convert.model_to_proto(model)
    assert convert.model_from_proto(message) == model
    moe = message.layers[2]
    assert moe.active_weight_bytes_per_token == moe.dense_weight_bytes + 2 * model.expert_bytes


def test_inventory_and_target_round_trip():
    cap = (EvidenceRef("cap-1", "capability", "sha256:" + "a" * 64),)
    base = full_mesh(node("a", evidence=cap, reserve_gib=1), node("b"))
    inv = Inventory(nodes=base.nodes, links=(Link("a", "b", 1e9, 5, (EvidenceRef("r", "route"),)),),
                    model_evidence=(EvidenceRef("m", "model"),))
    request = pb.CreatePlanRequest()
    convert.inventory_to_request(inv, request)
    assert convert.inventory_from_request(request) == inv
    target = Target(context_tokens=100, concurrency=3, objective="latency", min_stages=2, max_stages=3,
                    mode="deployment", boundary_dtype="fp32", prefill_tokens=7, decode_microbatch_rows=2)
    assert convert.target_from_proto(convert.target_to_proto(target)) == target


def test_unset_target_fields_take_documented_defaults():
    target = convert.target_from_proto(pb.Target(context_tokens=64, concurrency=1))
    assert (target.mode, target.objective, target.boundary_dtype, target.max_stages) == (
        "exploratory", "throughput", "bf16", 8)


def test_result_round_trips_through_the_response():
    result = plan(tiny_model(), full_mesh(node("a", memory_gib=0.01), node("b"), node("c", dtypes=("fp32",))),
                  Target(concurrency=4))
    back = convert.result_from_proto(convert.result_to_proto(result))
    assert back.rejections == result.rejections
    assert back.plan.plan_hash == result.plan.plan_hash
    assert [(s.node, s.layer_start, s.layer_end, s.decode, s.memory_bytes) for s in back.plan.stages] == [
        (s.node, s.layer_start, s.layer_end, s.decode, s.memory_bytes) for s in result.plan.stages]
    assert back.plan.predictions == result.plan.predictions


def test_the_placement_choice_travels_with_the_plan_and_stays_out_of_its_hash():
    result = plan(tiny_model(), full_mesh(node("a"), node("b")), Target(concurrency=4))
    chosen = replace(result.plan, choice="fastest on the medians: a[0:4] (bottleneck 1 ms, band 1..2 ms) (predictions)")
    message = convert.plan_to_proto(chosen)
    assert message.placement_choice == chosen.choice
    back = convert.plan_from_proto(message)
    assert back.choice == chosen.choice and back.plan_hash == result.plan.plan_hash


@pytest.mark.parametrize("mutate,field", [
    (lambda r: setattr(r.inventory.nodes[0], "backend", 0), "inventory.nodes[0].backend"),
    (lambda r: setattr(r.inventory.nodes[0], "memory_bytes", 0), "inventory.nodes[0].memory_bytes"),
    (lambda r: setattr(r.inventory.links[0], "to_node", "ghost"), "inventory.links[0].to_node"),
    (lambda r: r.inventory.nodes[0].evidence.add(record_id="x"), "inventory.nodes[0].evidence[0].type"),
    (lambda r: r.model_evidence_record_ids.append("x"), "model_evidence_record_ids"),
])
def test_bad_requests_name_the_field(mutate, field):
    request = pb.CreatePlanRequest()
    convert.inventory_to_request(full_mesh(node("a"), node("b")), request)
    mutate(request)
    with pytest.raises(InvalidArgument) as err:
        convert.inventory_from_request(request)
    assert err.value.field == field
