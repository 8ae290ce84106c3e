"""fornax_planner_decisions_total counts why plans came out as they did."""

from __future__ import annotations

from prometheus_client import REGISTRY

from apps.bench.planner import synthetic_model
from services.planner.inventory import Inventory, Node, Target
from services.planner.planner import plan
from services.planner.server import record_decisions

OPS = ("embedding", "rmsnorm", "mla_attention", "rope", "swiglu", "lm_head", "moe_router_softmax_topk")


def _count(reason: str) -> float:
    return REGISTRY.get_sample_value("fornax_planner_decisions_total", {"reason": reason}) or 0.0


def test_an_infeasible_plan_counts_its_reason_and_each_rejection():
    model = synthetic_model(4, 8, 2, hidden=256)
    tiny = Node("tiny", "numpy", 1 << 20, 1e12, 1e11, ("bf16", "fp32"), OPS)
    result = plan(model, Inventory(nodes=(tiny,)), Target(context_tokens=512, concurrency=1))
    assert not result.feasible and result.rejections
    before = {r.reason: _count(r.reason) for r in result.rejections}
    top_before = _count(result.infeasibility_reason or "INFEASIBLE")
    record_decisions(result)
    assert _count(result.infeasibility_reason or "INFEASIBLE") == top_before + 1
    for reason, count in before.items():
        assert _count(reason) >= count + 1


def test_a_feasible_plan_counts_as_planned():
    model = synthetic_model(4, 8, 2, hidden=256)
    big = Node("big", "numpy", 64 << 30, 1e12, 1e11, ("bf16", "fp32"), OPS)
    result = plan(model, Inventory(nodes=(big,)), Target(context_tokens=512, concurrency=1))
    assert result.feasible
    before = _count("PLANNED")
    record_decisions(result)
    assert _count("PLANNED") == before + 1
