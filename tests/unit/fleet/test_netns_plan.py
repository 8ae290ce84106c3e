"""The kernel plan of a fleet, as values: addresses, names, cgroup writes, commands."""

from __future__ import annotations

import ipaddress

from hypothesis import given
from hypothesis import strategies as st

from apps.fleet.netns_plan import (
    CFS_PERIOD_US,
    CgroupVersion,
    MakeDir,
    Run,
    WriteFile,
    cgroup_dirs_leaf_first,
    cgroup_setup,
    host_command,
    make_plan,
    network_setup,
    subnet_for,
)
from apps.fleet.spec import parse_fleet_spec

FABRIC = ipaddress.ip_network("198.18.0.0/15")


def _spec(offset: int = 0):
    return parse_fleet_spec({
        "version": 1, "control_host": "a",
        "hosts": [
            {"name": "a", "backend": "max", "cpu_cores": 1.5, "memory_limit": "2GiB", "link": {"rate": "1Gbit/s"}},
            {"name": "b", "backend": "numpy", "cpu_cores": 0.5, "memory_limit": "1GiB",
             "link": {"rate": "200Mbit/s"}, "clock_offset_s": offset},
        ],
    }, "0" * 64)


@given(st.text("0123456789abcdef", min_size=6, max_size=6))
def test_every_address_is_in_the_benchmarking_range_and_distinct(fleet_id):
    plan = make_plan(_spec(), fleet_id, CgroupVersion.V1, (0, 1))
    addresses = [plan.bridge_address, *(h.address for h in plan.hosts)]
    assert all(ipaddress.ip_address(a) in FABRIC for a in addresses)
    assert len(set(addresses)) == len(addresses)
    assert all(ipaddress.ip_address(a) in subnet_for(fleet_id) for a in addresses)


def test_interface_names_fit_the_kernel_limit():
    plan = make_plan(_spec(), "abcdef", CgroupVersion.V1, (0, 1))
    assert all(len(name) <= 15 for name in [plan.bridge, *(h.veth_root for h in plan.hosts)])


def test_quota_and_cpuset_follow_the_declared_cores_where_the_box_has_the_cpus():
    plan = make_plan(_spec(), "abcdef", CgroupVersion.V1, (0, 1, 2, 3))
    a, b = plan.hosts
    assert (a.cpu_quota_us, b.cpu_quota_us) == (150_000, 50_000)
    assert (a.cpuset, b.cpuset, a.thread_count, b.thread_count) == ((0, 1), (2,), 2, 1)


def test_two_cpus_never_overlap_a_one_and_a_half_core_host_with_a_half_core_one():
    """Issue 31: on 2 CPUs alpha held 0-1 and beta 0, so one of MAX's threads shared CPU 0."""
    plan = make_plan(_spec(), "abcdef", CgroupVersion.V1, (0, 1))
    a, b = plan.hosts
    assert not set(a.cpuset) & set(b.cpuset)
    # alpha keeps the CPU it holds alone; its quota is cut to it, and it says so.
    assert (a.cpuset, a.cpu_quota_us, a.thread_count) == ((0,), 100_000, 1)
    assert (b.cpuset, b.cpu_quota_us, b.thread_count) == ((1,), 50_000, 1)
    assert "declared 1.5 cores" in a.cpu_share.describe()
    writes = {a.path: a.text for a in cgroup_setup(plan, "0-1", "0") if isinstance(a, WriteFile)}
    assert writes["/sys/fs/cgroup/cpu/fornax-abcdef/a/cpu.cfs_quota_us"] == "100000"


def test_v1_writes_quota_cpuset_and_memory_per_controller():
    plan = make_plan(_spec(), "abcdef", CgroupVersion.V1, (0, 1))
    writes = {a.path: a.text for a in cgroup_setup(plan, "0-1", "0") if isinstance(a, WriteFile)}
    base = "/sys/fs/cgroup/{}/fornax-abcdef/b/"
    assert writes[base.format("cpu") + "cpu.cfs_quota_us"] == "50000"
    assert writes[base.format("cpu") + "cpu.cfs_period_us"] == str(CFS_PERIOD_US)
    assert writes[base.format("memory") + "memory.limit_in_bytes"] == str(2**30)
    assert writes["/sys/fs/cgroup/cpuset/fornax-abcdef/cpuset.mems"] == "0"


def test_v2_writes_cpu_max_and_memory_max():
    plan = make_plan(_spec(), "abcdef", CgroupVersion.V2, (0, 1))
    actions = cgroup_setup(plan, "0-1", "0")
    writes = {a.path: a.text for a in actions if isinstance(a, WriteFile)}
    assert writes["/sys/fs/cgroup/fornax-abcdef/b/cpu.max"] == f"50000 {CFS_PERIOD_US}"
    assert writes["/sys/fs/cgroup/fornax-abcdef/a/memory.max"] == str(2 * 2**30)
    dirs = [a.path for a in actions if isinstance(a, MakeDir)]
    assert dirs.index("/sys/fs/cgroup/fornax-abcdef") < dirs.index("/sys/fs/cgroup/fornax-abcdef/a")


def test_network_setup_shapes_both_directions_of_every_link():
    plan = make_plan(_spec(), "abcdef", CgroupVersion.V1, (0, 1))
    commands = [a.argv for a in network_setup(plan) if isinstance(a, Run)]
    tbf = [c for c in commands if "tbf" in c]
    assert len(tbf) == 4
    assert any(plan.hosts[1].veth_root in c and "200000000bit" in c for c in tbf)
    assert any(plan.hosts[1].netns in c and "eth0" in c and "200000000bit" in c for c in tbf)
    assert commands[0] == ("ip", "link", "add", plan.bridge, "type", "bridge")


def test_host_command_joins_cgroups_then_namespace_then_clock():
    plan = make_plan(_spec(offset=3600), "abcdef", CgroupVersion.V1, (0, 1))
    a, b = plan.hosts
    argv = host_command(b, ["python", "-m", "services.stage_worker"])
    assert argv[:2] == ["sh", "-c"] and all(d + "/cgroup.procs" in argv[2] for d in b.cgroup_dirs)
    assert argv[argv.index("nsenter") + 1] == f"--net=/run/netns/{b.netns}"
    assert argv[argv.index("unshare"):argv.index("unshare") + 4] == ["unshare", "--time", "--monotonic", "3600"]
    assert argv[-3:] == ["python", "-m", "services.stage_worker"]
    assert "unshare" not in host_command(a, ["python"])


def test_teardown_removes_host_cgroups_before_the_fleet_cgroup():
    plan = make_plan(_spec(), "abcdef", CgroupVersion.V1, (0, 1))
    order = cgroup_dirs_leaf_first(plan)
    assert order.index("/sys/fs/cgroup/cpu/fornax-abcdef/a") < order.index("/sys/fs/cgroup/cpu/fornax-abcdef")
