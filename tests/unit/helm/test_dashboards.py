"""The Grafana dashboard shipped in the chart queries the metrics the services export."""

from __future__ import annotations

import json
import re

from tests.unit.helm.tools import CHART_DIR

DASHBOARD = CHART_DIR / "dashboards" / "fornax-fleet.json"
# Metric families the services export, with the labels the dashboard may group by.
METRICS = {
    "fornax_stage_compute_seconds": {"stage"}, "fornax_stage_queue_seconds": {"stage"},
    "fornax_fnx2_pack_seconds": {"stage"}, "fornax_fnx2_transfer_seconds": {"stage"},
    "fornax_fnx2_unpack_seconds": {"stage"}, "fornax_fnx2_credit_exhausted_total": {"stage"},
    "fornax_stage_kv_bytes": {"stage"}, "fornax_stage_kv_sequences": {"stage"},
    "fornax_stage_kv_epoch_changes_total": {"stage"}, "fornax_admissions_total": set(),
    "fornax_admission_rejections_total": {"reason"}, "fornax_generated_tokens_total": set(),
    "fornax_ttft_seconds": set(), "fornax_itl_seconds": set(), "fornax_cancellations_total": set(),
    "fornax_planner_decisions_total": {"reason"}, "fornax_grpc_errors_total": {"service", "code", "reason"},
    "fornax_stage_prefix_hit_blocks_total": {"stage"}, "fornax_stage_prefix_missed_blocks_total": {"stage"},
    "fornax_stage_kv_evicted_blocks_total": {"stage"},
}
HISTOGRAMS = {"fornax_stage_compute_seconds", "fornax_stage_queue_seconds", "fornax_fnx2_pack_seconds",
              "fornax_fnx2_transfer_seconds", "fornax_fnx2_unpack_seconds", "fornax_ttft_seconds",
              "fornax_itl_seconds"}
SECTIONS = ("Per-stage time breakdown", "Throughput and latency", "KV and credit pressure", "Errors")
METRIC_RE = re.compile(r"\bfornax_[a-z0-9_]+")


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def sections(dashboard: dict) -> dict[str, list[dict]]:
    """Panels grouped under the row that precedes them."""
    grouped: dict[str, list[dict]] = {}
    current = None
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            current = panel["title"]
            grouped[current] = []
        else:
            assert current is not None, f"panel {panel['title']!r} sits outside any row"
            grouped[current].append(panel)
    return grouped


def family(series: str) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        if series.endswith(suffix) and series[: -len(suffix)] in HISTOGRAMS:
            return series[: -len(suffix)]
    return series


def exprs(panels: list[dict]) -> list[str]:
    return [t["expr"] for p in panels for t in p["targets"]]


def test_dashboard_has_the_four_sections_each_with_panels():
    grouped = sections(load())
    assert tuple(grouped) == SECTIONS
    assert all(grouped[title] for title in SECTIONS)


def test_every_query_uses_known_metrics_and_labels():
    for expr in exprs([p for p in load()["panels"] if p["type"] != "row"]):
        names = METRIC_RE.findall(expr)
        assert names, expr
        for series in names:
            name = family(series)
            assert name in METRICS, f"unknown metric {series} in {expr}"
            if series.endswith("_bucket"):
                assert "histogram_quantile" in expr
            for group in re.findall(r"by \(([^)]*)\)", expr):
                labels = {label.strip() for label in group.split(",")} - {"le"}
                assert labels <= METRICS[name], f"{name} has no label(s) {labels - METRICS[name]}"


def test_every_exported_metric_is_on_the_dashboard():
    used = {family(s) for e in exprs([p for p in load()["panels"] if p["type"] != "row"])
            for s in METRIC_RE.findall(e)}
    assert used == set(METRICS)


def test_sections_hold_their_metrics():
    grouped = {title: " ".join(exprs(panels)) for title, panels in sections(load()).items()}
    assert "fornax_stage_compute_seconds" in grouped["Per-stage time breakdown"]
    assert "fornax_fnx2_transfer_seconds" in grouped["Per-stage time breakdown"]
    assert "fornax_ttft_seconds" in grouped["Throughput and latency"]
    assert "fornax_generated_tokens_total" in grouped["Throughput and latency"]
    assert "fornax_fnx2_credit_exhausted_total" in grouped["KV and credit pressure"]
    assert "fornax_stage_kv_bytes" in grouped["KV and credit pressure"]
    assert "fornax_stage_prefix_hit_blocks_total" in grouped["KV and credit pressure"]
    assert "fornax_grpc_errors_total" in grouped["Errors"]


def test_panels_use_the_templated_datasource_and_unique_ids():
    dashboard = load()
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}"
        assert [t["refId"] for t in panel["targets"]] == [chr(65 + i) for i in range(len(panel["targets"]))]
