"""`fornax bench stage` report structure (no timing assertions)."""

from __future__ import annotations

from apps.bench.stage_layers import SCENARIOS, format_bench, run_bench


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


def _row(scenario, backend, layer, kind, ms):
    from apps.bench.stage_layers import BenchRow

    return BenchRow(scenario, backend, layer, kind, ms, ms)


def test_speedup_ratios_are_other_over_max_and_mean_over_layers_of_a_kind():
    from apps.bench.stage_layers import speedup_ratios

    rows = [
        _row("prefill S=512", "max", 0, "dense", 50.0), _row("prefill S=512", "transformers", 0, "dense", 100.0),
        _row("prefill S=512", "max", 1, "moe", 60.0), _row("prefill S=512", "max", 2, "moe", 100.0),
        _row("prefill S=512", "transformers", 1, "moe", 80.0), _row("prefill S=512", "transformers", 2, "moe", 80.0),
        _row("prefill S=512", "numpy", 0, "dense", 40.0), _row("prefill S=512", "numpy", 1, "moe", 160.0),
        _row("prefill S=512", "numpy", 2, "moe", 160.0),
        _row("decode batch=32", "max", 0, "dense", 10.0), _row("decode batch=32", "numpy", 0, "dense", 30.0),
    ]
    ratios = speedup_ratios(rows)
    assert ratios["max_vs_transformers_prefill512_dense"] == 2.0
    assert ratios["max_vs_transformers_prefill512_moe"] == 1.0  # 80 / mean(60, 100)
    assert ratios["max_vs_transformers_decode32_dense"] is None  # transformers not measured there
    assert ratios["max_vs_transformers_decode32_moe"] is None
    assert ratios["max_vs_numpy_min"] == 0.8  # the dense prefill cell: 40 / 50


def test_report_carries_every_ratio_key(tiny_checkpoint):
    import json
    from dataclasses import asdict

    report = run_bench(tiny_checkpoint, ["numpy"], layer_count=2, repeats=1)
    keys = {"max_vs_transformers_prefill512_dense", "max_vs_transformers_prefill512_moe",
            "max_vs_transformers_decode32_dense", "max_vs_transformers_decode32_moe", "max_vs_numpy_min"}
    ratios = json.loads(json.dumps(asdict(report)))["ratios"]
    assert set(ratios) == keys and all(v is None for v in ratios.values())  # MAX not measured
    assert "at start" in report.load_average
