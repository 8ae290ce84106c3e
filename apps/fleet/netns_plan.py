"""What a fleet file becomes in the kernel, as plain values: names, addresses, cgroup writes
and the `ip`/`tc` command lines that build and remove it. Nothing here runs anything, so the
whole plan is tested without root; `netns` executes it.

Layout of one fleet (id = 6 hex digits):
- a bridge `fxb<id>` in the root namespace holding 198.18.k.1/24, where k comes from the id
  (198.18.0.0/15 is the benchmarking range, never routed off the machine);
- per host, a namespace `fornax-<id>-<host>` with a veth pair `fx<id>h<i>` (root side, on the
  bridge) and `eth0` (inside) at 198.18.k.(10+i)/24; tbf shapes both directions;
- per host, a cgroup `fornax-<id>/<host>` with the CFS quota, a cpuset and a memory limit.
"""

from __future__ import annotations

import enum
import ipaddress
import shlex
from dataclasses import dataclass

from apps.fleet.cpu_shares import CpuShare, assign_cpus
from apps.fleet.spec import FleetSpec, HostSpec

FABRIC = ipaddress.IPv4Network("198.18.0.0/15")
CFS_PERIOD_US = 100_000
# tbf queues at most this long before dropping; bursts hold 10 ms of line rate (32 KiB at least).
TBF_LATENCY_MS = 50
TBF_MIN_BURST_BYTES = 32 * 1024
CGROUP_ROOT = "/sys/fs/cgroup"
V1_CONTROLLERS = ("cpu", "cpuset", "memory")


class CgroupVersion(enum.Enum):
    V1 = 1
    V2 = 2


@dataclass(frozen=True)
class WriteFile:
    path: str
    text: str


@dataclass(frozen=True)
class MakeDir:
    path: str


@dataclass(frozen=True)
class Run:
    argv: tuple[str, ...]


Action = WriteFile | MakeDir | Run


@dataclass(frozen=True)
class HostPlan:
    spec: HostSpec
    index: int
    netns: str
    veth_root: str
    address: str  # inside the namespace, on eth0
    cpu_share: CpuShare  # cpuset, usable cores and any CPU shared with another host (`cpu_shares`)
    cgroup_dirs: tuple[str, ...]  # one per controller (v1) or one (v2)

    @property
    def cpuset(self) -> tuple[int, ...]:
        return self.cpu_share.cpuset

    @property
    def cpu_quota_us(self) -> int:
        return max(1000, round(self.cpu_share.usable_cores * CFS_PERIOD_US))

    @property
    def thread_count(self) -> int:
        return self.cpu_share.threads


@dataclass(frozen=True)
class NetnsPlan:
    fleet_id: str
    bridge: str
    bridge_address: str
    prefix_len: int
    cgroup_version: CgroupVersion
    fleet_cgroup_dirs: tuple[str, ...]
    hosts: tuple[HostPlan, ...]

    def host(self, name: str) -> HostPlan:
        return next(h for h in self.hosts if h.spec.name == name)


def subnet_for(fleet_id: str) -> ipaddress.IPv4Network:
    """One /24 of 198.18.0.0/15 per fleet id, so fleets of different state dirs rarely meet."""
    subnets = list(FABRIC.subnets(new_prefix=24))
    return subnets[int(fleet_id, 16) % len(subnets)]


def _cpu_shares(hosts: tuple[HostSpec, ...], cpus: tuple[int, ...]) -> list[CpuShare]:
    """Disjoint cpusets where the box has the CPUs; a shared CPU only where quotas force one, and
    then stated (`apps.fleet.cpu_shares`)."""
    return assign_cpus([(h.name, h.cpu_cores) for h in hosts], cpus)


def _cgroup_dirs(version: CgroupVersion, relative: str) -> tuple[str, ...]:
    if version is CgroupVersion.V2:
        return (f"{CGROUP_ROOT}/{relative}",)
    return tuple(f"{CGROUP_ROOT}/{c}/{relative}" for c in V1_CONTROLLERS)


def netns_name(fleet_id: str, host: str) -> str:
    return f"fornax-{fleet_id}-{host}"


def make_plan(spec: FleetSpec, fleet_id: str, version: CgroupVersion, cpus: tuple[int, ...]) -> NetnsPlan:
    if len(fleet_id) != 6 or any(c not in "0123456789abcdef" for c in fleet_id):
        raise ValueError(f"fleet id must be 6 lowercase hex digits, got {fleet_id!r}")
    subnet = subnet_for(fleet_id)
    addresses = list(subnet.hosts())
    hosts = tuple(
        HostPlan(spec=host, index=i, netns=netns_name(fleet_id, host.name), veth_root=f"fx{fleet_id}h{i}",
                 address=str(addresses[9 + i]), cpu_share=share,
                 cgroup_dirs=_cgroup_dirs(version, f"fornax-{fleet_id}/{host.name}"))
        for i, (host, share) in enumerate(zip(spec.hosts, _cpu_shares(spec.hosts, cpus), strict=True))
    )
    return NetnsPlan(fleet_id=fleet_id, bridge=f"fxb{fleet_id}", bridge_address=str(addresses[0]),
                     prefix_len=subnet.prefixlen, cgroup_version=version,
                     fleet_cgroup_dirs=_cgroup_dirs(version, f"fornax-{fleet_id}"), hosts=hosts)


