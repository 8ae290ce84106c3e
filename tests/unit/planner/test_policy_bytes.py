"""The planner counts the bytes a stage really holds under a weight policy. On DeepSeek-V2-Lite's
shapes the totals match the peers' files (GGUF Q4_K_M 9.7 GiB, Q8_0 15.6 GiB, bf16 31 GB), and
three memory-limited hosts refuse bf16 but place all 27 layers in q4_k_m."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from libs.model.config import parse_config
from libs.model.presets import preset_config
from libs.weights.policy import MAX_FORMATS
from services.planner.inventory import load_inventory_file
from services.planner.model import describe_config
from services.planner.planner import plan
from services.planner.policy_bytes import format_lines, stage_bytes_by_format

GIB = 2**30
LITE_INVENTORY = Path(__file__).parents[3] / "services/planner/examples/lite_three_hosts.yaml"


def lite(policy):
    return describe_config(preset_config("lite", 0, 1), snapshot="sha256:" + "1" * 64, policy=policy)


@pytest.mark.parametrize(("policy", "low", "high"), [
    ("bf16", 29.0, 29.5), ("q8_0", 15.3, 15.8), ("q4_k_m", 9.5, 10.0), ("fp32", 58.3, 58.8)])
def test_lite_totals_per_policy(policy, low, high):
    assert low <= lite(policy).total_weight_bytes / GIB <= high


def test_without_a_policy_bytes_are_the_checkpoint_dtype():
    stored = describe_config(preset_config("lite", 0, 1), snapshot="sha256:" + "1" * 64)
    # the bf16 policy keeps norms (55 of 2,048, 27 of 512) and the 26 routers [64, 2048] in float32
    extra = 2 * (55 * 2048 + 27 * 512 + 26 * 64 * 2048)
    assert lite("bf16").total_weight_bytes == stored.total_weight_bytes + extra
    assert stored.layers[1].kv_bytes_per_token == 2 * (512 + 64)
    assert lite("q4_k_m").layers[1].kv_bytes_per_token == 4 * (512 + 64)  # stages hold float32 KV


def test_a_decode_token_reads_fewer_expert_bytes_in_4_bit():
    q4, bf16 = lite("q4_k_m"), lite("bf16")
    assert q4.expert_bytes < 0.35 * bf16.expert_bytes
    assert q4.layers[1].dense_weight_bytes < bf16.layers[1].dense_weight_bytes


def test_three_small_hosts_refuse_bf16_and_place_every_layer_in_q4_k_m():
    loaded = load_inventory_file(LITE_INVENTORY)
    refused = plan(lite("bf16"), loaded.inventory, loaded.target)
    assert not refused.feasible and refused.infeasibility_reason == "INSUFFICIENT_MEMORY"
    assert refused.shortfall_bytes > 10 * GIB
    per_host = re.findall(r"(\w+) holds ([\d.]+) GiB of its ([\d.]+) GiB share, short by ([\d.]+) GiB",
                          refused.infeasibility)
    assert sorted(name for name, *_ in per_host) == ["alpha", "beta", "gamma"]
    assert all(float(short) > 0 and abs(float(share) - float(held) - float(short)) < 2e-3
               for _, held, share, short in per_host)
    assert abs(sum(float(short) for *_, short in per_host) - refused.shortfall_bytes / GIB) < 5e-3
    placed = plan(lite("q4_k_m"), loaded.inventory, loaded.target)
    assert placed.feasible
    ranges = [(s.layer_start, s.layer_end) for s in placed.plan.stages]
    assert ranges[0][0] == 0 and ranges[-1][1] == 27
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    layers = {s.node: s.layer_end - s.layer_start for s in placed.plan.stages}
    assert layers["alpha"] > max(layers["beta"], layers["gamma"])  # the biggest, fastest host takes most
    for stage in placed.plan.stages:
        assert stage.memory_bytes <= stage.node_memory_bytes


def test_bytes_by_format_of_the_stages_add_up_to_the_model():
    cfg = parse_config(preset_config("lite", 0, 1))
    split = [(0, 15), (15, 23), (23, 27)]
    by_stage = [stage_bytes_by_format(cfg, "q4_k_m", a, b, "numpy") for a, b in split]
    assert sum(sum(s.values()) for s in by_stage) == lite("q4_k_m").total_weight_bytes
    assert "q8_0" in by_stage[0] and "q8_0" in by_stage[-1]  # 8-bit embeddings and head
    max_stage = stage_bytes_by_format(cfg, "q4_k_m", 0, 15, "max")
    assert set(max_stage) <= MAX_FORMATS and "q4_k" in max_stage
    lines = format_lines(cfg, "q4_k_m", [(0, "alpha", 0, 15, "max")])
    assert lines[1].startswith("  stage 0 on alpha (max) [0, 15): q4_k ")
