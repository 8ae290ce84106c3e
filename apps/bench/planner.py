"""Synthetic instances for `fornax bench planner` and the brute-force agreement check.

Every figure produced here is a wall-clock time of the planner on this host (a physical
figure of the planner itself, not of any model execution) or an agreement fraction.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from libs.common.kinds import Backend, DType
from services.planner.bruteforce import brute_force_bottleneck
from services.planner.costs import build_tables
from services.planner.inventory import Inventory, Link, Node, Target
from services.planner.model import BASE_OPERATIONS, MOE_OPERATIONS, ModelDescription, describe_config
from services.planner.planner import plan

ALL_OPERATIONS = BASE_OPERATIONS + MOE_OPERATIONS + ("rope_yarn",)
GIB = 2**30


def synthetic_config(layers: int, experts: int, top_k: int, hidden: int = 2048, *, dense_layers: int = 1,
                     moe_intermediate: int = 1408, shared: int = 2, vocab: int = 102400) -> dict[str, Any]:
    """A DeepSeek-V2-layout config.json dict (Lite-shaped by default)."""
    return {
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "dtype": "bfloat16",
        "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": 5 * hidden,
        "moe_intermediate_size": moe_intermediate, "num_hidden_layers": layers,
        "num_attention_heads": max(hidden // 128, 1), "kv_lora_rank": 512 if hidden >= 512 else 16,
        "q_lora_rank": None, "qk_rope_head_dim": 64 if hidden >= 512 else 8,
        "qk_nope_head_dim": 128 if hidden >= 512 else 8, "v_head_dim": 128 if hidden >= 512 else 8,
        "n_routed_experts": experts, "num_experts_per_tok": top_k, "n_shared_experts": shared,
        "first_k_dense_replace": dense_layers, "rope_theta": 10000.0,
    }


def synthetic_model(layers: int, experts: int, top_k: int, **kw: Any) -> ModelDescription:
    return describe_config(synthetic_config(layers, experts, top_k, **kw), snapshot="sha256:" + "0" * 64)


def random_fleet(rng: np.random.Generator, n: int, memory_gib: tuple[float, float],
                 link_probability: float = 1.0) -> Inventory:
    nodes = tuple(
        Node(
            name=f"n{i}", backend=Backend.MAX if i % 2 == 0 else Backend.NUMPY,
            memory_bytes=int(rng.uniform(*memory_gib) * GIB),
            compute_flops=float(rng.uniform(5e12, 400e12)),
            memory_bandwidth_bytes_per_s=float(rng.uniform(50e9, 3e12)),
            dtypes=(DType.BF16, DType.FP32), operations=ALL_OPERATIONS, build="synthetic",
            reserve_bytes=int(rng.uniform(0, 0.1) * memory_gib[0] * GIB),
        )
        for i in range(n)
    )
    links = tuple(
        Link(f"n{i}", f"n{j}", float(rng.uniform(1e9, 50e9)), int(rng.uniform(1e3, 2e5)))
        for i in range(n) for j in range(i + 1, n) if rng.random() < link_probability
    )
    return Inventory(nodes=nodes, links=links)


@dataclass(frozen=True)
class Instance:
    model: ModelDescription
    inventory: Inventory
    target: Target


def random_small_instance(rng: np.random.Generator) -> Instance:
    """<= 7 nodes, <= 9 layers; memory tight enough that feasibility binds in many instances."""
    n = int(rng.integers(1, 8))
    layers = int(rng.integers(1, 10))
    model = synthetic_model(
        layers,
        experts=int(rng.integers(4, 17)),
        top_k=2,
        hidden=256,
        moe_intermediate=int(rng.integers(64, 512)),
        vocab=4096,
        dense_layers=int(rng.integers(0, 2)),
    )
    total_gib = model.total_weight_bytes / GIB
    inventory = random_fleet(rng, n, (0.2 * total_gib + 0.01, 1.2 * total_gib + 0.02), float(rng.uniform(0.5, 1.0)))
    max_stages = int(rng.integers(1, n + 1))
    target = Target(context_tokens=int(rng.integers(64, 2048)), concurrency=int(rng.integers(1, 16)),
                    min_stages=int(rng.integers(1, max_stages + 1)), max_stages=max_stages, prefill_tokens=64)
    return Instance(model, inventory, target)


def agreement(instances: int, seed: int = 0) -> tuple[float, int]:
    """(fraction where the planner's bottleneck equals brute force's, feasible instance count).

    The planner side is the whole `plan()` path (node rejections, matrices, search, and the
    plan's own cost terms); the brute-force side enumerates every plan over all nodes.
    """
    rng = np.random.default_rng(seed)
    agree, feasible = 0, 0
    for _ in range(instances):
        inst = random_small_instance(rng)
        result = plan(inst.model, inst.inventory, inst.target)
        got = result.plan.prediction("bottleneck_s") if result.plan is not None else math.inf
        tables = build_tables(inst.model, inst.inventory, inst.inventory.nodes, inst.target)
        expected = brute_force_bottleneck(tables, inst.target.min_stages, inst.target.max_stages)
        feasible += math.isfinite(expected)
        agree += (got == expected == math.inf) or math.isclose(got, expected, rel_tol=1e-9)
    return agree / instances, feasible


def _timed(model: ModelDescription, inventory: Inventory, target: Target, repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        result = plan(model, inventory, target)
        best = min(best, time.perf_counter() - start)
        if not result.feasible:
            raise RuntimeError(f"benchmark instance unexpectedly infeasible: {result.infeasibility}")
    return best


def run_bench(instances: int = 200, repeats: int = 3) -> dict[str, float]:
    rng = np.random.default_rng(7)
    model_48 = synthetic_model(48, experts=128, top_k=8, hidden=4096, moe_intermediate=1536)
    fleet_6 = random_fleet(rng, 6, (48, 192))
    model_128 = synthetic_model(128, experts=128, top_k=8, hidden=2048, moe_intermediate=1024)
    fleet_64 = random_fleet(rng, 64, (16, 96), link_probability=0.5)
    fraction, feasible = agreement(instances)
    return {
        "plan_6x48_s": _timed(model_48, fleet_6, Target(context_tokens=4096, concurrency=16, max_stages=6), repeats),
        "plan_64x128_s": _timed(
            model_128, fleet_64, Target(context_tokens=4096, concurrency=64, max_stages=16), repeats
        ),
        "brute_force_agreement": fraction,
        "brute_force_instances": float(instances),
        "brute_force_feasible_instances": float(feasible),
    }
