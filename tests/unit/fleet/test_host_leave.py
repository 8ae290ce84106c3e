"""`fornax host drain` on the fleet's side: a host's stage worker is found by host or service
name (an unknown one is refused with what there is), a retired worker is never restarted by the
supervisor, and stopping it drops it from the fleet file."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from apps.cli.host import drain_report
from apps.fleet.host_leave import (
    HostLookupError,
    clear_retired,
    host_names,
    retire_service,
    retired_services,
    stage_worker_of,
    stop_retired_worker,
)
from apps.fleet.launcher import ServiceProcess
from apps.fleet.route_status import IDLE, RouteReport, idle_outside_routes
from apps.fleet.supervisor import FleetSupervisor
from fornax.orchestrator.v1 import orchestrator_pb2 as pb
from libs.service.fleet_state import FleetState, ServiceEntry, read_fleet, write_fleet


def _entry(name: str, kind: str, grpc: str, pid: int = 0) -> ServiceEntry:
    return ServiceEntry(name, kind, grpc, "", pid, "")


STATE = FleetState((_entry("orchestrator", "orchestrator", "10.0.0.1:1"),
                    _entry("stage_worker_0", "stage_worker", "10.0.0.1:2"),
                    _entry("stage_worker_1", "stage_worker", "10.0.0.2:2")))


def _hosts(tmp_path: Path) -> Path:
    for host, service in (("alpha", "stage_worker_0"), ("beta", "stage_worker_1")):
        (tmp_path / "hosts" / host / service).mkdir(parents=True)
    (tmp_path / "hosts" / "alpha" / "orchestrator").mkdir()
    return tmp_path


def test_a_host_is_found_by_its_name_or_its_worker_service(tmp_path):
    state_dir = _hosts(tmp_path)
    assert stage_worker_of(STATE, state_dir, "beta").name == "stage_worker_1"
    assert stage_worker_of(STATE, state_dir, "stage_worker_0").grpc == "10.0.0.1:2"
    assert host_names(STATE, state_dir) == {"10.0.0.1:2": "alpha", "10.0.0.2:2": "beta"}


def test_a_reference_worker_beside_a_hosts_stage_worker_is_not_the_hosts_worker(tmp_path):
    state_dir = _hosts(tmp_path)
    (state_dir / "hosts" / "alpha" / "stage_worker_0_reference").mkdir()
    state = FleetState((*STATE.services, _entry("stage_worker_0_reference", "stage_worker", "10.0.0.1:3")))
    assert stage_worker_of(state, state_dir, "alpha").name == "stage_worker_0"
    assert host_names(state, state_dir) == {"10.0.0.1:2": "alpha", "10.0.0.2:2": "beta",
                                            "10.0.0.1:3": "stage_worker_0_reference"}


def test_an_unknown_host_is_refused_naming_the_hosts_there_are(tmp_path):
    with pytest.raises(HostLookupError, match="hosts: alpha, beta"):
        stage_worker_of(STATE, _hosts(tmp_path), "epsilon")


def test_retired_services_accumulate_and_a_fresh_fleet_clears_them(tmp_path):
    assert retired_services(tmp_path) == frozenset()
    retire_service(tmp_path, "stage_worker_1")
    retire_service(tmp_path, "stage_worker_3")
    assert retired_services(tmp_path) == {"stage_worker_1", "stage_worker_3"}
    assert [p.name for p in tmp_path.iterdir()] == ["retired.json"]  # no temporary file left
    clear_retired(tmp_path)
    assert retired_services(tmp_path) == frozenset()


class _Launcher:
    def __init__(self, names: list[str]) -> None:
        self.started = [SimpleNamespace(spec=ServiceProcess(n, "stage_worker", "services.stage_worker", {}), ports={},
                                        process=SimpleNamespace(poll=lambda: 1, returncode=1)) for n in names]
        self.spawned: list[str] = []

    def spawn(self, spec):
        self.spawned.append(spec.name)
        raise OSError("the test spawns nothing")


def test_the_supervisor_never_restarts_a_retired_worker_but_restarts_the_others():
    launcher = _Launcher(["stage_worker_0", "stage_worker_1"])
    supervisor = FleetSupervisor(launcher, poll_s=0.01,  # type: ignore[arg-type]
                                 keep_down=lambda: frozenset({"stage_worker_1"})).start()
    time.sleep(0.2)
    supervisor.stop()
    assert "stage_worker_1" not in launcher.spawned and "stage_worker_0" in launcher.spawned
    assert all(s.spec.name != "stage_worker_1" for s in launcher.started)


def test_stopping_a_retired_worker_marks_it_stops_it_and_drops_it_from_the_fleet_file(tmp_path):
    # A stand-in worker whose command line names a fleet service, as stop_processes requires.
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "services.stage_worker"])
    try:
        worker = _entry("stage_worker_1", "stage_worker", "10.0.0.2:2", process.pid)
        state = FleetState((*STATE.services[:2], worker))
        write_fleet(tmp_path, state)
        killed = stop_retired_worker(tmp_path, state, worker, grace_period_s=5.0)
        assert process.wait(10) is not None and not killed
    finally:
        process.kill()
    assert retired_services(tmp_path) == {"stage_worker_1"}
    left = read_fleet(tmp_path)
    assert left is not None and [s.name for s in left.services] == ["orchestrator", "stage_worker_0"]


def test_the_drain_report_names_hosts_counts_and_the_gap():
    reply = pb.DrainHostResponse(
        removed_routes=[pb.RouteWorkers(worker_addresses=["10.0.0.3:2", "10.0.0.2:2"])], finished_requests=1,
        handed_off_requests=2, ended_requests=0, largest_gap_ns=1_250_000_000, stored_route_set="/s/route_set.json",
        status=pb.PlanStatus(stages=[pb.StageStatus(worker_address="10.0.0.1:2")]))
    lines = drain_report("beta", reply, {"10.0.0.1:2": "alpha", "10.0.0.2:2": "beta"}, "stage_worker_1", False)
    assert lines[0] == "host beta drained: routes removed: 10.0.0.3:2>beta"
    assert lines[1] == "routes serving: alpha"
    assert "2 handed off" in lines[2] and "1.250 s" in lines[3] and lines[-1].endswith("/s/route_set.json")


def test_a_worker_in_no_serving_route_is_idle_not_a_fault():
    stages = {"stage_worker_0": "READY", "stage_worker_2": "EMPTY"}
    addresses = {"stage_worker_0": "10.0.0.1:2", "stage_worker_2": "10.0.0.3:2"}
    shown = idle_outside_routes(stages, addresses, {"10.0.0.1:2"})
    assert shown == {"stage_worker_0": "READY", "stage_worker_2": IDLE}
    assert RouteReport("SERVING", "", shown).healthy
    assert idle_outside_routes(stages, addresses, set()) == stages  # nothing serves yet: as they are
    assert not RouteReport("SERVING", "", {"stage_worker_0": "EMPTY"}).healthy
