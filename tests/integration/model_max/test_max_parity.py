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
