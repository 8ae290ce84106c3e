from __future__ import annotations

import os

from libs.service import host_quota


def test_quota_label_names_the_cpus_quota_and_load(monkeypatch):
    monkeypatch.setattr(host_quota.os, "getloadavg", lambda: (14.25, 12.0, 9.0))
    monkeypatch.setattr(host_quota, "cgroup_cpu_quota", lambda: "200000/100000 us")
    label = host_quota.quota_label()
    cpus = len(os.sched_getaffinity(0))
    assert label.startswith(f"{cpus} usable CPUs")
    assert "cpu.max 200000/100000 us" in label and "load average 14.2 (1 min) / 12.0" in label


def test_cgroup_quota_reads_cpu_max(tmp_path, monkeypatch):
    real_open = open

    def fake_open(path, *args, **kwargs):
        if path == "/sys/fs/cgroup/cpu.max":
            return real_open(tmp_path / "cpu.max", *args, **kwargs)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", fake_open)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert host_quota.cgroup_cpu_quota() == "unlimited"
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert host_quota.cgroup_cpu_quota() == "150000/100000 us"
    (tmp_path / "cpu.max").unlink()
    assert host_quota.cgroup_cpu_quota() == "unknown"
