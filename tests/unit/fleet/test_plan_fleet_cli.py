"""`fornax plan --fleet`: the lite fleet file's hosts, planned before any of them runs, from a
checkpoint that is only DeepSeek-V2-Lite's config.json (the planner reads no weights)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from apps.cli.main import main
from libs.model.presets import preset_config

ROOT = Path(__file__).resolve().parents[3]
LITE_FLEET = ROOT / "fleets" / "lite-three-hosts.yaml"


@pytest.fixture
def lite_checkpoint(tmp_path) -> Path:
    path = tmp_path / "lite"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(preset_config("lite", 0, 1)))
    return path


def _plan(*args: str, state_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apps.cli.main", "plan", "--fleet", str(LITE_FLEET),
                           "--state-dir", str(state_dir), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'libs' / 'api'}"})


def test_lite_fleet_refuses_bf16_per_host_and_places_q4_k_m(lite_checkpoint, tmp_path):
    state = tmp_path / "state"
    refused = _plan("--checkpoint", str(lite_checkpoint), "--weights", "bf16", state_dir=state)
    assert refused.returncode == 3, refused.stderr
    assert "infeasible [INSUFFICIENT_MEMORY]" in refused.stdout
    short = dict(re.findall(r"(\w+) holds [\d.]+ GiB of its [\d.]+ GiB share, short by ([\d.]+) GiB", refused.stdout))
    assert set(short) == {"alpha", "beta", "gamma"} and all(float(v) > 0 for v in short.values())
    assert "overrides the fleet file's alpha q4_k_m" in refused.stdout
    assert re.search(r"beta +compute .*declared estimate \(prediction\)", refused.stdout)
    assert re.search(r"alpha +memory +7\.000 GiB +contract", refused.stdout)
    assert "stored profiles: none" in refused.stdout

    placed = _plan("--checkpoint", str(lite_checkpoint), "--weights", "q4_k_m", "--json", state_dir=state)
    assert placed.returncode == 0, placed.stderr
    body = json.loads(placed.stdout)
    stages = body["plan"]["stages"]
    assert stages[0]["layer_start"] == 0 and stages[-1]["layer_end"] == 27
    assert all(a["layer_end"] == b["layer_start"] for a, b in zip(stages, stages[1:], strict=False))
    layers = {s["node"]: s["layer_end"] - s["layer_start"] for s in stages}
    assert set(layers) == {"alpha", "beta", "gamma"} and layers["alpha"] > max(layers["beta"], layers["gamma"])
    assert body["fleet"]["weights"]["policy"] == "q4_k_m" and body["fleet"]["stored_profiles"] == {}
    predictions = {(f["subject"], f["quantity"]): f["prediction"] for f in body["fleet"]["figures"]}
    assert predictions[("gamma", "compute")] and not predictions[("gamma", "memory")]
    assert not state.exists()  # planning a fleet file starts nothing and writes nothing


def test_fleet_and_inventory_are_exclusive(lite_checkpoint, capsys):
    with pytest.raises(SystemExit) as caught:
        main(["plan", "--fleet", str(LITE_FLEET), "--inventory", "x.yaml", "--checkpoint", str(lite_checkpoint)])
    assert caught.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_a_broken_fleet_file_is_an_error_with_its_reason(lite_checkpoint, tmp_path, capsys):
    broken = tmp_path / "broken.yaml"
    broken.write_text("version: 1\ncontrol_host: nobody\nhosts: []\n")
    assert main(["plan", "--fleet", str(broken), "--checkpoint", str(lite_checkpoint)]) == 2
    assert "error FLEET_FILE_INVALID: fleet file" in capsys.readouterr().err
