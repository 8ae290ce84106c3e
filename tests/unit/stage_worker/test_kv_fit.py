"""KV limit mode "fit": the budget is what the host's memory leaves after load."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from libs.common.kinds import Backend, DType
from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint
from libs.model.config import load_config
from libs.model.kv_store import KvLayout
from libs.service.errors import FailedPrecondition
from services.stage_worker.config import StageWorkerConfig
from services.stage_worker.kv_fit import (
    HEADROOM_FLOOR_BYTES,
    HostMemory,
    fit_kv,
    headroom_bytes,
    parse_kv_limit,
    resident_bytes,
)
from services.stage_worker.runtime import LoadSpec, PlanBinding, StageRuntime

GIB = 1 << 30
MIB = 1 << 20


def test_headroom_is_the_larger_of_the_floor_and_a_tenth():
    assert headroom_bytes(1 * GIB) == HEADROOM_FLOOR_BYTES
    assert headroom_bytes(7 * GIB) == int(7 * GIB * 0.10)


def test_fit_is_limit_less_resident_less_headroom():
    fit = fit_kv(HostMemory(7 * GIB, 4 * GIB, "cgroup"), min_bytes=1)
    assert fit.headroom_bytes == int(7 * GIB * 0.10)
    assert fit.kv_bytes == 7 * GIB - 4 * GIB - fit.headroom_bytes
    text = fit.describe()
    assert text.startswith("KV 2.30 GiB = limit 7.00 GiB (cgroup) − resident 4.00 GiB − headroom 0.70 GiB")
    assert text.endswith("(physical)")


def test_an_explicit_cap_bounds_the_fit():
    fit = fit_kv(HostMemory(7 * GIB, 4 * GIB, "cgroup"), min_bytes=1, cap_bytes=1 * GIB)
    assert fit.kv_bytes == 1 * GIB and "capped at 1.00 GiB" in fit.describe()
    roomy = fit_kv(HostMemory(7 * GIB, 4 * GIB, "cgroup"), min_bytes=1, cap_bytes=100 * GIB)
    assert roomy.kv_bytes < 100 * GIB and "capped" not in roomy.describe()


def test_too_little_left_refuses_with_the_bytes_named():
    with pytest.raises(FailedPrecondition) as err:
        fit_kv(HostMemory(1 * GIB, 900 * MIB, "cgroup"), min_bytes=1 * MIB)
    assert err.value.reason == "KV_FIT_TOO_SMALL"
    for figure in (str(1 * GIB), str(900 * MIB), str(HEADROOM_FLOOR_BYTES), str(1 * MIB)):
        assert figure in err.value.message
    # Exactly one block left is enough.
    fit = fit_kv(HostMemory(1 * GIB, 1 * GIB - HEADROOM_FLOOR_BYTES - MIB, "cgroup"), min_bytes=MIB)
    assert fit.kv_bytes == MIB


def test_bad_facts_are_refused():
    with pytest.raises(ValueError):
        fit_kv(HostMemory(0, 0, "cgroup"), min_bytes=1)


def test_the_limit_value_parses_bytes_fit_and_a_capped_fit():
    assert parse_kv_limit("1073741824") == (False, GIB)
    assert parse_kv_limit("fit") == (True, 0)
    assert parse_kv_limit("fit:2147483648") == (True, 2 * GIB)
    for bad in ("fit:0", "fit:x", "lots"):
        with pytest.raises(ValueError):
            parse_kv_limit(bad)


def test_the_worker_config_reads_fit_from_the_environment():
    cfg = StageWorkerConfig.from_env([], {"FORNAX_KV_LIMIT_BYTES": "fit:4096"})
    assert cfg.kv_limit_fit and cfg.kv_limit_bytes == 4096
    fixed = StageWorkerConfig.from_env([], {})
    assert not fixed.kv_limit_fit and fixed.kv_limit_bytes == 1 << 30
    with pytest.raises(SystemExit):
        StageWorkerConfig.from_env([], {"FORNAX_KV_LIMIT_BYTES": "fit:-1"})


def test_resident_bytes_reads_vmrss(tmp_path: Path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmRSS:\t  2048 kB\n", encoding="ascii")
    assert resident_bytes(status) == 2 * MIB
    assert resident_bytes() > 0  # this process's own


def _spec(checkpoint: Path, kv_limit_bytes: int = 0) -> LoadSpec:
    return LoadSpec(stage_index=0, stage_count=1, layer_start=0, layer_end=2,
                    plan=PlanBinding("p", "sha256:" + "0" * 64, "g"), backend=Backend.NUMPY,
                    boundary_dtype=DType.FP32, checkpoint_dir=str(checkpoint), kv_limit_bytes=kv_limit_bytes)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    write_checkpoint(CheckpointRequest("tiny", root))
    return root


def test_a_stage_loaded_with_fit_sizes_its_pool_from_the_given_limit(tiny: Path):
    memory = HostMemory(2 * GIB, 1 * GIB, "cgroup")  # injected: no real cgroup needed
    runtime = StageRuntime(Backend.NUMPY, "cpu", 0, kv_fit=lambda: memory)
    stage = asyncio.run(runtime.load(_spec(tiny)))
    config = load_config(str(tiny))
    block = KvLayout(2, config.kv_lora_rank, config.qk_rope_head_dim).block_bytes()
    expected = 2 * GIB - 1 * GIB - HEADROOM_FLOOR_BYTES
    assert stage.kv_fit is not None and stage.kv_fit.kv_bytes == expected
    assert stage.executor.spec.kv_limit_bytes == expected
    assert stage.executor.kv.pool.total_blocks == expected // block


def test_a_spec_limit_caps_the_fit(tiny: Path):
    runtime = StageRuntime(Backend.NUMPY, "cpu", 0, kv_fit=lambda: HostMemory(2 * GIB, 1 * GIB, "cgroup"))
    stage = asyncio.run(runtime.load(_spec(tiny, kv_limit_bytes=8 * MIB)))
    assert stage.executor.spec.kv_limit_bytes == 8 * MIB


def test_a_host_with_no_room_left_refuses_the_load(tiny: Path):
    runtime = StageRuntime(Backend.NUMPY, "cpu", 0, kv_fit=lambda: HostMemory(1 * GIB, 1 * GIB, "cgroup"))
    with pytest.raises(FailedPrecondition) as err:
        asyncio.run(runtime.load(_spec(tiny)))
    assert err.value.reason == "KV_FIT_TOO_SMALL"
    assert runtime.stage is None
