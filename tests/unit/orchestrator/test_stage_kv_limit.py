"""The KV pool a route gives each stage is the KV its plan counted for it."""

from __future__ import annotations

from services.orchestrator.route.install import stage_kv_limit

MIB = 2**20


def test_a_stage_gets_the_kv_its_plan_counted():
    assert stage_kv_limit(0, 1688 * MIB) == 1688 * MIB  # not the worker's 1 GiB default, larger or smaller
    assert stage_kv_limit(0, 66 * MIB) == 66 * MIB


def test_a_route_wide_limit_only_lowers_it():
    assert stage_kv_limit(256 * MIB, 1688 * MIB) == 256 * MIB
    assert stage_kv_limit(4096 * MIB, 1688 * MIB) == 1688 * MIB


def test_without_either_the_worker_keeps_its_default():
    assert stage_kv_limit(0, 0) == 0
    assert stage_kv_limit(512 * MIB, 0) == 512 * MIB
