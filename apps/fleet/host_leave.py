"""`fornax host drain`, on the fleet's side: which stage worker a host runs, the list of
services the fleet supervisor keeps down, and the worker's stop once its routes have left.

A netns fleet keeps each host's services under `<state>/hosts/<host>/<service>`, so a host's
stage worker is found by name; a local fleet's workers are named as services (`stage_worker_1`).
`<state>/retired.json` lists the services taken out on purpose: the supervisor (in the keeper
or a foreground `fornax up`) never restarts one, whatever its exit. It is written whole or not
at all (temporary file, fsync, rename).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from apps.fleet.launcher import stop_processes
from apps.fleet.reference import is_reference_name
from libs.service.fleet_state import FleetState, ServiceEntry, write_fleet

RETIRED_FILE = "retired.json"


class HostLookupError(LookupError):
    """No stage worker of that name in the running fleet; the message lists what there is."""


def stage_hosts(state: FleetState, state_dir: Path) -> dict[str, ServiceEntry]:
    """Host name -> its stage worker, for a netns fleet's hosts that run one (a reference worker
    serving beside it while MAX graphs compile is not the host's stage worker)."""
    workers = {s.name: s for s in state.services if s.kind == "stage_worker" and not is_reference_name(s.name)}
    hosts: dict[str, ServiceEntry] = {}
    for host_dir in sorted((state_dir / "hosts").glob("*")):
        names = [d.name for d in sorted(host_dir.glob("stage_worker_*")) if d.name in workers]
        if len(names) == 1:
            hosts[host_dir.name] = workers[names[0]]
    return hosts


def stage_worker_of(state: FleetState, state_dir: Path, name: str) -> ServiceEntry:
    """The stage worker of host `name` (a netns fleet) or of that service name (any fleet)."""
    hosts = stage_hosts(state, state_dir)
    workers = {s.name: s for s in state.services if s.kind == "stage_worker"}
    found = hosts.get(name) or workers.get(name)
    if found is None:
        raise HostLookupError(f"no stage worker of host {name!r} in this fleet (hosts: "
                              f"{', '.join(sorted(hosts)) or 'none'}; stage workers: {', '.join(workers) or 'none'})")
    return found


def host_names(state: FleetState, state_dir: Path) -> dict[str, str]:
    """Stage worker address -> the name to print: its host's, else its service's."""
    names = {s.grpc: s.name for s in state.services if s.kind == "stage_worker"}
    names |= {entry.grpc: host for host, entry in stage_hosts(state, state_dir).items()}
    return names


def retired_services(state_dir: Path) -> frozenset[str]:
    try:
        return frozenset(json.loads((state_dir / RETIRED_FILE).read_text(encoding="utf-8")))
    except FileNotFoundError:
        return frozenset()


def retire_service(state_dir: Path, name: str) -> None:
    """Adds `name` to the services the supervisor keeps down."""
    names = sorted(retired_services(state_dir) | {name})
    temporary = state_dir / f".{RETIRED_FILE}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(names, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, state_dir / RETIRED_FILE)


def stop_retired_worker(state_dir: Path, state: FleetState, worker: ServiceEntry, grace_period_s: float) -> bool:
    """Marks `worker` retired, stops it (SIGTERM, SIGKILL after the grace period) and drops it
    from the fleet file; True when it needed SIGKILL."""
    retire_service(state_dir, worker.name)
    killed = stop_processes([(worker.name, worker.pid)], grace_period_s)
    write_fleet(state_dir, dataclasses.replace(
        state, services=tuple(s for s in state.services if s.name != worker.name)))
    return bool(killed)


def clear_retired(state_dir: Path) -> None:
    """A fresh fleet of this state directory starts with every service supervised."""
    (state_dir / RETIRED_FILE).unlink(missing_ok=True)
