"""`fornax up --fleet`: build the hosts, start their services, remove the hosts on failure."""

from __future__ import annotations

import sys

from apps.fleet.launcher import FleetOptions, Launcher, LaunchError
from apps.fleet.netns import IsolationFailed, set_up, tear_down
from apps.fleet.netns_compose import start_netns_fleet
from apps.fleet.spec import FleetSpec
from libs.service.fleet_state import FleetState


def start_isolated_fleet(options: FleetOptions, spec: FleetSpec,
                         reference_hosts: frozenset[str] = frozenset()) -> tuple[FleetState, Launcher]:
    plan = set_up(spec, options.state_dir)
    for host in plan.hosts:  # a CPU shared or a quota cut short is stated, never silent
        print(f"cpu {host.cpu_share.describe()}", file=sys.stderr)
    try:
        return start_netns_fleet(options, spec, plan, reference_hosts)
    except (LaunchError, OSError, KeyboardInterrupt) as exc:
        left = tear_down(options.state_dir)
        if left:
            raise IsolationFailed(f"{exc}; and teardown left {', '.join(left)}") from exc
        raise
