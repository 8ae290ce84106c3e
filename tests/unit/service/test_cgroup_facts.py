"""cgroup limits read from v1 and v2 hierarchies laid out in a temporary directory."""

from __future__ import annotations

from pathlib import Path

from libs.service.cgroup_facts import cgroup_facts, parse_proc_cgroup

V1_PROC = "11:memory:/fleet/beta\n4:cpu:/fleet/beta\n3:cpuset:/fleet/beta\n1:name=systemd:/\n"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_parse_proc_cgroup_keys_controllers_and_the_unified_entry():
    paths = parse_proc_cgroup("4:cpu,cpuacct:/a\n0::/b\n")
    assert paths == {"cpu": "/a", "cpuacct": "/a", "": "/b"}


def test_v1_quota_cpuset_and_memory_take_the_tightest_ancestor(tmp_path):
    _write(tmp_path / "cpu/fleet/cpu.cfs_quota_us", "100000")
    _write(tmp_path / "cpu/fleet/cpu.cfs_period_us", "100000")
    _write(tmp_path / "cpu/fleet/beta/cpu.cfs_quota_us", "50000")
    _write(tmp_path / "cpu/fleet/beta/cpu.cfs_period_us", "100000")
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
