import json
from pathlib import Path

import pytest

from apps.bench.planner import synthetic_config
from apps.cli.main import main

EXAMPLES = Path(__file__).resolve().parents[3] / "services" / "planner" / "examples"


@pytest.fixture
def checkpoint(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(synthetic_config(27, experts=64, top_k=6)))
    return tmp_path


def test_plan_table_lists_stages_costs_and_rejections(checkpoint, capsys):
    rc = main(["plan", "--checkpoint", str(checkpoint), "--inventory", str(EXAMPLES / "mixed_fleet.yaml")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "exploratory" in out and "compute_ms" in out and "wire_us" in out and "queue_ms" in out
    assert "predictions (cost model, not measurements)" in out
    assert "cpu-server" in out and "MISSING_DTYPE" in out
    assert "[0, " in out and ", 27)" in out
    assert "27 layers" in out and "64 routed experts top-6 + 2 shared" in out


def test_plan_json_is_complete(checkpoint, capsys):
    rc = main(["plan", "--checkpoint", str(checkpoint), "--inventory", str(EXAMPLES / "mixed_fleet.yaml"), "--json"])
    body = json.loads(capsys.readouterr().out)
    assert rc == 0 and body["feasible"]
    stages = body["plan"]["stages"]
    assert stages[0]["layer_start"] == 0 and stages[-1]["layer_end"] == 27
    assert {"compute_s", "pack_s", "wire_s", "unpack_s", "queue_s", "exposed_wait_s"} <= set(stages[0]["decode"])
    assert body["plan"]["label"].startswith("exploratory")
    assert body["rejections"][0]["reason"] == "MISSING_DTYPE"
    model = body["model"]
    assert model["layers"] == 27 and 0 < model["active_weight_bytes_per_token"] < model["weight_bytes"]


def test_infeasible_and_error_exit_codes(checkpoint, tmp_path, capsys):
    big = tmp_path / "big"
    big.mkdir()
    (big / "config.json").write_text(json.dumps(synthetic_config(400, experts=64, top_k=6)))
    assert main(["plan", "--checkpoint", str(big), "--inventory", str(EXAMPLES / "mixed_fleet.yaml")]) == 3
    assert "INSUFFICIENT_MEMORY" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: []\n")
    assert main(["plan", "--checkpoint", str(checkpoint), "--inventory", str(bad)]) == 2
    assert "field nodes" in capsys.readouterr().err


def test_deployment_mode_without_a_registry_is_an_error(checkpoint, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no local fleet state here
    rc = main(["plan", "--checkpoint", str(checkpoint), "--inventory", str(EXAMPLES / "deployment_fleet.yaml")])
    assert rc == 2 and "NO_EVIDENCE_REGISTRY" in capsys.readouterr().err


def test_bench_reports_the_keys(capsys, monkeypatch):
    import apps.bench.planner as bench

    monkeypatch.setattr(bench, "_timed", lambda *a, **k: 0.01)  # keep the unit test light
    rc = main(["bench", "planner", "--json", "--instances", "20"])
    body = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert body["brute_force_agreement"] == 1.0 and body["brute_force_instances"] == 20
    assert {"plan_6x48_s", "plan_64x128_s"} <= set(body) and body["evidence"]["class"] == "physical"
