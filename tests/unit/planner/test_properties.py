"""Invariants of the planner, checked with hypothesis."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.bench.planner import random_fleet, synthetic_model
from services.planner import domain as d
from services.planner.costs import build_tables, stage_memory
from services.planner.inventory import Target
from services.planner.planner import plan
from tests.unit.planner.factories import GIB, full_mesh, node, tiny_model

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(layers=st.integers(4, 24), factor=st.floats(2.0, 10.0), slow_first=st.booleans())
def test_slow_node_gets_fewer_layers(layers, factor, slow_first):
    model = synthetic_model(layers, experts=8, top_k=2, hidden=512, moe_intermediate=512, vocab=256, dense_layers=0)
    fast = node("fast", compute=100e12, bandwidth=1e12)
    slow = node("slow", compute=100e12 / factor, bandwidth=1e12 / factor)
    inv = full_mesh(*((slow, fast) if slow_first else (fast, slow)), bandwidth=100e9, latency_ns=0)
    result = plan(model, inv, Target(context_tokens=128, concurrency=2, min_stages=2, max_stages=2))
    by_node = {s.node: s.layer_end - s.layer_start for s in result.plan.stages}
    assert by_node["slow"] < by_node["fast"]


@SETTINGS
@given(seed=st.integers(0, 2**31), n=st.integers(1, 5), layers=st.integers(2, 16), stages=st.integers(1, 4))
def test_adding_a_node_never_lowers_predicted_throughput(seed, n, layers, stages):
    rng = np.random.default_rng(seed)
    model = synthetic_model(layers, experts=16, top_k=2, hidden=512, moe_intermediate=256, vocab=2048)
    total = model.total_weight_bytes / GIB
    fleet = random_fleet(rng, n + 1, (0.3 * total, 1.5 * total), link_probability=0.8)
    # Concurrency keeps >= 2*max_stages-1 microbatches in flight: the pipeline-full regime.
    target = Target(context_tokens=256, concurrency=4 * stages, max_stages=stages)
    smaller = plan(model, fleet.without(f"n{n}"), target)
    larger = plan(model, fleet, target)
    if smaller.feasible:
        assert larger.feasible
        before = smaller.plan.prediction("decode_tokens_per_s")
        assert larger.plan.prediction("decode_tokens_per_s") >= before * (1 - 1e-9)


@SETTINGS
@given(seed=st.integers(0, 2**31), n=st.integers(1, 7), layers=st.integers(1, 30))
def test_layers_placed_once_contiguously_and_memory_never_exceeded(seed, n, layers):
    rng = np.random.default_rng(seed)
    model = synthetic_model(layers, experts=16, top_k=4, hidden=512, moe_intermediate=256, vocab=2048)
    total = model.total_weight_bytes / GIB
    fleet = random_fleet(rng, n, (0.2 * total, 1.2 * total), link_probability=0.7)
    target = Target(context_tokens=int(rng.integers(16, 4096)), concurrency=int(rng.integers(1, 32)), max_stages=n)
    result = plan(model, fleet, target)
    if not result.feasible:
        assert result.infeasibility and result.infeasibility_reason
        return
    stages = result.plan.stages
    covered = [i for s in stages for i in range(s.layer_start, s.layer_end)]
    assert covered == list(range(layers))
    assert all(s.layer_start < s.layer_end for s in stages)
    assert stages[0].owns_embeddings and stages[-1].owns_head
    assert len({s.node for s in stages}) == len(stages)
    tables = build_tables(model, fleet, fleet.nodes, target)
    for s in stages:
        assert s.memory_bytes <= s.node_memory_bytes
        memory = stage_memory(tables, s.layer_start, s.layer_end)
        assert s.weight_bytes + s.kv_bytes + s.activation_bytes == memory.total_bytes


@SETTINGS
@given(fraction=st.floats(0.3, 0.99), reserve_gib=st.floats(0.0, 0.5), context=st.integers(16, 8192))
def test_too_big_model_is_infeasible_with_the_exact_shortfall(fraction, reserve_gib, context):
    model = tiny_model(layers=6, hidden=512, moe_intermediate=256)
    target = Target(context_tokens=context, concurrency=4, max_stages=1)
    probe = build_tables(model, full_mesh(node("probe")), (node("probe"),), target)
    whole = stage_memory(probe, 0, model.num_layers).total_bytes
    reserve = int(reserve_gib * GIB)
    memory = int(fraction * whole) + reserve
    one = node("only", memory_gib=memory / GIB, reserve_gib=reserve / GIB)
    result = plan(model, full_mesh(one), target)
    assert not result.feasible and result.plan is None
    smallest = min(stage_memory(probe, a, a + 1).total_bytes for a in range(model.num_layers))
    if smallest + one.reserve_bytes > one.memory_bytes:
        assert result.infeasibility_reason == d.NO_CAPABLE_NODE
        assert result.rejections[0].reason == d.INSUFFICIENT_MEMORY
        return
    assert result.infeasibility_reason == d.INSUFFICIENT_MEMORY
    assert result.shortfall_bytes == whole - (one.memory_bytes - one.reserve_bytes)
