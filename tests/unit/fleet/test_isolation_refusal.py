"""Without root, `--fleet` refuses with a clear error rather than running on one host."""

from __future__ import annotations

import pytest
import yaml

from apps.cli.main import main
from apps.fleet import netns
from apps.fleet.spec import parse_fleet_spec

SPEC = {"version": 1, "control_host": "a",
        "hosts": [{"name": "a", "backend": "numpy", "cpu_cores": 1, "memory_limit": "1GiB",
                   "link": {"rate": "1Gbit/s"}}]}


def test_require_isolation_refuses_without_root(monkeypatch):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    with pytest.raises(netns.IsolationUnavailable, match="needs root"):
        netns.require_isolation(parse_fleet_spec(SPEC, "0" * 64))


def test_up_with_a_fleet_file_fails_closed_without_root(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    fleet = tmp_path / "f.yaml"
    fleet.write_text(yaml.safe_dump(SPEC))
    code = main(["up", "--fleet", str(fleet), "--state-dir", str(tmp_path / ".fornax")])
    assert code == 2
    assert "needs root" in capsys.readouterr().err
    assert not (tmp_path / ".fornax" / "fleet.json").exists()


def test_up_refuses_stage_and_backend_flags_beside_a_fleet_file(tmp_path, capsys):
    fleet = tmp_path / "f.yaml"
    fleet.write_text(yaml.safe_dump(SPEC))
    code = main(["up", "--fleet", str(fleet), "--backend", "max", "--state-dir", str(tmp_path / ".fornax")])
    assert code == 2
    assert "drop --stages and --backend" in capsys.readouterr().err


def test_a_fleet_file_that_fails_its_schema_is_refused_before_anything_starts(tmp_path, capsys):
    fleet = tmp_path / "f.yaml"
    fleet.write_text(yaml.safe_dump({**SPEC, "control_host": "nowhere"}))
    code = main(["up", "--fleet", str(fleet), "--state-dir", str(tmp_path / ".fornax")])
    assert code == 2
    assert "control_host" in capsys.readouterr().err
    assert not (tmp_path / ".fornax" / "netns.json").exists()
