"""cgroup limits read from v1 and v2 hierarchies laid out in a temporary directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.service.cgroup_facts import cgroup_facts, parse_proc_cgroup, throttled_seconds_reader

V1_PROC = "11:memory:/fleet/beta\n4:cpu:/fleet/beta\n3:cpuset:/fleet/beta\n1:name=systemd:/\n"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _v1_quota(root: Path, group: str, quota_us: int) -> None:
    _write(root / "cpu" / group / "cpu.cfs_quota_us", str(quota_us))
    _write(root / "cpu" / group / "cpu.cfs_period_us", "100000")


def test_parse_proc_cgroup_keys_controllers_and_the_unified_entry():
    paths = parse_proc_cgroup("4:cpu,cpuacct:/a\n0::/b\n")
    assert paths == {"cpu": "/a", "cpuacct": "/a", "": "/b"}


def test_v1_quota_cpuset_and_memory_take_the_tightest_ancestor(tmp_path):
    _v1_quota(tmp_path, "fleet", 100000)
    _v1_quota(tmp_path, "fleet/beta", 50000)
    _write(tmp_path / "cpuset/fleet/beta/cpuset.effective_cpus", "1")
    _write(tmp_path / "memory/fleet/memory.limit_in_bytes", str(1 << 30))
    _write(tmp_path / "memory/fleet/beta/memory.limit_in_bytes", "9223372036854771712")  # unlimited
    facts = cgroup_facts(tmp_path, V1_PROC)
    assert (facts.cpu_quota_cores, facts.cpuset, facts.memory_limit_bytes) == (0.5, "1", 1 << 30)


def test_v1_without_limits_reports_none(tmp_path):
    _write(tmp_path / "cpu/fleet/beta/cpu.cfs_quota_us", "-1")
    _write(tmp_path / "cpu/fleet/beta/cpu.cfs_period_us", "100000")
    facts = cgroup_facts(tmp_path, V1_PROC)
    assert (facts.cpu_quota_cores, facts.memory_limit_bytes) == (0.0, 0)
    assert facts.cpuset  # falls back to the affinity mask


def test_v2_reads_cpu_max_and_memory_max(tmp_path):
    _write(tmp_path / "cgroup.controllers", "cpu cpuset memory")
    _write(tmp_path / "fleet/alpha/cpu.max", "150000 100000")
    _write(tmp_path / "fleet/cpu.max", "max 100000")
    _write(tmp_path / "fleet/alpha/cpuset.cpus.effective", "0-1")
    _write(tmp_path / "fleet/alpha/memory.max", str(3 << 30))
    facts = cgroup_facts(tmp_path, "0::/fleet/alpha\n")
    assert (facts.cpu_quota_cores, facts.cpuset, facts.memory_limit_bytes) == (1.5, "0-1", 3 << 30)


def test_v1_throttled_seconds_come_from_the_cgroup_whose_quota_binds(tmp_path):
    _v1_quota(tmp_path, "fleet", 150000)
    _write(tmp_path / "cpu/fleet/cpu.stat", "nr_periods 9\nnr_throttled 9\nthrottled_time 999000000\n")
    _v1_quota(tmp_path, "fleet/beta", 50000)
    stat = tmp_path / "cpu/fleet/beta/cpu.stat"
    _write(stat, "nr_periods 4\nnr_throttled 2\nthrottled_time 75000000\n")
    read = throttled_seconds_reader(tmp_path, V1_PROC)
    assert read() == pytest.approx(0.075)
    _write(stat, "nr_periods 5\nnr_throttled 3\nthrottled_time 125000000\n")
    assert read() == pytest.approx(0.125)


def test_v2_throttled_seconds_read_throttled_usec(tmp_path):
    _write(tmp_path / "cgroup.controllers", "cpu memory")
    _write(tmp_path / "fleet/beta/cpu.max", "50000 100000")
    _write(tmp_path / "fleet/beta/cpu.stat", "usage_usec 10\nthrottled_usec 40000\n")
    assert throttled_seconds_reader(tmp_path, "0::/fleet/beta\n")() == pytest.approx(0.04)


def test_without_a_quota_nothing_is_ever_throttled(tmp_path):
    _v1_quota(tmp_path, "fleet/beta", -1)
    _write(tmp_path / "cpu/fleet/beta/cpu.stat", "throttled_time 5\n")
    assert throttled_seconds_reader(tmp_path, V1_PROC)() == 0.0
