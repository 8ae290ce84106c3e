"""Staged numpy execution matches Hugging Face transformers (float32, CPU) within 1e-4."""

from __future__ import annotations

import argparse
import json

import pytest

from libs.model.errors import BackendUnavailableError
from libs.model.parity import ParityRequest, ParityUnsupportedError, format_report, run_parity, split_layers

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.mark.parametrize("stages", [1, 2, 3])
@pytest.mark.parametrize("checkpoint", ["tiny_checkpoint", "variant_checkpoint"])
def test_numpy_parity_against_transformers(checkpoint, stages, request):
    path = request.getfixturevalue(checkpoint)
    report = run_parity(ParityRequest(path, stages, "numpy"))
    text = format_report(report)
    assert report.passed, text
    assert len(report.boundaries) == stages + 1 and all(b.max_abs_diff <= 1e-4 for b in report.boundaries)
    assert [e.layer for e in report.experts] == [1, 2, 3]
    assert all(e.mismatched_rows == 0 and e.rows == report.rows for e in report.experts)
    assert "transformers" in report.reference and "PASS" in text


def test_parity_detects_a_wrong_yarn_attention_factor(variant_checkpoint, monkeypatch):
    from libs.model import rope

    original = rope.rope_tables
    monkeypatch.setattr(
        "libs.model.executor.rope_tables",
        lambda cfg: rope.RopeTables(original(cfg).inv_freq, 1.0),
    )
    report = run_parity(ParityRequest(variant_checkpoint, 2, "numpy"))
    assert not report.passed
    assert max(b.max_abs_diff for b in report.boundaries) > 1e-3


def test_parity_cli_json_and_exit_codes(tiny_checkpoint, capsys):
    from libs.model import cli

    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command")
    cli.register(commands, commands.add_parser("bench").add_subparsers(dest="bench"))
    args = parser.parse_args(["parity", "--checkpoint", str(tiny_checkpoint), "--stages", "2", "--backend", "numpy",
                              "--json"])
    assert args.func(args) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["passed"] is True and len(payload["stage_ranges"]) == 2


def test_unsupported_requests_fail_closed(tiny_checkpoint):
    with pytest.raises(ParityUnsupportedError):
        split_layers(4, 5)
    with pytest.raises(BackendUnavailableError):
        run_parity(ParityRequest(tiny_checkpoint, 1, "no-such-backend"))


def test_parity_cli_reports_unavailable_backend_without_traceback(tiny_checkpoint, capsys, monkeypatch):
    from libs.model import cli, kernels

    monkeypatch.setitem(kernels.BACKENDS, "max", "libs.model.no_such_module:make")
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command")
    cli.register(commands, commands.add_parser("bench").add_subparsers(dest="bench"))
    args = parser.parse_args(["parity", "--checkpoint", str(tiny_checkpoint), "--backend", "max"])
    assert args.func(args) == 2
    assert "BACKEND_UNAVAILABLE" in capsys.readouterr().err
