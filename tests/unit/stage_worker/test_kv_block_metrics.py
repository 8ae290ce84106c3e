"""A stage worker's prefix hits, misses and evictions as Prometheus counters, brought up to its
block pool's own totals."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, Counter

from libs.model.kv_blocks import BlockPool
from libs.service.counter_mirror import CounterMirror
from services.stage_worker import metrics


def _value(name: str, stage: str) -> float:
    return REGISTRY.get_sample_value(name, {"stage": stage}) or 0.0


def _values(stage: str) -> tuple[float, float, float]:
    return (_value("fornax_stage_prefix_hit_blocks_total", stage),
            _value("fornax_stage_prefix_missed_blocks_total", stage),
            _value("fornax_stage_kv_evicted_blocks_total", stage))


def test_a_pools_hits_misses_and_evictions_become_the_stages_counters():
    stage = "stage-kv-metrics-test"
    pool = BlockPool(2)
    a = pool.allocate()
    pool.publish(a, b"ha")
    pool.release(a)
    assert pool.match([b"ha", b"hb"]) == [a]  # one hit, one miss
    pool.release(a)
    pool.allocate()
    pool.allocate()  # the fresh block, then the cached one: one eviction
    metrics.record_kv_blocks(stage, "pool-1", pool.stats())
    assert _values(stage) == (1, 1, 1)
    metrics.record_kv_blocks(stage, "pool-1", pool.stats())  # looked at again: nothing added
    assert _values(stage) == (1, 1, 1)
    reloaded = BlockPool(2)  # a reloaded stage: a fresh pool counts from zero
    reloaded.match([b"hx"])
    metrics.record_kv_blocks(stage, "pool-2", reloaded.stats())
    assert _values(stage) == (1, 2, 1)


@pytest.mark.parametrize("totals, added", [((3, 5, 5, 9), 9), ((4, 2, 6), 4 + 2 + 4)])
def test_counter_mirror_adds_growth_and_restarts_from_zero_when_a_total_drops(totals, added):
    registry = CollectorRegistry()
    mirror = CounterMirror(Counter("mirror_test", "test", ["stage"], registry=registry))
    for total in totals:
        mirror.observe(("0",), total)
    assert registry.get_sample_value("mirror_test_total", {"stage": "0"}) == added
