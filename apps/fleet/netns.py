"""Builds and removes the kernel side of a fleet file: namespaces, bridge, veths, tbf, cgroups.

Needs root and namespace support; without them `require_isolation` refuses with a message that
says what is missing, so a multi-host fleet never quietly runs on one host. What was built is
recorded in `<state>/netns.json` before it is built, so `fornax down` can remove a fleet whose
setup stopped half way.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from apps.fleet.netns_plan import (
    CGROUP_ROOT,
    Action,
    CgroupVersion,
    MakeDir,
    NetnsPlan,
    Run,
    WriteFile,
    cgroup_dirs_leaf_first,
    cgroup_setup,
    make_plan,
    network_setup,
)
from apps.fleet.spec import FleetSpec

RECORD_FILE = "netns.json"
TOOLS = ("ip", "tc", "nsenter", "unshare", "sh")


class IsolationUnavailable(RuntimeError):
    """This machine cannot give each host its own kernel isolation."""


class IsolationFailed(RuntimeError):
    """A setup step failed; the message carries the command and its stderr."""


@dataclass(frozen=True)
class TeardownRecord:
    namespaces: tuple[str, ...]
    links: tuple[str, ...]
    cgroup_dirs: tuple[str, ...]  # leaf first

    @classmethod
    def of(cls, plan: NetnsPlan) -> TeardownRecord:
        return cls(tuple(h.netns for h in plan.hosts), (plan.bridge, *(h.veth_root for h in plan.hosts)),
                   tuple(cgroup_dirs_leaf_first(plan)))


def cgroup_version() -> CgroupVersion:
    if Path(CGROUP_ROOT, "cgroup.controllers").exists():
        return CgroupVersion.V2
    if all(Path(CGROUP_ROOT, c, "cgroup.procs").exists() for c in ("cpu", "cpuset", "memory")):
        return CgroupVersion.V1
    raise IsolationUnavailable(f"no usable cgroup hierarchy under {CGROUP_ROOT} (need cpu, cpuset and memory)")


def require_isolation(spec: FleetSpec) -> CgroupVersion:
    if os.geteuid() != 0:
        raise IsolationUnavailable("--fleet needs root: each host is a network namespace, a cgroup and a veth link")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise IsolationUnavailable(f"--fleet needs {', '.join(missing)} (iproute2, util-linux) on PATH")
    if not Path("/proc/self/ns/net").exists():
        raise IsolationUnavailable("this kernel has no network namespaces")
    if any(h.clock_offset_s for h in spec.hosts) and not Path("/proc/self/ns/time").exists():
        raise IsolationUnavailable("a host declares clock_offset_s but this kernel has no time namespaces")
    return cgroup_version()


def fleet_id_for(state_dir: Path) -> str:
    return hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:6]


def root_cpuset() -> tuple[str, str]:
    base = Path(CGROUP_ROOT, "cpuset")
    if base.exists():
        return (base / "cpuset.cpus").read_text().strip(), (base / "cpuset.mems").read_text().strip()
    return Path(CGROUP_ROOT, "cpuset.cpus.effective").read_text().strip(), "0"


def apply_action(action: Action) -> None:
    if isinstance(action, MakeDir):
        os.makedirs(action.path, exist_ok=False)
    elif isinstance(action, WriteFile):
        with open(action.path, "w", encoding="ascii") as handle:
            handle.write(action.text)
    elif isinstance(action, Run):
        done = subprocess.run(action.argv, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise IsolationFailed(f"`{' '.join(action.argv)}` failed: {done.stderr.strip()}")


def _in_use(plan: NetnsPlan) -> str | None:
    listing = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, timeout=30).stdout
    prefix = plan.bridge_address.rsplit(".", 1)[0] + "."
    if f" {prefix}" in listing:
        return f"the subnet {prefix}0/24 is already in use on this machine"
    if Path("/run/netns", plan.hosts[0].netns).exists():
        return f"namespace {plan.hosts[0].netns} exists; run `fornax down` for that fleet first"
    return None


def set_up(spec: FleetSpec, state_dir: Path) -> NetnsPlan:
    """Build every host; on any failure remove what was built and raise."""
    version = require_isolation(spec)
    cpus = tuple(sorted(os.sched_getaffinity(0)))
    plan = make_plan(spec, fleet_id_for(state_dir), version, cpus)
    problem = _in_use(plan)
    if problem:
        raise IsolationFailed(problem)
    write_record(state_dir, TeardownRecord.of(plan))
    root_cpus, root_mems = root_cpuset()
    try:
        for action in [*cgroup_setup(plan, root_cpus, root_mems), *network_setup(plan)]:
            apply_action(action)
    except (IsolationFailed, OSError, subprocess.TimeoutExpired):
        tear_down(state_dir)
        raise
    return plan


def write_record(state_dir: Path, record: TeardownRecord) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / RECORD_FILE).write_text(json.dumps(asdict(record), indent=2) + "\n", encoding="utf-8")


def read_record(state_dir: Path) -> TeardownRecord | None:
    path = state_dir / RECORD_FILE
    if not path.exists():
        return None
    body = json.loads(path.read_text(encoding="utf-8"))
    return TeardownRecord(**{key: tuple(value) for key, value in body.items()})


def cgroup_pids(directory: str) -> list[int]:
    try:
        return [int(line) for line in Path(directory, "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _kill_cgroups(record: TeardownRecord, wait_s: float = 10.0) -> None:
    """SIGKILL whatever a graceful stop left in a host's cgroups, and wait until they are empty."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        pids = sorted({pid for d in record.cgroup_dirs for pid in cgroup_pids(d)})
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def tear_down(state_dir: Path) -> list[str]:
    """Remove every namespace, link and cgroup the record names; returns what is still left."""
    record = read_record(state_dir)
    if record is None:
        return []
    _kill_cgroups(record)
    for directory in record.cgroup_dirs:
        if Path(directory).exists():
            try:
                os.rmdir(directory)
            except OSError:
                pass
    for action in network_teardown_of(record):
        subprocess.run(action.argv, capture_output=True, timeout=30)
    left = leftovers(record)
    if not left:
        (state_dir / RECORD_FILE).unlink(missing_ok=True)
    return left


def network_teardown_of(record: TeardownRecord) -> list[Run]:
    return [Run(("ip", "netns", "del", ns)) for ns in record.namespaces if Path("/run/netns", ns).exists()] + [
        Run(("ip", "link", "del", link)) for link in record.links if Path("/sys/class/net", link).exists()
    ]


def leftovers(record: TeardownRecord) -> list[str]:
    """Every namespace, link, cgroup or process of the record that still exists."""
    left = [f"namespace {ns}" for ns in record.namespaces if Path("/run/netns", ns).exists()]
    left += [f"link {link}" for link in record.links if Path("/sys/class/net", link).exists()]
    left += [f"cgroup {d}" for d in record.cgroup_dirs if Path(d).exists()]
    left += [f"process {pid}" for d in record.cgroup_dirs for pid in cgroup_pids(d)]
    return left

