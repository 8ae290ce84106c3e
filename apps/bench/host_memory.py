"""Each fleet host's memory over a `fornax bench serve --fleet` run, against its `memory_limit`.

Two figures per host, because they answer different questions:
- the host cgroup's peak: everything the kernel charged to the host (every process's anonymous
  memory, page cache of the files it read or mapped, kernel memory), which is what the limit
  enforces. On cgroup v1 `memory.max_usage_in_bytes` is read once when the measured window starts
  (the peak since the host was made: artifact build, load and warm-up) and then reset, so the
  window's own peak is read at its end. cgroup v2's `memory.peak` is not reset here: it is the
  peak since the host was made, and the report says so.
- the stage worker's anonymous RSS (`RssAnon`, with `VmRSS` beside it), sampled while the window
  runs: the worker's own heap (weights it copied, KV, activations), without the file pages a
  mapped artifact shares with the page cache.

OOM kills and limit hits are counted since the host's cgroup was made (v1 `memory.oom_control`'s
`oom_kill` and `memory.failcnt`; v2 `memory.events`' `oom_kill` and `max`). A figure a kernel
does not give is None with the reason, never a guess. The arithmetic (`host_report`) is pure; the
reads and the sampler are a thin shell around it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

V1_CONTROLLER = "memory"


@dataclass(frozen=True)
class CgroupReading:
    """What a host's memory cgroup said over the window (None: the kernel does not give it)."""

    peak_bytes: int | None
    peak_source: str
    peak_before_window_bytes: int | None = None  # v1: the peak since the host was made, before the reset
    oom_kills: int | None = None
    limit_hits: int | None = None
    counts_source: str = ""


@dataclass
class RssPeak:
    """The largest sampled RSS of a host's stage worker (None: never sampled)."""

    anon_bytes: int | None = None
    total_bytes: int | None = None
    samples: int = 0

    def add(self, anon_bytes: int, total_bytes: int) -> None:
        self.anon_bytes = max(self.anon_bytes or 0, anon_bytes)
        self.total_bytes = max(self.total_bytes or 0, total_bytes)
        self.samples += 1


def ratio(value: int | None, limit: int | None) -> float | None:
    """value ÷ limit, or None when either is missing (or the limit is not positive)."""
    if value is None or limit is None or limit <= 0:
        return None
    return value / limit


def host_report(limit_bytes: int | None, cgroup: CgroupReading | None, rss: RssPeak) -> dict:
    """One host's memory figures and its peak-vs-limit ratios; null ratios name their reason."""
    if limit_bytes is None or limit_bytes <= 0:
        return {"memory_limit_bytes": None, "peak_rss_vs_limit": None,
                "reason": "the host declares no memory limit: there is nothing to divide by"}
    cgroup = cgroup or CgroupReading(None, "no memory cgroup was found for this host")
    report = {
        "memory_limit_bytes": limit_bytes,
        "cgroup_peak_bytes": cgroup.peak_bytes,
        "cgroup_peak_source": cgroup.peak_source,
        "cgroup_peak_before_window_bytes": cgroup.peak_before_window_bytes,
        "stage_worker_anon_rss_peak_bytes": rss.anon_bytes,
        "stage_worker_rss_peak_bytes": rss.total_bytes,
        "rss_samples": rss.samples,
        "oom_kills": cgroup.oom_kills,
        "limit_hits": cgroup.limit_hits,
        "counts_source": cgroup.counts_source,
        "peak_rss_vs_limit": {
            "cgroup_peak": ratio(cgroup.peak_bytes, limit_bytes),
            "cgroup_peak_before_window": ratio(cgroup.peak_before_window_bytes, limit_bytes),
            "stage_worker_anon_rss_peak": ratio(rss.anon_bytes, limit_bytes),
        },
    }
    if rss.samples == 0:
        report["stage_worker_rss_reason"] = "no stage worker ran on this host (or none could be sampled)"
    return report


