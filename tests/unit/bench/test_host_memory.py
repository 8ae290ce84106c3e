"""Each fleet host's memory against its limit: the ratios, the cgroup reads (v1 and v2 file
layouts in a scratch directory) and the RSS sampler on a live process."""

from __future__ import annotations

import os

import pytest

from apps.bench.host_memory import (
    CgroupReading,
    HostMemoryWatch,
    RssPeak,
    host_report,
    memory_cgroup_dirs,
    parse_keyed,
    ratio,
    read_cgroup,
    read_rss,
    start_window,
)

GIB = 2**30


def test_a_peak_is_divided_by_the_limit_and_missing_figures_stay_missing():
    assert ratio(3 * GIB, 6 * GIB) == 0.5
    assert ratio(None, 6 * GIB) is None
    assert ratio(GIB, None) is None and ratio(GIB, 0) is None


def test_a_host_reports_both_peaks_against_its_limit_with_the_oom_counts():
    cgroup = CgroupReading(peak_bytes=5 * GIB, peak_source="v1", peak_before_window_bytes=6 * GIB,
                           oom_kills=0, limit_hits=2, counts_source="v1 counts")
    rss = RssPeak()
    rss.add(2 * GIB, 3 * GIB)
    rss.add(3 * GIB, 4 * GIB)
    rss.add(GIB, 5 * GIB)
    report = host_report(8 * GIB, cgroup, rss)
    assert report["peak_rss_vs_limit"] == {"cgroup_peak": 0.625, "cgroup_peak_before_window": 0.75,
                                           "stage_worker_anon_rss_peak": 0.375}
    assert (report["stage_worker_anon_rss_peak_bytes"], report["stage_worker_rss_peak_bytes"]) == (3 * GIB, 5 * GIB)
    assert (report["oom_kills"], report["limit_hits"], report["rss_samples"]) == (0, 2, 3)
    assert "stage_worker_rss_reason" not in report


def test_a_host_without_a_limit_reports_null_with_the_reason():
    report = host_report(None, CgroupReading(GIB, "v1"), RssPeak())
    assert report["peak_rss_vs_limit"] is None and "no memory limit" in report["reason"]


def test_a_host_without_a_cgroup_or_a_worker_says_so_and_keeps_its_limit():
    report = host_report(4 * GIB, None, RssPeak())
    assert report["memory_limit_bytes"] == 4 * GIB
    assert report["peak_rss_vs_limit"] == {"cgroup_peak": None, "cgroup_peak_before_window": None,
                                           "stage_worker_anon_rss_peak": None}
    assert "no memory cgroup" in report["cgroup_peak_source"]
    assert "no stage worker" in report["stage_worker_rss_reason"]


def test_each_host_finds_its_memory_cgroup_in_a_v1_or_v2_record():
    v1 = tuple(f"/sys/fs/cgroup/{c}/fornax-abc123/{h}" for h in ("alpha", "beta") for c in ("cpu", "cpuset", "memory"))
    v1 += tuple(f"/sys/fs/cgroup/{c}/fornax-abc123" for c in ("cpu", "cpuset", "memory"))
    assert memory_cgroup_dirs(v1, ["alpha", "beta"]) == {"alpha": "/sys/fs/cgroup/memory/fornax-abc123/alpha",
                                                         "beta": "/sys/fs/cgroup/memory/fornax-abc123/beta"}
    v2 = ("/sys/fs/cgroup/fornax-abc123/alpha", "/sys/fs/cgroup/fornax-abc123")
    assert memory_cgroup_dirs(v2, ["alpha", "gamma"]) == {"alpha": "/sys/fs/cgroup/fornax-abc123/alpha"}


def test_keyed_files_parse_to_integers():
    assert parse_keyed("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n") == \
        {"oom_kill_disable": 0, "under_oom": 0, "oom_kill": 3}
    assert parse_keyed("Name:\tpython\nRssAnon:\t  1024 kB\nVmRSS:\t 2048 kB\n") == {"RssAnon": 1024, "VmRSS": 2048}


def test_a_v1_window_reads_the_peak_so_far_then_resets_it_and_reads_the_window_peak(tmp_path):
    (tmp_path / "memory.max_usage_in_bytes").write_text("7000\n")
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    (tmp_path / "memory.failcnt").write_text("4\n")
    assert start_window(str(tmp_path)) == 7000
    assert (tmp_path / "memory.max_usage_in_bytes").read_text() == "0"  # the reset
    (tmp_path / "memory.max_usage_in_bytes").write_text("5000\n")  # what the kernel would count after it
    reading = read_cgroup(str(tmp_path), 7000)
    assert (reading.peak_bytes, reading.peak_before_window_bytes) == (5000, 7000)
    assert (reading.oom_kills, reading.limit_hits) == (1, 4)
    assert "reset" in reading.peak_source


def test_a_v2_cgroup_gives_its_lifetime_peak_and_memory_events(tmp_path):
    (tmp_path / "memory.peak").write_text("9000\n")
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 6\noom 1\noom_kill 1\n")
    assert start_window(str(tmp_path)) is None
    reading = read_cgroup(str(tmp_path), None)
    assert (reading.peak_bytes, reading.oom_kills, reading.limit_hits) == (9000, 1, 6)
    assert "not reset" in reading.peak_source


def test_a_missing_cgroup_gives_no_figure_and_names_the_directory(tmp_path):
    reading = read_cgroup(str(tmp_path / "gone"), None)
    assert reading.peak_bytes is None and reading.oom_kills is None and "gone" in reading.peak_source


def test_rss_of_a_live_process_and_of_none():
    anon, total = read_rss(os.getpid())
    assert 0 < anon <= total
    assert read_rss(2**22 + 7) is None  # above any default pid_max: no such process


def test_the_watch_samples_each_worker_and_reports_every_host(tmp_path):
    (tmp_path / "memory.max_usage_in_bytes").write_text("3000\n")
    watch = HostMemoryWatch({"alpha": 4 * GIB, "beta": 2 * GIB}, {"alpha": str(tmp_path)},
                            {"alpha": os.getpid()}, interval_s=0.01)
    watch.start()
    report = watch.finish()
    alpha, beta = report["alpha"], report["beta"]
    assert alpha["rss_samples"] >= 2 and alpha["stage_worker_anon_rss_peak_bytes"] > 0
    assert alpha["peak_rss_vs_limit"]["stage_worker_anon_rss_peak"] == \
        pytest.approx(alpha["stage_worker_anon_rss_peak_bytes"] / (4 * GIB))
    assert alpha["cgroup_peak_before_window_bytes"] == 3000 and alpha["cgroup_peak_bytes"] == 0
    assert beta["rss_samples"] == 0 and beta["cgroup_peak_bytes"] is None
