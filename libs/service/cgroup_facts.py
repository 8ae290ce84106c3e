"""What this process's cgroups enforce: CPU quota in cores, cpuset and memory limit.

Read from `/proc/self/cgroup` and the controller files (cgroup v1 under
`/sys/fs/cgroup/<controller>/...`, v2 under the unified `/sys/fs/cgroup/...`). A limit set on
any ancestor binds too, so each figure is the tightest along the path. Unlimited is 0 / empty.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

CGROUP_ROOT = Path("/sys/fs/cgroup")
# cgroup v1 reports "no limit" as a page-rounded LONG_MAX.
V1_UNLIMITED_BYTES = 1 << 62


@dataclass(frozen=True)
class CgroupFacts:
    cpu_quota_cores: float  # 0 = no CFS quota
    cpuset: str  # effective CPUs, e.g. "0-1"; the affinity mask when no cpuset file is readable
    memory_limit_bytes: int  # 0 = no limit


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """controller -> cgroup path; the v2 unified entry is keyed ""."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            paths[controller] = parts[2]
    return paths


def _ancestors(path: str) -> list[PurePosixPath]:
    """The cgroup and every ancestor up to (not including) the root."""
    pure = PurePosixPath(path)
    chain = [pure, *pure.parents]
    return [p for p in chain if str(p) != "/"]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except OSError:
        return None


def quota_cores_v1(base: Path, path: str) -> float:
    cores = [int(q) / int(p) for node in _ancestors(path)
             if (q := _read(base / node.relative_to("/") / "cpu.cfs_quota_us")) and
             (p := _read(base / node.relative_to("/") / "cpu.cfs_period_us")) and int(q) > 0]
    return min(cores, default=0.0)


def quota_cores_v2(base: Path, path: str) -> float:
    cores = []
    for node in _ancestors(path):
        raw = _read(base / node.relative_to("/") / "cpu.max")
        if raw and not raw.startswith("max"):
            quota, period = raw.split()
            cores.append(int(quota) / int(period))
    return min(cores, default=0.0)


def memory_limit(base: Path, path: str, file: str) -> int:
    limits = [int(raw) for node in _ancestors(path)
              if (raw := _read(base / node.relative_to("/") / file)) and raw.isdigit()
              and int(raw) < V1_UNLIMITED_BYTES]
    return min(limits, default=0)


def _affinity() -> str:
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return ",".join(map(str, cpus))


def _binding_quota_dir(base: Path, path: str, file: str) -> Path | None:
    """The cgroup along `path` whose CPU quota binds (the tightest), or None without one."""
    best: tuple[float, Path] | None = None
    for node in _ancestors(path):
        here = base / node.relative_to("/")
        raw = _read(here / file)
        if not raw:
            continue
        if file == "cpu.max":
            if raw.startswith("max"):
                continue
            quota, period = raw.split()
        else:
            quota, period = raw, _read(here / "cpu.cfs_period_us") or "0"
            if int(quota) <= 0 or int(period) <= 0:
                continue
        cores = int(quota) / int(period)
        if best is None or cores < best[0]:
            best = (cores, here)
    return best[1] if best else None


def throttled_seconds_reader(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> Callable[[], float]:
    """A reading of the seconds the cgroup whose CPU quota binds this process has spent throttled
    (`cpu.stat`: v1 `throttled_time` ns, v2 `throttled_usec`); always 0.0 without a quota or file."""
    text = proc_cgroup if proc_cgroup is not None else (_read(Path("/proc/self/cgroup")) or "")
    paths = parse_proc_cgroup(text)
    if (root / "cgroup.controllers").exists():
        where, key, scale = _binding_quota_dir(root, paths.get("", "/"), "cpu.max"), "throttled_usec", 1e-6
    else:
        where, key, scale = _binding_quota_dir(root / "cpu", paths.get("cpu", "/"), "cpu.cfs_quota_us"), \
            "throttled_time", 1e-9
    if where is None:
        return lambda: 0.0
    stat = where / "cpu.stat"

    def read() -> float:
        for line in (_read(stat) or "").splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value) * scale
        return 0.0

    return read


def cgroup_facts(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> CgroupFacts:
    text = proc_cgroup if proc_cgroup is not None else (_read(Path("/proc/self/cgroup")) or "")
    paths = parse_proc_cgroup(text)
    if (root / "cgroup.controllers").exists():
        path = paths.get("", "/")
        node = root / PurePosixPath(path).relative_to("/")
        return CgroupFacts(quota_cores_v2(root, path), _read(node / "cpuset.cpus.effective") or _affinity(),
                           memory_limit(root, path, "memory.max"))
    cpuset_path = PurePosixPath(paths.get("cpuset", "/")).relative_to("/")
    return CgroupFacts(
        quota_cores_v1(root / "cpu", paths.get("cpu", "/")),
        _read(root / "cpuset" / cpuset_path / "cpuset.effective_cpus") or _affinity(),
        memory_limit(root / "memory", paths.get("memory", "/"), "memory.limit_in_bytes"),
    )
