"""Observed facts about this host, read from the OS (never assumed)."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from importlib import metadata


@dataclass(frozen=True)
class HostFacts:
    cpu_name: str
    cpu_count: int
    memory_total_bytes: int
    memory_available_bytes: int


def _meminfo() -> dict[str, int]:
    facts: dict[str, int] = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts:
                    facts[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return facts


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_facts() -> HostFacts:
    mem = _meminfo()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return HostFacts(
        cpu_name=cpu_name(),
        cpu_count=usable,
        memory_total_bytes=mem.get("MemTotal", 0),
        memory_available_bytes=mem.get("MemAvailable", 0),
    )


def backend_build(backend: str) -> str | None:
    """Installed version of a backend's distribution, or None when it is not installed."""
    dist = {"numpy": "numpy", "max": "max"}[backend]
    try:
        return f"{backend} {metadata.version(dist)}"
    except metadata.PackageNotFoundError:
        return None


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
