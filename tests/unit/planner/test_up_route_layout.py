"""`fornax up --fleet fleets/four-hosts.yaml --routes N|auto`: the layout the orchestrator gets
(FORNAX_ROUTE_GROUPS) is the planner's, as stage-worker indices in the file's host order."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.cli.main import main
from apps.fleet.route_layout import parse_routes, plan_layout
from apps.fleet.spec import load_fleet_spec
from libs.service.errors import InvalidArgument
from services.orchestrator.route.settings import RouteSettings

FOUR_HOSTS = Path(__file__).resolve().parents[3] / "fleets" / "four-hosts.yaml"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    assert main(["model", "make-test-checkpoint", "--preset", "tiny", "--out", str(out)]) == 0
    return out


def test_two_routes_split_the_four_hosts_and_reach_the_orchestrator_as_groups(tiny):
    layout = plan_layout(load_fleet_spec(str(FOUR_HOSTS), None), str(tiny), "2", None)
    assert len(layout.groups) == 2
    assert sorted(i for g in layout.groups for i in g) == [0, 1, 2, 3]
    assert layout.description.startswith("2 routes: ") and layout.predicted_tok_s > 0
    env = RouteSettings(route_groups=layout.groups).to_env("route_groups")
    assert RouteSettings.from_env(env).route_groups == layout.groups


def test_one_route_asked_is_no_groups(tiny):
    assert plan_layout(load_fleet_spec(str(FOUR_HOSTS), None), str(tiny), "1", None).groups == ()


def test_a_bad_route_count_is_refused():
    with pytest.raises(InvalidArgument) as refused:
        parse_routes("two")
    assert refused.value.reason == "BAD_ROUTE_COUNT"
    assert parse_routes("auto") is None and parse_routes("3") == 3


def test_up_refuses_routes_without_a_fleet_file(tmp_path, capsys):
    assert main(["up", "--routes", "2", "--state-dir", str(tmp_path)]) != 0
    assert "--routes" in capsys.readouterr().err
