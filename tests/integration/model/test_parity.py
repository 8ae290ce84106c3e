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
    from apps.cli import model as cli

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
    from apps.cli import model as cli
    from libs.model import kernels

    monkeypatch.setitem(kernels.BACKENDS, "max", "libs.model.no_such_module:make")
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command")
    cli.register(commands, commands.add_parser("bench").add_subparsers(dest="bench"))
    args = parser.parse_args(["parity", "--checkpoint", str(tiny_checkpoint), "--backend", "max"])
    assert args.func(args) == 2
    assert "BACKEND_UNAVAILABLE" in capsys.readouterr().err


@pytest.mark.parametrize("policy", ["bf16", "q8_0", "q4_k_m"])
def test_a_weight_policy_matches_transformers_on_the_same_dequantized_weights(tiny_checkpoint, policy):
    report = run_parity(ParityRequest(tiny_checkpoint, 2, "numpy", weights=policy, against_source=True))
    text = format_report(report)
    assert report.passed, text
    assert f"on the {policy} weights" in report.reference and f"weights={policy}" in text
    quality = report.quality
    assert quality is not None and quality.positions == report.rows
    if policy == "bf16":  # a bf16 checkpoint kept in bf16 is the source model itself
        assert quality.top1_agreement == 1.0 and quality.mean_kl < 1e-9
    else:  # block formats change the model a little: measured on tiny, q8_0 KL ~1e-4, q4_k_m ~2e-3
        assert quality.top1_agreement >= 0.8 and 0 < quality.mean_kl < 1e-2


def test_parity_of_a_policy_fails_against_the_unquantized_reference(tiny_checkpoint, monkeypatch):
    """The reference must run the policy's weights: against the source weights it fails."""
    from libs.model import parity

    original = parity.run_reference
    monkeypatch.setattr(parity, "run_reference",
                        lambda path, cfg, plans, policy="fp32", backend="numpy": original(path, cfg, plans))
    assert not run_parity(ParityRequest(tiny_checkpoint, 1, "numpy", weights="q4_k_m")).passed


def test_parity_kv_dtype_reports_the_logit_error_against_fp32_kv(tiny_checkpoint):
    report = run_parity(ParityRequest(tiny_checkpoint, 2, "numpy", decode_steps=16, kv_dtype="bf16"))
    text = format_report(report)
    assert report.gate == "kv_top1" and report.passed, text
    kv = report.kv
    assert kv.kv_dtype == "bf16" and kv.positions == report.rows and kv.top1_vs_fp32_kv >= 0.95
    assert 0 < kv.max_abs_logit_error < 0.05 * kv.max_abs_logit  # narrower, yet close
    assert "bf16 KV against float32 KV" in text


def test_parity_cli_accepts_fp8_kv_on_numpy_and_reports_agreement(tiny_checkpoint, capsys):
    from apps.cli.main import main

    rc = main(["parity", "--checkpoint", str(tiny_checkpoint), "--stages", "2", "--backend", "numpy",
               "--kv-dtype", "fp8", "--decode-steps", "8", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["gate"] == "kv_top1" and report["passed"]
    kv = report["kv"]
    assert kv["kv_dtype"] == "fp8" and kv["top1_vs_fp32_kv"] >= 0.95
    assert 0 < kv["max_abs_logit_error"] < 0.1 * kv["max_abs_logit"]  # really narrower, still close


def test_parity_cli_refuses_fp8_kv_on_max_with_its_reason(tiny_checkpoint, capsys):
    from apps.cli.main import main

    rc = main(["parity", "--checkpoint", str(tiny_checkpoint), "--stages", "1", "--backend", "max",
               "--kv-dtype", "fp8"])
    assert rc == 2 and "KV_DTYPE_BACKEND" in capsys.readouterr().err


@pytest.mark.parametrize("policy", ["fp32", "q4_k_m"])
def test_stages_against_the_layer_streamed_reference(variant_checkpoint, policy):
    report = run_parity(ParityRequest(variant_checkpoint, 2, "numpy", weights=policy, reference="streamed"))
    text = format_report(report)
    assert report.passed and report.gate == "streamed_top1", text
    assert report.top1_vs_reference >= 0.95 and report.rows == sum(p for p in (7, 4, 5)) + 3 * 8 - 3
    assert "one layer at a time" in report.reference and "against the layer-streamed reference" in text
    with pytest.raises(ParityUnsupportedError):
        run_parity(ParityRequest(variant_checkpoint, 2, "numpy", reference="streamed", against_source=True))
