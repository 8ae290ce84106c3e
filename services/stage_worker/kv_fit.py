"""KV limit mode "fit": size the KV pool from the memory the host really has left after load.

Pure core: `fit_kv` takes the memory facts (a limit, the process's resident bytes after its
weights loaded, an optional cap and the bytes of one KV block across the stage's layers) and
returns the KV budget with how it was derived, or refuses with the bytes named
(KV_FIT_TOO_SMALL). `measure_host_memory` is the thin I/O shell that reads them.

Headroom: max(256 MiB, 10 % of the limit) — activations, allocator slack and the Python heap
grow after load; a KV pool sized to the last byte would be an OOM kill waiting to happen.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from libs.service.cgroup_facts import cgroup_facts
from libs.service.errors import FailedPrecondition
from libs.service.host import host_facts

HEADROOM_FLOOR_BYTES = 256 << 20
HEADROOM_FRACTION = 0.10
FIT = "fit"


@dataclass(frozen=True)
class HostMemory:
    """What bounds this process: its cgroup memory limit, else MemAvailable plus what it holds."""
    limit_bytes: int
    resident_bytes: int
    source: str  # "cgroup" or "MemAvailable"


@dataclass(frozen=True)
class KvFit:
    kv_bytes: int
    limit_bytes: int
    resident_bytes: int
    headroom_bytes: int
    cap_bytes: int  # 0 = none
    source: str

    def describe(self) -> str:
        capped = f", capped at {_gib(self.cap_bytes)}" if self.cap_bytes and self.kv_bytes == self.cap_bytes else ""
        return (f"KV {_gib(self.kv_bytes)} = limit {_gib(self.limit_bytes)} ({self.source}) "
                f"− resident {_gib(self.resident_bytes)} − headroom {_gib(self.headroom_bytes)}{capped} (physical)")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def headroom_bytes(limit_bytes: int) -> int:
    return max(HEADROOM_FLOOR_BYTES, int(limit_bytes * HEADROOM_FRACTION))


def fit_kv(memory: HostMemory, min_bytes: int, cap_bytes: int = 0) -> KvFit:
    """The KV budget left after load; refuses (KV_FIT_TOO_SMALL) below `min_bytes`
    (one KV block across the stage's layers)."""
    if memory.limit_bytes <= 0 or memory.resident_bytes < 0 or min_bytes <= 0 or cap_bytes < 0:
        raise ValueError(f"bad memory facts {memory!r}, min_bytes={min_bytes}, cap_bytes={cap_bytes}")
    headroom = headroom_bytes(memory.limit_bytes)
    left = memory.limit_bytes - memory.resident_bytes - headroom
    if left < min_bytes:
        raise FailedPrecondition(
            f"KV fit: limit {memory.limit_bytes} B ({memory.source}) − weights resident "
            f"{memory.resident_bytes} B − headroom {headroom} B = {left} B, below one KV block "
            f"per layer ({min_bytes} B)", reason="KV_FIT_TOO_SMALL", field="kv_limit_bytes")
    kv = min(left, cap_bytes) if cap_bytes else left
    return KvFit(kv, memory.limit_bytes, memory.resident_bytes, headroom, cap_bytes, memory.source)


def parse_kv_limit(value: str) -> tuple[bool, int]:
    """FORNAX_KV_LIMIT_BYTES: bytes, "fit", or "fit:<cap bytes>" -> (fit, bytes or cap)."""
    text = value.strip()
    if text == FIT:
        return True, 0
    if text.startswith(FIT + ":"):
        cap = int(text[len(FIT) + 1:])
        if cap <= 0:
            raise ValueError(f"the fit cap must be positive, got {cap}")
        return True, cap
    return False, int(text)


def resident_bytes(status: Path = Path("/proc/self/status")) -> int:
    for line in status.read_text(encoding="ascii").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS in {status}")


def measure_host_memory() -> HostMemory:
    resident = resident_bytes()
    limit = cgroup_facts().memory_limit_bytes
    if limit:
        return HostMemory(limit, resident, "cgroup")
    return HostMemory(host_facts().memory_available_bytes + resident, resident, "MemAvailable")
