"""`fornax bench stage` report structure (no timing assertions)."""

from __future__ import annotations

from libs.model.bench import SCENARIOS, format_bench, run_bench


def test_bench_reports_measured_and_unavailable_backends_explicitly(tiny_checkpoint):
    report = run_bench(tiny_checkpoint, ["numpy", "no-such-backend"], layer_count=2, repeats=1)
    status = {s.backend: s for s in report.backends}
    assert status["numpy"].available and status["numpy"].build.startswith("numpy ")
    assert not status["no-such-backend"].available and "unavailable" in status["no-such-backend"].detail
    assert {(r.scenario, r.layer) for r in report.rows} == {(s.name, layer) for s in SCENARIOS for layer in (0, 1)}
    assert {r.layer_kind for r in report.rows} == {"dense", "moe"}
    assert all(r.backend == "numpy" and r.median_ms >= r.min_ms > 0 for r in report.rows)
    text = format_bench(report)
    assert "physical" in text and "host:" in text and "no-such-backend" in text and "prefill S=512" in text
