"""`fornax up --checkpoint FILE.gguf` serves the file's own formats on numpy or MAX stages, and on a
fleet file's hosts: a weight policy beside a GGUF (flag or a host's `weights:`), and MAX stages
that would serve on numpy while compiling, are refused before anything starts; what it serves
with passes validation."""

from __future__ import annotations

import pytest
import yaml

from apps.cli import fleet as fleet_cli
from apps.cli.main import main
from apps.fleet import netns


@pytest.fixture
def gguf(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    return path


@pytest.mark.parametrize("flags, said", [
    (["--weights", "q4_k_m"], "drop --weights"),
    (["--backend", "max"], "add --no-serve-while-compiling"),
])
def test_up_refuses_what_a_gguf_cannot_be_served_with(tmp_path, capsys, gguf, flags, said):
    code = main(["up", "--checkpoint", str(gguf), *flags, "--state-dir", str(tmp_path / ".fornax")])
    assert code == 2
    err = capsys.readouterr().err
    assert "is a GGUF" in err and said in err
    assert not (tmp_path / ".fornax" / "fleet.json").exists()


@pytest.mark.parametrize("flags", [
    [], ["--backend", "numpy"], ["--backend", "max", "--no-serve-while-compiling"], ["--weights", "fp32"],
])
def test_a_gguf_passes_validation_on_numpy_and_on_max_stages_that_wait_for_their_compiles(gguf, tmp_path, flags):
    args = _up_args(tmp_path, ["--checkpoint", str(gguf), *flags])
    assert fleet_cli._validate_up(args) is None


def _fleet_file(tmp_path, weights=None):
    host = {"backend": "max", "cpu_cores": 1, "memory_limit": "1GiB", "link": {"rate": "1Gbit/s"}}
    policy = {"weights": weights} if weights else {}
    hosts = [{"name": "a", **host, "backend": "numpy"}, {"name": "b", **host, **policy}]
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "control_host": "a", "hosts": hosts}))
    return path


def test_a_fleet_host_weight_policy_beside_a_gguf_is_refused_before_isolation(tmp_path, capsys, gguf):
    code = main(["up", "--fleet", str(_fleet_file(tmp_path, "q8_0")), "--checkpoint", str(gguf),
                 "--state-dir", str(tmp_path / ".fornax")])
    assert code == 2
    err = capsys.readouterr().err
    assert "is a GGUF" in err and "drop `weights:` from host(s) b" in err


def test_a_gguf_on_a_fleet_file_goes_on_to_isolation(tmp_path, capsys, gguf, monkeypatch):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)  # the next check: the refusal names root
    code = main(["up", "--fleet", str(_fleet_file(tmp_path)), "--checkpoint", str(gguf),
                 "--state-dir", str(tmp_path / ".fornax")])
    assert code == 2
    err = capsys.readouterr().err
    assert "needs root" in err and "is a GGUF" not in err


def _up_args(tmp_path, argv):
    import argparse

    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command")
    fleet_cli.register(commands, None)
    return parser.parse_args(["up", "--state-dir", str(tmp_path / ".fornax"), *argv])
