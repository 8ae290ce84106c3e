"""`fornax plan --fleet`: the lite fleet file's hosts, planned before any of them runs, from a
checkpoint that is only DeepSeek-V2-Lite's config.json (the planner reads no weights)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from apps.cli.main import main
from libs.model.presets import preset_config
from libs.profiles.schema import to_json
from services.evidence_registry.blobs import DiskBlobStore
from services.evidence_registry.domain import EvidenceClass, Record, RecordContent, RecordStatus, RecordType
from services.evidence_registry.sqlite_store import SqliteRecordStore
from services.planner.model import describe_checkpoint
from tests.unit.planner.profile_factories import stage_profile, stage_record

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
                           "--state-dir", str(state_dir), *args], capture_output=True, text=True,
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


@pytest.mark.parametrize("extra", [["--replan"], ["--profiles"]])
def test_options_that_need_a_running_fleet_or_an_inventory_are_refused(lite_checkpoint, capsys, extra):
    assert main(["plan", "--fleet", str(LITE_FLEET), "--checkpoint", str(lite_checkpoint), *extra]) == 2
    assert "error BAD_OPTIONS" in capsys.readouterr().err


def test_deployment_mode_without_a_registry_fails_closed(lite_checkpoint, tmp_path, capsys):
    rc = main(["plan", "--fleet", str(LITE_FLEET), "--checkpoint", str(lite_checkpoint), "--weights", "q4_k_m",
               "--mode", "deployment", "--state-dir", str(tmp_path / "state")])
    assert rc == 2 and "error NO_EVIDENCE_REGISTRY" in capsys.readouterr().err


def test_a_broken_fleet_file_is_an_error_with_its_reason(lite_checkpoint, tmp_path, capsys):
    broken = tmp_path / "broken.yaml"
    broken.write_text("version: 1\ncontrol_host: nobody\nhosts: []\n")
    assert main(["plan", "--fleet", str(broken), "--checkpoint", str(lite_checkpoint)]) == 2
    assert "error FLEET_FILE_INVALID: fleet file" in capsys.readouterr().err


def _store_stage_profile(state: Path, checkpoint: Path, host: str) -> str:
    """A physical stage profile of `host` (MAX, q4_k_m, float32 activations as the lite fleet file's
    hosts run, this checkpoint) in the fleet's registry store, where `fornax profile` leaves it
    (written to the store as the registry writes an accepted record); returns its record id."""
    snapshot = describe_checkpoint(checkpoint, "q4_k_m").model_snapshot
    profile = dataclasses.replace(stage_profile(host, snapshot, measured=time.time_ns() - 3600 * 10**9),
                                  weights_policy="q4_k_m", max_activations="float32")
    record = stage_record(profile)
    root = state / "hosts" / "alpha" / "evidence_registry"
    store = SqliteRecordStore(root / "registry.db")
    try:
        content = RecordContent(RecordType.MEASUREMENT, EvidenceClass.PHYSICAL, labels=record.labels)
        blob = DiskBlobStore(root / "blobs").put(to_json(profile))
        store.put(Record(record.record_id, content, blob, RecordStatus.ACTIVE, time.time_ns()), "test")
    finally:
        store.close()
    return record.record_id


def test_stored_profiles_under_the_state_dir_are_planned_from(lite_checkpoint, tmp_path, capsys):
    state = tmp_path / "state"
    record_id = _store_stage_profile(state, lite_checkpoint, "beta")
    rc = main(["plan", "--fleet", str(LITE_FLEET), "--checkpoint", str(lite_checkpoint), "--weights", "q4_k_m",
               "--state-dir", str(state), "--explain"])
    out = capsys.readouterr().out
    assert rc == 0
    assert f"stored profiles (measured, physical): beta {record_id}" in out
    assert re.search(rf"beta +compute .*measured profile {record_id} \(physical\) stands in", out)
    assert "terms from physical profiles" in out  # the plan rests on the record, declared figures fill gaps
    assert f"measurement records {record_id}" in out and "declared, exploratory" in out
    # beta's runtime reserve is the profile's measurement (300 MiB), alpha's and gamma's stay declared
    assert re.search(rf"beta +reserve +0\.293 GiB +physical: measured on beta \(Test CPU\) by stage profile "
                     rf"{record_id}: .*replaces the declared 512 MiB", out)
    assert re.search(r"alpha +reserve +0\.500 GiB +declared estimate \(prediction\)", out)
    assert re.search(r"reserve +0\.293 GiB +physical \(prediction from layer profiles; measurement records "
                     rf"{record_id}\)", out)
