from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from services.planner import domain as d
from services.planner.costs import build_workload, expected_distinct_experts
from services.planner.evidence import Resolution
from services.planner.inventory import EvidenceRef, Inventory, Link, Target, load_inventory_file
from services.planner.planner import EvidenceUnavailable, plan
from tests.unit.planner.factories import ALL_OPERATIONS, GIB, full_mesh, node, synthetic_model, tiny_model

EXAMPLES = Path(__file__).resolve().parents[3] / "services" / "planner" / "examples"


def lite():
    return synthetic_model(27, experts=64, top_k=6)


def test_mixed_fleet_example_rejects_the_fp32_only_node_and_plans_the_rest():
    loaded = load_inventory_file(EXAMPLES / "mixed_fleet.yaml")
    result = plan(lite(), loaded.inventory, loaded.target)
    assert result.feasible
    assert [r.subject for r in result.rejections] == ["cpu-server"]
    assert result.rejections[0].reason == d.MISSING_DTYPE
    p = result.plan
    assert p.mode == "exploratory"
    assert {s.node for s in p.stages} <= {"gpu-box", "mac"}
    assert p.plan_hash.startswith("sha256:") and len(p.plan_hash) == 71
    assert p.plan_id == "plan-" + p.plan_hash[7:23]
    assert p.prediction("decode_tokens_per_s") > 0 and p.prediction("ttft_s") > 0
    assert 0 <= p.prediction("bubble_fraction") < 1


def test_plan_hash_is_deterministic_and_covers_the_target():
    model, inv = tiny_model(), full_mesh(node("a"), node("b"))
    first = plan(model, inv, Target()).plan
    assert plan(model, inv, Target()).plan.plan_hash == first.plan_hash
    assert plan(model, inv, Target(context_tokens=1024)).plan.plan_hash != first.plan_hash


def test_every_rejected_node_gets_its_first_failing_reason_with_numbers():
    model = tiny_model()
    inv = full_mesh(
        node("ok"),
        node("no-bf16", dtypes=("fp32",)),
        node("no-moe", operations=tuple(o for o in ALL_OPERATIONS if o != "moe_router_softmax_topk")),
        node("tiny", memory_gib=0.001),
        node("no-bf16-and-tiny", dtypes=("fp16",), memory_gib=0.001),
    )
    result = plan(model, inv, Target())
    reasons = {r.subject: r for r in result.rejections}
    assert reasons["no-bf16"].reason == d.MISSING_DTYPE
    assert reasons["no-moe"].reason == d.MISSING_OPERATION and "moe_router_softmax_topk" in reasons["no-moe"].detail
    assert reasons["tiny"].reason == d.INSUFFICIENT_MEMORY
    assert reasons["tiny"].required > reasons["tiny"].available == int(0.001 * GIB)
    assert reasons["no-bf16-and-tiny"].reason == d.MISSING_DTYPE  # first failing check only
    assert result.feasible and {s.node for s in result.plan.stages} == {"ok"}


def test_missing_routes_are_rejected_and_block_multi_stage_plans():
    model = tiny_model(layers=4)
    a, b = node("a"), node("b")
    result = plan(model, Inventory(nodes=(a, b)), Target(min_stages=2, max_stages=2))
    assert [(r.subject, r.reason) for r in result.rejections] == [("a->b", d.NO_ROUTE)]
    assert not result.feasible and result.infeasibility_reason == d.NO_FEASIBLE_PLACEMENT


def test_two_node_shortfall_is_the_aggregate_gap():
    model = tiny_model(layers=8, hidden=512, moe_intermediate=256)
    work = build_workload(model, Target(max_stages=2))
    need_two = (model.total_weight_bytes + int(work.layer_kv_bytes.sum()) + 2 * work.activation_bytes
                + work.logits_bytes)
    each = int(0.4 * need_two)
    result = plan(model, full_mesh(node("a", memory_gib=each / GIB), node("b", memory_gib=each / GIB)),
                  Target(max_stages=2))
    assert not result.feasible and result.infeasibility_reason == d.INSUFFICIENT_MEMORY
    assert result.rejections == ()
    assert result.shortfall_bytes == need_two - 2 * each
    assert "short by" in result.infeasibility


def test_decode_reads_only_the_active_experts():
    model = tiny_model(layers=3, experts=64, top_k=2, dense_layers=1)
    work = build_workload(model, Target(concurrency=1, context_tokens=100, decode_microbatch_rows=1))
    moe = model.layers[1]
    expected = moe.dense_weight_bytes + 2 * model.expert_bytes + moe.kv_bytes_per_token * 100
    assert work.decode_bytes[1] == pytest.approx(expected)
    assert work.decode_bytes[1] < moe.weight_bytes / 4
    assert expected_distinct_experts(64, 2, 10_000) == pytest.approx(64)
    fast_sparse = plan(model, full_mesh(node("a")), Target(concurrency=1)).plan.prediction("decode_tokens_per_s")
    dense_all = plan(tiny_model(layers=3, experts=64, top_k=64, dense_layers=1), full_mesh(node("a")),
                     Target(concurrency=1)).plan.prediction("decode_tokens_per_s")
    assert fast_sparse > 2 * dense_all


def test_links_steer_the_node_order():
    model = synthetic_model(8, experts=8, top_k=2, hidden=2048, moe_intermediate=1024, vocab=1024)
    nodes = [node(x, memory_gib=0.6) for x in "abc"]  # needs all three
    slow, fast = 1e6, 100e9
    links = (Link("a", "b", fast, 0), Link("b", "c", fast, 0), Link("a", "c", slow, 10_000_000))
    result = plan(model, Inventory(nodes=tuple(nodes), links=links), Target(max_stages=3))
    order = [s.node for s in result.plan.stages]
    assert order in (["a", "b", "c"], ["c", "b", "a"])  # the slow a<->c route is never a boundary
    wires = [s.decode.wire_s for s in result.plan.stages]
    assert wires[-1] == 0 and all(0 < w < 1e-3 for w in wires[:-1])


