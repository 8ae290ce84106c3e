"""`fornax host add NAME --fleet FILE`: a host of the fleet file joins the running netns fleet.

Two adds serialize on an `fcntl` lock of `<state>/hosts.lock`. The host must be a stage host of
the file that the running fleet does not hold (else refused with a reason, nothing started).
The layout the join proposes is planned first, from the file's declared figures (a prediction
of the cost model; `--profile` profiles the host once it runs: apps/fleet/join_checks.py), and
shown as a diff against the serving routes; a layout that does not fit refuses the join before
anything starts. The host is then built like `fornax
up` builds one (its namespace on the fleet's bridge, its cgroups, its link shaping; recorded in
`<state>/netns.json` first, so `fornax down` removes it) and its stage worker started in it with
a certificate of the fleet CA (node admission as for every worker: a certificate the fleet CA did
not issue is refused); it is added to `fleet.json`. It serves no route until a layout is applied.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from apps.fleet.launcher import FleetOptions, Launcher
from apps.fleet.netns import (
    RECORD_FILE,
    TeardownRecord,
    apply_action,
    fleet_id_for,
    read_record,
    require_isolation,
    root_cpuset,
    write_record,
)
from apps.fleet.netns_compose import worker_process
from apps.fleet.netns_plan import (
    Action,
    HostPlan,
    MakeDir,
    NetnsPlan,
    Run,
    WriteFile,
    cgroup_setup,
    make_plan,
    netns_name,
    network_setup,
)
from apps.fleet.spec import FleetSpec, HostSpec
from libs.service.errors import FailedPrecondition, NotFound
from libs.service.fleet_state import FleetState, ServiceEntry, write_fleet
from services.orchestrator.route.host_change import LayoutDiff, Route, diff_layouts

LOCK_FILE = "hosts.lock"


@contextmanager
def hosts_lock(state_dir: Path) -> Iterator[None]:
    """Held for a whole join: a second `host add` of the same state directory waits for it."""
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def joining_host(spec: FleetSpec, name: str, running: Sequence[str], services: Sequence[str]) -> tuple[HostSpec, int]:
    """The host and its stage worker's index (its place among the file's stage hosts). Refused:
    HOST_NOT_IN_FLEET_FILE, HOST_RUNS_NO_STAGE, HOST_ALREADY_IN_FLEET (`running` hosts, a drained
    one included), WORKER_NAME_TAKEN (its `stage_worker_N` is another host's service)."""
    names = [h.name for h in spec.hosts]
    if name not in names:
        raise NotFound(f"host {name!r} is not in the fleet file (hosts: {', '.join(names)})",
                       reason="HOST_NOT_IN_FLEET_FILE")
    host = spec.hosts[names.index(name)]
    if not host.stage_worker:
        raise FailedPrecondition(f"host {name!r} runs no stage worker", reason="HOST_RUNS_NO_STAGE")
    if name in running:
        raise FailedPrecondition(f"host {name!r} is already in the running fleet", reason="HOST_ALREADY_IN_FLEET")
    index = spec.stage_hosts.index(host)
    if f"stage_worker_{index}" in services:
        raise FailedPrecondition(f"stage_worker_{index} (host {name!r}'s place in the file) is another host's "
                                 "worker: list the joining hosts after the running ones", reason="WORKER_NAME_TAKEN")
    return host, index


def propose(serving: Sequence[Route], proposed: Sequence[Route]) -> LayoutDiff:
    """The join's layout change against the serving routes (both by host names)."""
    return diff_layouts(serving, proposed)


def joining_alone(spec: FleetSpec, host: HostSpec) -> FleetSpec:
    """The file cut to the joining host: `--keep-serving` plans its routes on it alone."""
    return dataclasses.replace(spec, hosts=(host,), control_host=host.name, hop_dtypes=spec.hop_dtypes[:0])


def applicable(diff: LayoutDiff) -> tuple[Route, ...]:
    """The routes `--apply` adds: only a diff that removes nothing is applied (re-placing a
    serving route is not built); else refused with APPLY_WOULD_REMOVE_ROUTES."""
    if diff.removed:
        raise FailedPrecondition("the proposal removes serving routes "
                                 f"({', '.join('>'.join(r) for r in diff.removed)}); --apply only adds routes "
                                 "(--keep-serving proposes routes on the joining host alone)",
                                 reason="APPLY_WOULD_REMOVE_ROUTES")
    return diff.added


def host_actions(plan: NetnsPlan, host: HostPlan, actions: Sequence[Action]) -> list[Action]:
    """The actions of `fornax up`'s setup that build `host` alone (not the bridge, not the
    fleet's cgroups, not another host)."""
    def mine(action: Action) -> bool:
        if isinstance(action, Run):
            return host.netns in action.argv or host.veth_root in action.argv
        path = action.path
        return any(path == d or path.startswith(d + "/") for d in host.cgroup_dirs)

    return [a for a in actions if isinstance(a, (Run, MakeDir, WriteFile)) and mine(a)]


def running_hosts(spec: FleetSpec, state_dir: Path) -> list[str]:
    """The file's hosts the running fleet built (drained ones too: their namespaces stay)."""
    record = read_record(state_dir)
    namespaces = set(record.namespaces) if record else set()
    return [h.name for h in spec.hosts if netns_name(fleet_id_for(state_dir), h.name) in namespaces]


def set_up_host(spec: FleetSpec, state_dir: Path, name: str) -> HostPlan:
    """Builds one host of the file beside the running fleet's; recorded before it is built."""
    version = require_isolation(spec)
    plan = make_plan(spec, fleet_id_for(state_dir), version, tuple(sorted(os.sched_getaffinity(0))))
    host = plan.host(name)
    record = read_record(state_dir)
    if record is None:
        raise FailedPrecondition(f"no {RECORD_FILE} in {state_dir}: the running fleet is not a netns fleet",
                                 reason="NOT_A_NETNS_FLEET")
    write_record(state_dir, TeardownRecord(
        (*record.namespaces, host.netns), (*record.links, host.veth_root),
        (*host.cgroup_dirs, *record.cgroup_dirs)))  # leaf first: the host's before the fleet's
    root_cpus, root_mems = root_cpuset()
    for action in host_actions(plan, host, [*cgroup_setup(plan, root_cpus, root_mems), *network_setup(plan)]):
        apply_action(action)
    return host


def start_worker(options: FleetOptions, state: FleetState, host: HostPlan,
                 index: int) -> tuple[FleetState, ServiceEntry]:
    """Starts the host's stage worker and waits until it is SERVING; the fleet file gains it."""
    launcher = Launcher(options)
    started = launcher.spawn(worker_process(options, host, index))
    launcher.wait_ready([started])
    entry = started.entry()
    joined = dataclasses.replace(state, services=(*state.services, entry))
    write_fleet(options.state_dir, joined)
    return joined, entry
