"""What this process's cgroups enforce: CPU quota in cores, cpuset and memory limit.

Read from `/proc/self/cgroup` and the controller files (cgroup v1 under
`/sys/fs/cgroup/<controller>/...`, v2 under the unified `/sys/fs/cgroup/...`). A limit set on
any ancestor binds too, so each figure is the tightest along the path. Unlimited is 0 / empty.
"""

from __future__ import annotations

import os
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