def memory_cgroup_dirs(cgroup_dirs: tuple[str, ...], hosts: list[str]) -> dict[str, str]:
    """Each host's memory cgroup among a fleet record's cgroup dirs: on v1 the one under the
    memory controller, on v2 the host's only dir (`<root>/fornax-<id>/<host>`)."""
    out = {}
    for host in hosts:
        mine = [d for d in cgroup_dirs if Path(d).name == host and Path(d).parent.name.startswith("fornax-")]
        v1 = [d for d in mine if f"/{V1_CONTROLLER}/" in d]
        if v1 or len(mine) == 1:
            out[host] = (v1 or mine)[0]
    return out


def parse_keyed(text: str) -> dict[str, int]:
    """`key value` lines (memory.oom_control, memory.events, /proc/PID/status in kB)."""
    out = {}
    for line in text.splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) >= 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    return int(text.strip()) if text is not None and text.strip().isdigit() else None


def start_window(directory: str) -> int | None:
    """At the window's start: the v1 peak since the host was made, then reset it (None on v2,
    or when the file is missing)."""
    peak_file = Path(directory, "memory.max_usage_in_bytes")
    before = _int(_read(peak_file))
    if before is not None:
        try:
            peak_file.write_text("0")
        except OSError:
            return before
    return before


def read_cgroup(directory: str, before_window: int | None) -> CgroupReading:
    """At the window's end: the host cgroup's peak and its OOM / limit counts."""
    root = Path(directory)
    v1_peak = _int(_read(root / "memory.max_usage_in_bytes"))
    if v1_peak is not None:
        oom = parse_keyed(_read(root / "memory.oom_control") or "")
        return CgroupReading(v1_peak, "cgroup v1 memory.max_usage_in_bytes, reset when the window started",
                             before_window, oom.get("oom_kill"), _int(_read(root / "memory.failcnt")),
                             "cgroup v1 memory.oom_control oom_kill and memory.failcnt, since the host was made")
    events = parse_keyed(_read(root / "memory.events") or "")
    v2_peak = _int(_read(root / "memory.peak"))
    source = ("cgroup v2 memory.peak, since the host was made (not reset)" if v2_peak is not None
              else f"no memory.max_usage_in_bytes or memory.peak under {directory}")
    return CgroupReading(v2_peak, source, None, events.get("oom_kill"), events.get("max"),
                         "cgroup v2 memory.events oom_kill and max, since the host was made" if events else
                         f"no memory.oom_control or memory.events under {directory}")


def read_rss(pid: int) -> tuple[int, int] | None:
    """(RssAnon, VmRSS) bytes of a live process, or None when it is gone."""
    status = _read(Path(f"/proc/{pid}/status"))
    if status is None:
        return None
    fields = parse_keyed(status)
    if "RssAnon" not in fields or "VmRSS" not in fields:
        return None
    return fields["RssAnon"] * 1024, fields["VmRSS"] * 1024


@dataclass
class HostMemoryWatch:
    """Samples each host's stage worker RSS on a thread between `start` and `finish`."""

    limits: dict[str, int | None]           # host -> memory_limit bytes
    cgroups: dict[str, str]                 # host -> memory cgroup dir
    worker_pids: dict[str, int]             # host -> its stage worker's pid
    interval_s: float = 0.25
    _before: dict[str, int | None] = field(default_factory=dict)
    _peaks: dict[str, RssPeak] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._before = {host: start_window(d) for host, d in self.cgroups.items()}
        self._peaks = {host: RssPeak() for host in self.limits}
        self._sample()
        self._thread = threading.Thread(target=self._run, name="host-memory-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        for host, pid in self.worker_pids.items():
            reading = read_rss(pid)
            if reading is not None:
                self._peaks[host].add(*reading)

    def finish(self) -> dict[str, dict]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        return {host: host_report(limit, read_cgroup(self.cgroups[host], self._before.get(host))
                                  if host in self.cgroups else None, self._peaks.get(host, RssPeak()))
                for host, limit in self.limits.items()}
