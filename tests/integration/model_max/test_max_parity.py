"""Staged MAX execution matches Hugging Face transformers (float32, CPU) within 1e-4, with
identical routed experts, for 1, 2 and 3 stages. The tiny-lora-yarn preset covers q_lora,
group-limited routing, yarn RoPE, the routed scaling factor and tied embeddings."""

from __future__ import annotations

import pytest

pytest.importorskip("max")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from libs.model.parity import ParityRequest, format_report, run_parity  # noqa: E402
from tests.unit.model_max.conftest import max_checkpoint  # noqa: E402,F401  (shared fixture)

# a cold compile cache costs minutes on 2 cores;
# cold compiles can outlast the default 600 s test timeout on a busy 2-core host.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.mark.parametrize("stages", [1, 2, 3])
def test_max_parity_against_transformers(max_checkpoint, stages):  # noqa: F811
    report = run_parity(ParityRequest(max_checkpoint, stages, "max"))
    text = format_report(report)
    assert report.passed, text
    assert report.backend == "max" and report.backend_build.startswith("max ")
    assert len(report.boundaries) == stages + 1
    assert all(b.max_abs_diff <= 1e-4 for b in report.boundaries), text
    assert [e.layer for e in report.experts] == [1, 2, 3]
    assert all(e.mismatched_rows == 0 and e.rows == report.rows for e in report.experts), text


def test_a_max_stage_in_q4_k_m_runs_its_block_formats_in_graph_and_agrees_on_top1(max_checkpoint):  # noqa: F811
    """q4_k_m held as a MAX stage holds it (llama.cpp's Q5_0 and Q8_0 fallbacks here, as stored:
    this preset's rows fit no 256-block), run by the Mojo custom op: top-1 agrees with transformers
    on the same weights decoded to float32, and the logits are not those of the unquantized model."""
    report = run_parity(ParityRequest(max_checkpoint, 2, "max", weights="q4_k_m", against_source=True))
    text = format_report(report)
    assert report.gate == "top1" and report.passed, text
    assert report.top1_vs_reference >= 0.95, text
    assert "as a max stage holds them" in report.reference
    logits = report.boundaries[-1].max_abs_diff
    assert 0 < logits < 10, text  # not exact (quantized weights), not wild either
    assert report.quality is not None and report.quality.mean_kl > 0
