"""`fornax host add` before anything starts: two adds serialize on the hosts lock, a host the
file does not name, that runs no stage, that already runs, or whose worker name is another
host's is refused with its reason; only the joining host's setup actions run; the proposal is a
diff against the serving routes."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from apps.cli.main import main
from apps.fleet.host_join import (
    applicable,
    host_actions,
    hosts_lock,
    joining_alone,
    joining_host,
    propose,
    running_hosts,
)
from apps.fleet.netns import TeardownRecord, fleet_id_for, write_record
from apps.fleet.netns_plan import CgroupVersion, MakeDir, Run, WriteFile, cgroup_setup, make_plan, network_setup
from apps.fleet.route_layout import plan_layout
from apps.fleet.spec import load_fleet_spec
from libs.service.errors import FailedPrecondition, NotFound

FIVE_HOSTS = Path(__file__).resolve().parents[3] / "fleets" / "five-hosts.yaml"
WORKERS = ["orchestrator", "stage_worker_0", "stage_worker_1", "stage_worker_2", "stage_worker_3"]


def test_two_adds_serialize_on_the_hosts_lock(tmp_path):
    events: list[str] = []

    def add(name: str) -> None:
        with hosts_lock(tmp_path):
            events.append(f"{name} in")
            time.sleep(0.2)
            events.append(f"{name} out")

    first = threading.Thread(target=add, args=("a",))
    first.start()
    time.sleep(0.05)
    second = threading.Thread(target=add, args=("b",))
    second.start()
    first.join(5)
    second.join(5)
    assert events == ["a in", "a out", "b in", "b out"]


def test_the_joining_host_gets_its_place_among_the_stage_hosts():
    spec = load_fleet_spec(FIVE_HOSTS)
    host, index = joining_host(spec, "epsilon", ["alpha", "beta", "gamma", "delta"], WORKERS)
    assert (host.name, index) == ("epsilon", 4)


@pytest.mark.parametrize(("name", "running", "services", "error", "reason"), [
    ("zeta", [], WORKERS, NotFound, "HOST_NOT_IN_FLEET_FILE"),
    ("delta", ["alpha", "beta", "gamma", "delta"], WORKERS, FailedPrecondition, "HOST_ALREADY_IN_FLEET"),
    ("epsilon", [], [*WORKERS, "stage_worker_4"], FailedPrecondition, "WORKER_NAME_TAKEN"),
])
def test_a_join_that_cannot_be_is_refused_with_its_reason(name, running, services, error, reason):
    with pytest.raises(error) as refused:
        joining_host(load_fleet_spec(FIVE_HOSTS), name, running, services)
    assert refused.value.reason == reason


def test_running_hosts_are_the_ones_the_fleet_built(tmp_path):
    spec = load_fleet_spec(FIVE_HOSTS)
    fleet_id = fleet_id_for(tmp_path)
    write_record(tmp_path, TeardownRecord((f"fornax-{fleet_id}-alpha", f"fornax-{fleet_id}-delta"), (), ()))
    assert running_hosts(spec, tmp_path) == ["alpha", "delta"]


def test_only_the_joining_hosts_setup_runs():
    plan = make_plan(load_fleet_spec(FIVE_HOSTS), "abc123", CgroupVersion.V2, (0, 1))
    epsilon = plan.host("epsilon")
    actions = host_actions(plan, epsilon, [*cgroup_setup(plan, "0-1", "0"), *network_setup(plan)])
    assert any(isinstance(a, MakeDir) and a.path == epsilon.cgroup_dirs[0] for a in actions)
    assert all(isinstance(a, Run) and (epsilon.netns in a.argv or epsilon.veth_root in a.argv)
               or isinstance(a, (MakeDir, WriteFile)) and a.path.startswith(epsilon.cgroup_dirs[0])
               for a in actions)
    assert not any(isinstance(a, Run) and "bridge" in a.argv for a in actions)  # the bridge is there
    assert sum(isinstance(a, Run) for a in actions) == 10  # namespace, veth, address, routes, shaping


def test_the_proposal_is_a_diff_against_the_serving_routes():
    diff = propose([("alpha", "beta"), ("gamma", "delta")], [("alpha", "beta"), ("gamma", "delta", "epsilon")])
    assert diff.lines() == ("= alpha>beta", "- gamma>delta", "+ gamma>delta>epsilon")


def test_apply_takes_only_a_proposal_that_removes_no_serving_route():
    serving = [("alpha", "beta"), ("gamma", "delta")]
    assert applicable(propose(serving, [*serving, ("epsilon",)])) == (("epsilon",),)
    with pytest.raises(FailedPrecondition) as refused:
        applicable(propose(serving, [("alpha", "beta", "gamma", "delta"), ("epsilon",)]))
    assert refused.value.reason == "APPLY_WOULD_REMOVE_ROUTES"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    assert main(["model", "make-test-checkpoint", "--preset", "tiny", "--out", str(out)]) == 0
    return out


def test_keep_serving_plans_routes_on_the_joining_host_alone(tiny):
    spec = load_fleet_spec(FIVE_HOSTS)
    alone = joining_alone(spec, spec.host("epsilon"))
    assert [h.name for h in alone.stage_hosts] == ["epsilon"] and alone.control_host == "epsilon"
    layout = plan_layout(alone, str(tiny), "auto", None)
    assert layout.routes == (("epsilon",),) and layout.groups == ()
    serving = [("alpha", "beta"), ("gamma", "delta")]
    assert propose(serving, [*serving, *layout.routes]).lines() == ("= alpha>beta", "= gamma>delta", "+ epsilon")
