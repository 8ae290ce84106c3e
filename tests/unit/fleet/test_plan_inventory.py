"""A fleet file's hosts as the planner's inventory: limits as contracts, the rest as declared
estimates, and the lite fleet refusing bf16 and placing every layer in q4_k_m."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from apps.fleet.plan_inventory import (
    CONTRACT,
    DECLARED,
    RUNTIME_RESERVE_BYTES,
    FleetPlanError,
    fleet_target,
    fleet_weights,
    inventory_from_fleet,
)
from apps.fleet.spec import load_fleet_spec, parse_fleet_spec
from libs.common.kinds import Backend, DType
from libs.model.presets import preset_config
from services.planner.inventory import load_inventory_file
from services.planner.model import describe_config
from services.planner.planner import plan

ROOT = Path(__file__).resolve().parents[3]
LITE_FLEET = ROOT / "fleets" / "lite-three-hosts.yaml"
LITE_INVENTORY = ROOT / "services" / "planner" / "examples" / "lite_three_hosts.yaml"
GIB = 2**30


def _spec(hosts: list[dict], **top):
    raw = {"version": 1, "control_host": hosts[0]["name"], "hosts": hosts, **top}
    return parse_fleet_spec(raw, hashlib.sha256(b"test").hexdigest())


def _host(name: str, **fields) -> dict:
    return {"name": name, "backend": "numpy", "cpu_cores": 1, "memory_limit": "2GiB",
            "link": {"rate": "1Gbit/s"}, **fields}


def lite(policy: str):
    return describe_config(preset_config("lite", 0, 1), snapshot="sha256:" + "1" * 64, policy=policy)


def test_lite_hosts_become_nodes_with_their_limits_and_the_runtime_reserve():
    built = inventory_from_fleet(load_fleet_spec(LITE_FLEET))
    nodes = {n.name: n for n in built.inventory.nodes}
    assert list(nodes) == ["alpha", "beta", "gamma"]
    assert [nodes[h].memory_bytes for h in nodes] == [7 * GIB, 5 * GIB, 6 * GIB]
    assert all(n.reserve_bytes == RUNTIME_RESERVE_BYTES[Backend.MAX] > 0 for n in nodes.values())
    assert all(n.host == n.name and n.backend is Backend.MAX and "q4_k" in n.weight_formats for n in nodes.values())
    # a half-core quota computes and streams half as much as a whole core
    assert nodes["alpha"].compute_flops == 2 * nodes["beta"].compute_flops == 2 * nodes["gamma"].compute_flops
    assert nodes["alpha"].memory_bandwidth_bytes_per_s == 2 * nodes["beta"].memory_bandwidth_bytes_per_s
    # the hand-written inventory of the same hosts holds the same memory and reserve
    by_hand = {n.name: n for n in load_inventory_file(LITE_INVENTORY).inventory.nodes}
    assert {(n.name, n.memory_bytes, n.reserve_bytes) for n in by_hand.values()} == {
        (n.name, n.memory_bytes, n.reserve_bytes) for n in nodes.values()}


def test_each_figure_says_whether_it_is_a_contract_or_a_declared_estimate():
    built = inventory_from_fleet(load_fleet_spec(LITE_FLEET))
    kinds = {(f.subject, f.quantity): f for f in built.figures}
    assert kinds[("alpha", "memory")].evidence == CONTRACT and not kinds[("alpha", "memory")].is_prediction
    for quantity in ("reserve", "compute", "memory_bandwidth"):
        assert kinds[("beta", quantity)].evidence == DECLARED and kinds[("beta", quantity)].is_prediction
    assert kinds[("alpha->beta", "link_rate")].evidence == CONTRACT
    assert kinds[("alpha->beta", "link_latency")].evidence == DECLARED


def test_a_hop_runs_at_the_slower_link_and_waits_for_the_receivers_delay():
    spec = _spec([_host("a"), _host("b", link={"rate": "200Mbit/s", "delay": "5ms"}),
                  _host("c", stage_worker=False)])
    built = inventory_from_fleet(spec)
    assert [n.name for n in built.inventory.nodes] == ["a", "b"]  # the control-only host runs no stage
    ab, ba = built.inventory.link("a", "b"), built.inventory.link("b", "a")
    assert ab.bandwidth_bytes_per_s == ba.bandwidth_bytes_per_s == 200e6 / 8
    assert ab.latency_ns == ba.latency_ns + 5_000_000  # b's relay holds what enters b
    assert ("a->b", "link_latency", CONTRACT) in {(f.subject, f.quantity, f.evidence) for f in built.figures}


def test_a_gpu_host_is_refused_rather_than_given_cpu_figures():
    with pytest.raises(FleetPlanError) as caught:
        inventory_from_fleet(_spec([_host("a"), _host("g", device="gpu:0")]))
    assert caught.value.reason == "FLEET_NOT_PLANNABLE" and "gpu:0" in caught.value.message


def test_weights_come_from_the_override_else_the_hosts_else_fp32():
    spec = load_fleet_spec(LITE_FLEET)
    assert fleet_weights(spec, None).policy == "q4_k_m"
    overridden = fleet_weights(spec, "bf16")
    assert overridden.policy == "bf16" and "overrides" in overridden.source and "alpha q4_k_m" in overridden.source
    mixed = fleet_weights(_spec([_host("a", weights="bf16"), _host("b", weights="q4_k_m")]), None)
    assert mixed.mixed and mixed.policy == "bf16"
    assert fleet_weights(_spec([_host("a"), _host("b")]), None).policy == "fp32"


def test_the_target_takes_every_stage_host_and_the_widest_hop():
    spec = _spec([_host("a"), _host("b"), _host("c")], hops=[{"boundary_dtype": "bf16"}, {"boundary_dtype": "fp32"}])
    target = fleet_target(spec, context_tokens=1024, concurrency=8, stages=None, mode="exploratory")
    assert (target.min_stages, target.max_stages, target.boundary_dtype) == (3, 3, DType.FP32)
    assert fleet_target(spec, context_tokens=1024, concurrency=8, stages=2, mode="exploratory").max_stages == 2


def test_lite_fleet_refuses_bf16_naming_each_hosts_shortfall():
    spec = load_fleet_spec(LITE_FLEET)
    target = fleet_target(spec, context_tokens=2048, concurrency=32, stages=None, mode="exploratory")
    refused = plan(lite("bf16"), inventory_from_fleet(spec).inventory, target)
    assert not refused.feasible and refused.infeasibility_reason == "INSUFFICIENT_MEMORY"
    short = re.findall(r"(\w+) holds [\d.]+ GiB of its [\d.]+ GiB share, short by ([\d.]+) GiB", refused.infeasibility)
    assert sorted(name for name, _ in short) == ["alpha", "beta", "gamma"]
    assert all(float(gib) > 1.0 for _, gib in short)


def test_lite_fleet_places_every_layer_in_q4_k_m_with_the_most_on_alpha():
    spec = load_fleet_spec(LITE_FLEET)
    target = fleet_target(spec, context_tokens=2048, concurrency=32, stages=None, mode="exploratory")
    placed = plan(lite("q4_k_m"), inventory_from_fleet(spec).inventory, target)
    assert placed.feasible
    stages = placed.plan.stages
    assert stages[0].layer_start == 0 and stages[-1].layer_end == 27
    assert all(a.layer_end == b.layer_start for a, b in zip(stages, stages[1:], strict=False))
    layers = {s.node: s.layer_end - s.layer_start for s in stages}
    assert layers["alpha"] > max(layers["beta"], layers["gamma"])
    for s in stages:  # weights, KV for every sequence's context, buffers and the runtime all fit
        assert s.kv_bytes > 0 and s.activation_bytes > 0 and s.reserve_bytes == RUNTIME_RESERVE_BYTES[Backend.MAX]
        assert s.memory_bytes == s.weight_bytes + s.kv_bytes + s.activation_bytes + s.reserve_bytes
        assert s.memory_bytes <= s.node_memory_bytes