def _tbf(rate_bits_per_s: int) -> tuple[str, ...]:
    burst = max(TBF_MIN_BURST_BYTES, rate_bits_per_s // 8 // 100)
    return ("tbf", "rate", f"{rate_bits_per_s}bit", "burst", str(burst), "latency", f"{TBF_LATENCY_MS}ms")


def network_setup(plan: NetnsPlan) -> list[Action]:
    actions: list[Action] = [
        Run(("ip", "link", "add", plan.bridge, "type", "bridge")),
        Run(("ip", "addr", "add", f"{plan.bridge_address}/{plan.prefix_len}", "dev", plan.bridge)),
        Run(("ip", "link", "set", plan.bridge, "up")),
    ]
    for host in plan.hosts:
        ns, tbf = host.netns, _tbf(host.spec.link.rate_bits_per_s)
        actions += [
            Run(("ip", "netns", "add", ns)),
            Run(("ip", "link", "add", host.veth_root, "type", "veth", "peer", "name", "eth0", "netns", ns)),
            Run(("ip", "link", "set", host.veth_root, "master", plan.bridge)),
            Run(("ip", "link", "set", host.veth_root, "up")),
            Run(("ip", "-n", ns, "addr", "add", f"{host.address}/{plan.prefix_len}", "dev", "eth0")),
            Run(("ip", "-n", ns, "link", "set", "lo", "up")),
            Run(("ip", "-n", ns, "link", "set", "eth0", "up")),
            Run(("ip", "-n", ns, "route", "add", "default", "via", plan.bridge_address)),
            # Into the host (root-side egress) and out of it (egress inside the namespace).
            Run(("tc", "qdisc", "add", "dev", host.veth_root, "root", *tbf)),
            Run(("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", *tbf)),
        ]
    return actions


def cgroup_setup(plan: NetnsPlan, root_cpus: str, root_mems: str) -> list[Action]:
    """Make the fleet and host cgroups and write their limits (v1 or v2 file names)."""
    if plan.cgroup_version is CgroupVersion.V2:
        return _cgroup_v2(plan)
    actions: list[Action] = [MakeDir(d) for d in plan.fleet_cgroup_dirs]
    cpuset_parent = next(d for d in plan.fleet_cgroup_dirs if "/cpuset/" in d)
    # A v1 cpuset child accepts no task until its parent has CPUs and memory nodes.
    actions += [
        WriteFile(f"{cpuset_parent}/cpuset.cpus", root_cpus),
        WriteFile(f"{cpuset_parent}/cpuset.mems", root_mems),
    ]
    for host in plan.hosts:
        cpu, cpuset, memory = host.cgroup_dirs
        actions += [
            MakeDir(cpu), MakeDir(cpuset), MakeDir(memory),
            WriteFile(f"{cpu}/cpu.cfs_period_us", str(CFS_PERIOD_US)),
            WriteFile(f"{cpu}/cpu.cfs_quota_us", str(host.cpu_quota_us)),
            WriteFile(f"{cpuset}/cpuset.cpus", _cpu_list(host.cpuset)),
            WriteFile(f"{cpuset}/cpuset.mems", root_mems),
            WriteFile(f"{memory}/memory.limit_in_bytes", str(host.spec.memory_limit_bytes)),
        ]
    return actions


def _cgroup_v2(plan: NetnsPlan) -> list[Action]:
    (fleet_dir,) = plan.fleet_cgroup_dirs
    actions: list[Action] = [
        WriteFile(f"{CGROUP_ROOT}/cgroup.subtree_control", "+cpu +cpuset +memory"),
        MakeDir(fleet_dir),
        WriteFile(f"{fleet_dir}/cgroup.subtree_control", "+cpu +cpuset +memory"),
    ]
    for host in plan.hosts:
        (directory,) = host.cgroup_dirs
        actions += [
            MakeDir(directory),
            WriteFile(f"{directory}/cpu.max", f"{host.cpu_quota_us} {CFS_PERIOD_US}"),
            WriteFile(f"{directory}/cpuset.cpus", _cpu_list(host.cpuset)),
            WriteFile(f"{directory}/memory.max", str(host.spec.memory_limit_bytes)),
        ]
    return actions


def _cpu_list(cpus: tuple[int, ...]) -> str:
    return ",".join(str(c) for c in cpus)


def host_command(host: HostPlan, argv: list[str]) -> list[str]:
    """argv run as a process of `host`: it joins the host's cgroups, then its network namespace,
    then (when the host declares a clock offset) a new time namespace. Every step execs, so the
    pid the launcher holds is the service's own."""
    joins = " && ".join(f"echo $$ > {shlex.quote(d + '/cgroup.procs')}" for d in host.cgroup_dirs)
    command = ["sh", "-c", f'{joins} && exec "$@"', "fornax-host",
               "nsenter", f"--net=/run/netns/{host.netns}", "--"]
    if host.spec.clock_offset_s:
        command += ["unshare", "--time", "--monotonic", str(host.spec.clock_offset_s), "--"]
    return command + argv


def cgroup_dirs_leaf_first(plan: NetnsPlan) -> list[str]:
    return [d for h in plan.hosts for d in h.cgroup_dirs] + list(plan.fleet_cgroup_dirs)
