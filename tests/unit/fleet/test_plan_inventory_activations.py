"""`fornax plan --fleet`: each max host's node carries the block-format activations its stage
runs (its `max_activations:`, else --max-activations, else int8), so the planner matches it only
to a stage profile of that mode; a numpy host has none."""

from __future__ import annotations

import hashlib

import pytest

from apps.cli.main import build_parser
from apps.cli.plan import FleetPlanning
from apps.fleet.plan_inventory import fleet_weights, inventory_from_fleet
from apps.fleet.spec import parse_fleet_spec


def _spec():
    hosts = [{"name": n, "backend": b, "cpu_cores": 1, "memory_limit": "2GiB", "link": {"rate": "1Gbit/s"}, **extra}
             for n, b, extra in (("own", "max", {"max_activations": "float32"}), ("plain", "max", {}),
                                 ("np", "numpy", {}))]
    return parse_fleet_spec({"version": 1, "control_host": "own", "hosts": hosts}, hashlib.sha256(b"t").hexdigest())


def _modes(default: str = "") -> dict[str, str]:
    return {n.name: n.activations for n in inventory_from_fleet(_spec(), default).inventory.nodes}


def test_each_max_host_runs_its_own_mode_else_the_flags_else_int8():
    assert _modes() == {"own": "float32", "plain": "int8", "np": ""}
    assert _modes("float32") == {"own": "float32", "plain": "float32", "np": ""}
    assert _modes("int8") == {"own": "float32", "plain": "int8", "np": ""}


def test_the_plan_output_names_each_max_hosts_mode():
    spec = _spec()
    planning = FleetPlanning("f.yaml", spec.file_sha256, inventory_from_fleet(spec), fleet_weights(spec, None), {})
    assert planning.activations == {"own": "float32", "plain": "int8"}
    assert any(line.startswith("max activations: own float32, plain int8") for line in planning.lines())
    assert planning.as_json()["max_activations"] == {"own": "float32", "plain": "int8"}


def test_fornax_plan_takes_max_activations_and_refuses_other_values(capsys):
    parser = build_parser()
    args = parser.parse_args(["plan", "--fleet", "f.yaml", "--checkpoint", "c", "--max-activations", "float32"])
    assert args.max_activations == "float32"
    assert parser.parse_args(["plan", "--fleet", "f.yaml", "--checkpoint", "c"]).max_activations is None
    with pytest.raises(SystemExit):
        parser.parse_args(["plan", "--fleet", "f.yaml", "--checkpoint", "c", "--max-activations", "fp16"])
    assert "invalid choice: 'fp16'" in capsys.readouterr().err
