"""`fornax plan --routes` on fleets/four-hosts.yaml with a generated tiny checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apps.cli.main import main

FOUR_HOSTS = Path(__file__).resolve().parents[3] / "fleets" / "four-hosts.yaml"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    assert main(["model", "make-test-checkpoint", "--preset", "tiny", "--out", str(out)]) == 0
    return out


def _plan(tiny, tmp_path, *extra):
    return main(["plan", "--fleet", str(FOUR_HOSTS), "--checkpoint", str(tiny), "--state-dir", str(tmp_path),
                 *extra])


def test_routes_auto_explains_every_layout_and_the_choice(tiny, tmp_path, capsys):
    capsys.readouterr()
    assert _plan(tiny, tmp_path, "--routes", "auto", "--explain", "--concurrency", "64") == 0
    out = capsys.readouterr().out
    assert "1 route: alpha>beta>gamma>delta" in out
    assert "2 routes: alpha>beta | gamma>delta" in out
    assert out.count("tokens/s (prediction") >= 15  # every one of the 15 layouts is feasible here
    assert "route choice: " in out and "(predictions)" in out
    chosen = [line for line in out.splitlines() if line.startswith(" * ")]
    assert len(chosen) == 1


def test_routes_auto_json_matches_the_argmax(tiny, tmp_path, capsys):
    capsys.readouterr()
    assert _plan(tiny, tmp_path, "--routes", "auto", "--json", "--concurrency", "64") == 0
    body = json.loads(capsys.readouterr().out)
    choice = body["route_choice"]
    tokens = [c["tokens_per_s"] for c in choice["candidates"] if c["feasible"]]
    assert choice["candidates"][choice["chosen"]]["tokens_per_s"] == max(tokens)
    assert body["plan"] == body["routes"][0]["plan"] | {"label": body["plan"]["label"]}
    assert sum(r["concurrency"] for r in body["routes"]) == 64


def test_default_is_one_route_and_unchanged(tiny, tmp_path, capsys):
    capsys.readouterr()
    assert _plan(tiny, tmp_path, "--json") == 0
    body = json.loads(capsys.readouterr().out)
    assert body["route_choice"] is None and body["routes"] == []
    assert len(body["plan"]["stages"]) == 4


def test_two_routes_asked_and_bad_counts(tiny, tmp_path, capsys):
    capsys.readouterr()
    assert _plan(tiny, tmp_path, "--routes", "2", "--json") == 0
    body = json.loads(capsys.readouterr().out)
    assert len(body["routes"]) == 2
    assert _plan(tiny, tmp_path, "--routes", "0") == 2
    assert "BAD_OPTIONS" in capsys.readouterr().err
    assert _plan(tiny, tmp_path, "--routes", "5") == 2
    assert "BAD_ROUTE_COUNT" in capsys.readouterr().err
