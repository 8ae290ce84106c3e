"""`fornax parity --served` on a loopback fleet: the route's greedy tokens, read through the
OpenAI endpoint, against the layer-streamed reference of the route's own q4_k_m artifacts."""

from __future__ import annotations

import argparse
import json

import pytest

from apps.fleet.compose import start_fleet
from apps.fleet.launcher import FleetOptions
from apps.fleet.route_wait import wait_for_route
from libs.service.fleet_state import write_fleet
from tests.integration.orchestrator.harness import tiny_checkpoint

pytestmark = pytest.mark.integration
pytest.importorskip("transformers")


def _parity(argv: list[str]) -> argparse.Namespace:
    from apps.cli import model as cli

    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command")
    cli.register(commands, commands.add_parser("bench").add_subparsers(dest="bench"))
    return parser.parse_args(["parity", *argv])


def test_the_served_route_agrees_with_the_streamed_reference_of_its_own_artifacts(tmp_path, capsys):
    checkpoint = tiny_checkpoint(tmp_path / "tiny")
    state_dir = tmp_path / ".fornax"
    options = FleetOptions(state_dir=state_dir, stages=2, backend="numpy", boundary_dtype="fp32",
                           checkpoint=str(checkpoint), weights="q4_k_m")
    state, launcher = start_fleet(options)
    try:
        wait_for_route(state, 300, lambda _: None)
        write_fleet(state_dir, state)  # as `fornax up` does
        args = _parity(["--served", "--state-dir", str(state_dir), "--prompts", "3", "--prompt-tokens", "5",
                        "--max-tokens", "6", "--json"])
        code = args.func(args)
        out = capsys.readouterr()
        from_checkpoint = _parity(["--served", "--state-dir", str(state_dir), "--prompts", "1", "--max-tokens", "4",
                                   "--checkpoint", str(checkpoint), "--weights", "q4_k_m"])
        code_checkpoint = from_checkpoint.func(from_checkpoint)
        text = capsys.readouterr().out
    finally:
        launcher.stop_all()
    assert code == 0, out.err
    report = json.loads(out.out)
    # numpy stages decode the same q4_k_m bytes in float32: at most a near-tie differs
    assert report["passed"] and report["top1_agreement"] >= 17 / 18 and report["positions"] == 18
    assert [p["served_tokens"] for p in report["prompts"]] == [6, 6, 6]
    misses = report["margins"]["misses"]  # each disputed token named, and no more than the agreement says
    assert len(misses) == round((1 - report["top1_agreement"]) * 18)
    assert all(m["served_rank"] >= 1 and m["gap"] >= 0 for m in misses)
    assert report["margins"]["first_second_gap_p50"] > 0
    assert [(s["layer_start"], s["layer_end"]) for s in report["route"]] == [(0, 2), (2, 4)]
    assert report["stage_weights"] == ["q4_k_m", "q4_k_m"]
    assert report["stage_max_activations"] == ["", ""]  # numpy stages run no block-format products
    digests = report["evidence"]["artifact_digests"]
    assert set(digests) == {s["manifest_hash"] for s in report["route"]}
    assert all(any(line.startswith("model.safetensors sha256:") for line in files) for files in digests.values())
    assert report["evidence"]["figure_class"] == "physical" and report["evidence"]["cpu_model"]
    assert "2 stage artifacts" in report["reference"] and report["reference_peak_rss_bytes"] > 0
    assert code_checkpoint == 0 and "PASS" in text and "encoded as q4_k_m" in text


def test_served_parity_without_a_fleet_names_the_reason(tmp_path, capsys):
    args = _parity(["--served", "--state-dir", str(tmp_path / "none")])
    assert args.func(args) == 2
    assert "FLEET_NOT_RUNNING" in capsys.readouterr().err
    plain = _parity([])
    assert plain.func(plain) == 2
    assert "--checkpoint and --backend required" in capsys.readouterr().err
