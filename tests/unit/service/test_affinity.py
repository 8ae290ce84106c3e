from __future__ import annotations

import pytest

from libs.service.affinity import format_cpu_set, parse_cpu_set, quota_cpus, worker_cpu_sets, worker_env
from services.stage_worker.config import StageWorkerConfig


def test_workers_get_disjoint_contiguous_shares():
    assert worker_cpu_sets(2, (0, 1, 2, 3, 4)) == [(0, 1, 2), (3, 4)]
    assert worker_cpu_sets(1, (0, 1)) == [(0, 1)]


def test_more_workers_than_cpus_share_round_robin():
    assert worker_cpu_sets(3, (4, 5)) == [(4,), (5,), (4,)]


def test_cpu_sets_round_trip_and_size_thread_pools():
    assert parse_cpu_set("0,2-3") == (0, 2, 3)
    assert parse_cpu_set(format_cpu_set((1, 5))) == (1, 5)
    env = worker_env((2, 3))
    assert env["OPENBLAS_NUM_THREADS"] == "2" and env["FORNAX_CPU_AFFINITY"] == "2,3"
    with pytest.raises(ValueError):
        worker_cpu_sets(0, (0,))


def test_stage_worker_reads_its_cpu_set():
    assert StageWorkerConfig.from_env([], {"FORNAX_CPU_AFFINITY": "0-1"}).cpu_affinity == (0, 1)
    assert StageWorkerConfig.from_env(["--cpu-affinity", "1"], {}).cpu_affinity == (1,)
    with pytest.raises(SystemExit):
        StageWorkerConfig.from_env([], {"FORNAX_CPU_AFFINITY": "x"})


def test_even_layer_split_covers_every_layer_once_larger_stages_first():
    from libs.model.layout import even_layer_split

    assert even_layer_split(4, 3) == [(0, 2), (2, 3), (3, 4)]
    for layers in range(1, 12):
        for stages in range(1, layers + 1):
            ranges = even_layer_split(layers, stages)
            assert [a for a, _ in ranges[1:]] == [b for _, b in ranges[:-1]]
            assert ranges[0][0] == 0 and ranges[-1][1] == layers
            sizes = [b - a for a, b in ranges]
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_thread_pools_fit_a_cfs_quota_smaller_than_the_cpu_set():
    cpus = (0, 1, 2, 3)
    assert quota_cpus(cpus, 0.0) == cpus           # no quota
    assert quota_cpus(cpus, 4.0) == cpus
    assert quota_cpus(cpus, 8.0) == cpus
    assert quota_cpus(cpus, 1.5) == (0, 1)         # 1.5 cores run on at most 2 threads at once
    assert quota_cpus(cpus, 1.0) == (0,)
    assert quota_cpus(cpus, 0.25) == (0,)          # never empty