def test_cost_terms_stay_separate_and_add_up_to_the_cycle():
    result = plan(tiny_model(layers=8),
                  full_mesh(node("a", memory_gib=0.02), node("b", compute=20e12, bandwidth=200e9)),
                  Target(concurrency=12, max_stages=2, min_stages=2))
    p = result.plan
    cycle = p.prediction("decode_cycle_s")
    passes = sum(s.decode.service_s + s.decode.wire_s + s.decode.queue_s for s in p.stages)
    assert passes == pytest.approx(cycle)
    first, last = p.stages
    assert first.decode.unpack_s == 0 and first.decode.pack_s > 0 and first.decode.wire_s > 0
    assert last.decode.pack_s == 0 and last.decode.unpack_s > 0 and last.decode.wire_s == 0
    period = cycle / p.prediction("decode_microbatches")
    assert min(s.decode.exposed_wait_s for s in p.stages) == pytest.approx(
        max(period - p.prediction("bottleneck_s"), 0), abs=1e-12)


class FakeRegistry:
    def __init__(self, failing: dict[str, str] | None = None):
        self.failing = failing or {}
        self.seen: list[EvidenceRef] = []

    def resolve(self, refs):
        self.seen.extend(refs)
        return [Resolution(r.record_id, r.record_id not in self.failing, self.failing.get(r.record_id, ""), "")
                for r in refs]


def _deployment_inventory():
    cap = lambda i: (EvidenceRef(f"cap-{i}", "capability"),)  # noqa: E731
    a, b = node("a", evidence=cap("a")), node("b", evidence=cap("b"))
    link = Link("a", "b", 10e9, 1000, evidence=(EvidenceRef("route-ab", "route", "sha256:" + "1" * 64),))
    return Inventory(nodes=(a, b), links=(link,), model_evidence=(EvidenceRef("model-1", "model"),))


def test_deployment_mode_plans_only_when_every_record_resolves():
    inv, registry = _deployment_inventory(), FakeRegistry()
    target = Target(mode="deployment", min_stages=2, max_stages=2)
    result = plan(tiny_model(), inv, target, registry)
    assert result.feasible and result.plan.mode == "deployment"
    assert {r.record_id for r in registry.seen} == {"cap-a", "cap-b", "route-ab", "model-1"}
    assert any(r.sha256 == "sha256:" + "1" * 64 for r in registry.seen)


def test_deployment_mode_fails_closed_naming_each_failing_record():
    registry = FakeRegistry({"cap-b": "REVOKED", "model-1": "EXPIRED"})
    result = plan(tiny_model(), _deployment_inventory(), Target(mode="deployment", min_stages=2), registry)
    assert not result.feasible and result.plan is None
    assert result.infeasibility_reason == d.EVIDENCE_UNRESOLVED
    failures = {(f.record_id, f.subject, f.reason) for f in result.evidence_failures}
    assert failures == {("cap-b", "b", "REVOKED"), ("model-1", "model", "EXPIRED")}


def test_deployment_mode_plans_only_over_evidenced_nodes_and_routes():
    inv = _deployment_inventory()
    c = node("c", compute=1e15, bandwidth=1e13)  # fastest, but references no capability record
    bare = Inventory(nodes=(*inv.nodes, c), links=(*inv.links, Link("a", "c", 10e9, 1000)),
                     model_evidence=inv.model_evidence)
    result = plan(tiny_model(), bare, Target(mode="deployment", min_stages=2), FakeRegistry())
    assert result.feasible and [s.node for s in result.plan.stages] in (["a", "b"], ["b", "a"])
    assert {(r.subject, r.reason) for r in result.rejections} == {("c", d.MISSING_EVIDENCE)}
    assert plan(tiny_model(), bare, Target(min_stages=2)).plan.stages[0].node == "c"  # exploratory uses c
    routes_bare = Inventory(nodes=inv.nodes, links=(replace(inv.links[0], evidence=()),),
                            model_evidence=inv.model_evidence)
    result = plan(tiny_model(), routes_bare, Target(mode="deployment", min_stages=2), FakeRegistry())
    assert not result.feasible and ("a->b", d.MISSING_EVIDENCE) in {(r.subject, r.reason) for r in result.rejections}
    assert result.infeasibility_reason == d.NO_FEASIBLE_PLACEMENT


def test_deployment_mode_requires_a_model_record():
    inv = replace(_deployment_inventory(), model_evidence=())
    result = plan(tiny_model(), inv, Target(mode="deployment", min_stages=2), FakeRegistry())
    assert not result.feasible and result.plan is None
    assert [(f.subject, f.reason) for f in result.evidence_failures] == [("model", d.MISSING_EVIDENCE)]


def test_deployment_mode_without_a_registry_is_refused():
    with pytest.raises(EvidenceUnavailable) as err:
        plan(tiny_model(), _deployment_inventory(), Target(mode="deployment"))
    assert err.value.reason == "NO_EVIDENCE_REGISTRY"


def test_latency_objective_prefers_one_fast_node_over_a_pipeline():
    model = tiny_model(layers=8)
    inv = full_mesh(node("a"), node("b"), latency_ns=1_000_000)
    lat = plan(model, inv, Target(objective="latency")).plan
    assert len(lat.stages) == 1
    assert np.isfinite(lat.prediction("ttft_s"))
