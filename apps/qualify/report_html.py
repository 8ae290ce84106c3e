"""The qualification report: one self-contained HTML file (inline CSS and SVG, nothing fetched).

Charts: a stacked per-stage time breakdown of a decode microbatch (measured, and the plan's
prediction beside it), predicted against measured service time per stage, and activation
parity per boundary against its tolerance. Pure: values in, a string out.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

from apps.qualify.gate import PHASES, PredictedStage, RunOutcome, Verdict, phase_medians

COLORS = {"compute": "#4e79a7", "pack": "#f28e2b", "wire": "#e15759", "unpack": "#76b7b2",
          "queue": "#59a14f", "exposed_wait": "#bab0ac"}
BAR_H, GAP, LEFT, WIDTH = 18, 10, 230, 560


@dataclass(frozen=True)
class ReportFacts:
    """What every physical figure in the report was measured on."""

    fleet_file: str
    hosts: tuple[str, ...]  # one line per host: name, backend build, quota, cpuset, memory
    model_snapshot: str
    command: str
    started_utc: str
    skew: str
    load_average: str
    reference: str = ""  # which reference the parity checks compared with, and why
    gates: str = ""  # which parity gates applied (exact or top-1), and why


def _e(text: object) -> str:
    return html.escape(str(text))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g} ms"


def stacked_breakdown_svg(runs: Sequence[RunOutcome], predicted: Sequence[PredictedStage]) -> str:
    rows: list[tuple[str, dict[str, float]]] = []
    for p in sorted(predicted, key=lambda p: p.stage_index):
        measured = [s for r in runs for s in r.stages if s.stage_index == p.stage_index]
        if measured:
            rows.append((f"stage {p.stage_index} {p.host} measured (physical)", phase_medians(measured)))
        rows.append((f"stage {p.stage_index} {p.host} predicted (prediction)", dict(p.seconds)))
    scale = max((sum(v.values()) for _, v in rows), default=0.0) or 1.0
    height = len(rows) * (BAR_H + GAP) + 50
    parts = [f'<svg class="chart" id="breakdown" xmlns="http://www.w3.org/2000/svg" width="{LEFT + WIDTH + 120}" '
             f'height="{height}" role="img" aria-label="stacked per-stage time breakdown">']
    for i, (label, values) in enumerate(rows):
        y, x = 10 + i * (BAR_H + GAP), float(LEFT)
        parts.append(f'<text x="{LEFT - 6}" y="{y + 13}" text-anchor="end">{_e(label)}</text>')
        for phase in PHASES:
            w = values.get(phase, 0.0) / scale * WIDTH
            if w > 0:
                parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{BAR_H}" fill="{COLORS[phase]}">'
                             f'<title>{_e(phase)}: {_ms(values[phase])}</title></rect>')
                x += w
        parts.append(f'<text x="{x + 4:.1f}" y="{y + 13}">{_ms(sum(values.values()))}</text>')
    y = height - 22
    for j, phase in enumerate(PHASES):
        parts.append(f'<rect x="{LEFT + j * 95}" y="{y}" width="12" height="12" fill="{COLORS[phase]}"/>'
                     f'<text x="{LEFT + j * 95 + 16}" y="{y + 11}">{_e(phase)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def predicted_vs_measured_svg(verdict: Verdict) -> str:
    stages = verdict.calibration.stages
    scale = max([s.predicted_s for s in stages] + [s.measured_s.high for s in stages] + [1e-12])
    height = len(stages) * (2 * BAR_H + GAP + 4) + 20
    parts = [f'<svg class="chart" id="predicted-vs-measured" xmlns="http://www.w3.org/2000/svg" '
             f'width="{LEFT + WIDTH + 160}" height="{height}" role="img" aria-label="predicted against measured">']
    for i, s in enumerate(stages):
        y = 10 + i * (2 * BAR_H + GAP + 4)
        wp, wm = s.predicted_s / scale * WIDTH, s.measured_s.median / scale * WIDTH
        lo, hi = s.measured_s.low / scale * WIDTH, s.measured_s.high / scale * WIDTH
        parts += [
            f'<text x="{LEFT - 6}" y="{y + 13}" text-anchor="end">stage {s.stage_index} {_e(s.host)} prediction</text>',
            f'<rect x="{LEFT}" y="{y}" width="{wp:.1f}" height="{BAR_H}" fill="#d4a6c8"/>',
            f'<text x="{LEFT + wp + 4:.1f}" y="{y + 13}">{_ms(s.predicted_s)}</text>',
            f'<text x="{LEFT - 6}" y="{y + BAR_H + 15}" text-anchor="end">measured (physical)</text>',
            f'<rect x="{LEFT}" y="{y + BAR_H + 2}" width="{wm:.1f}" height="{BAR_H}" fill="#4e79a7"/>',
            f'<line x1="{LEFT + lo:.1f}" x2="{LEFT + hi:.1f}" y1="{y + 1.5 * BAR_H + 2}" '
            f'y2="{y + 1.5 * BAR_H + 2}" stroke="#000" stroke-width="2"/>',
            f'<text x="{LEFT + max(wm, hi) + 4:.1f}" y="{y + BAR_H + 15}">{_ms(s.measured_s.median)} '
            f'(error {s.relative_error:.1%})</text>',
        ]
    parts.append("</svg>")
    return "".join(parts)


def parity_svg(runs: Sequence[RunOutcome]) -> str:
    """max |ours - reference| per boundary (worst over runs) on a log scale, tolerance marked."""
    worst: dict[str, tuple[float, float]] = {}
    for r in runs:
        for b in r.boundaries:
            diff, tol = worst.get(b.label, (0.0, b.tolerance))
            worst[b.label] = (max(diff, b.max_abs_diff), b.tolerance if b.gated else math.inf)
    lo_exp, hi_exp = -10, 0
    height = len(worst) * (BAR_H + GAP) + 30

    def x_of(v: float) -> float:
        e = math.log10(v) if v > 0 else lo_exp
        return LEFT + (min(max(e, lo_exp), hi_exp) - lo_exp) / (hi_exp - lo_exp) * WIDTH

    parts = [f'<svg class="chart" id="parity" xmlns="http://www.w3.org/2000/svg" width="{LEFT + WIDTH + 200}" '
             f'height="{height}" role="img" aria-label="parity per boundary">']
    for i, (label, (diff, tol)) in enumerate(worst.items()):
        y = 10 + i * (BAR_H + GAP)
        color = "#59a14f" if diff <= tol else "#e15759"
        parts += [
            f'<text x="{LEFT - 6}" y="{y + 13}" text-anchor="end">{_e(label)}</text>',
            f'<rect x="{LEFT}" y="{y}" width="{x_of(diff) - LEFT:.1f}" height="{BAR_H}" fill="{color}"/>',
            f'<line x1="{x_of(tol):.1f}" x2="{x_of(tol):.1f}" y1="{y - 2}" y2="{y + BAR_H + 2}" stroke="#000" '
            f'stroke-dasharray="3,2"/>',
            f'<text x="{LEFT + WIDTH + 6}" y="{y + 13}">{diff:.3g} (tolerance {tol:.3g})</text>',
        ]
    parts.append(f'<text x="{LEFT}" y="{height - 6}">1e{lo_exp}</text>'
                 f'<text x="{LEFT + WIDTH}" y="{height - 6}" text-anchor="end">1e{hi_exp}</text></svg>')
    return "".join(parts)


def _checks_table(runs: Sequence[RunOutcome]) -> str:
    rows = ["<table id=checks><tr><th>run</th><th>check</th><th>result</th><th>detail</th></tr>"]
    for r in runs:
        for c in r.checks:
            cls = "pass" if c.passed else "fail"
            rows.append(f'<tr class="{cls}"><td>{r.run}</td><td>{_e(c.name)}</td>'
                        f'<td>{"pass" if c.passed else "FAIL"}</td><td>{_e(c.detail)}</td></tr>')
    rows.append("</table>")
    return "".join(rows)


def _stage_table(runs: Sequence[RunOutcome]) -> str:
    head = "".join(f"<th>{p} (ms)</th>" for p in PHASES)
    rows = [f"<table><tr><th>run</th><th>stage</th><th>host</th><th>batches</th><th>rows/batch</th>{head}</tr>"]
    for r in runs:
        for s in r.stages:
            cells = "".join(f"<td>{s.seconds[p] * 1e3:.4g}</td>" for p in PHASES)
            rows.append(f"<tr><td>{r.run}</td><td>{s.stage_index}</td><td>{_e(s.host)}</td><td>{s.batches}</td>"
                        f"<td>{s.rows_per_batch:.3g}</td>{cells}</tr>")
    rows.append("</table>")
    return "".join(rows)


CSS = """body{font:14px system-ui,sans-serif;margin:2em;max-width:1100px}svg text{font:12px sans-serif}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
tr.fail td{background:#fde2e1}.verdict-pass{color:#2a7a2a}.verdict-fail{color:#b00}code{font-size:12px}"""


def render_report(verdict: Verdict, runs: Sequence[RunOutcome], predicted: Sequence[PredictedStage],
                  facts: ReportFacts) -> str:
    c = verdict.calibration
    state = "PASSED" if verdict.passed else "FAILED"
    failures = "".join(f"<li>{_e(f)}</li>" for f in verdict.failures) or "<li>none</li>"
    hosts = "".join(f"<li>{_e(h)}</li>" for h in facts.hosts)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>fornax qualify: {state}</title>
<style>{CSS}</style></head><body>
<h1>Physical qualification gate: <span class="verdict-{state.lower()}">{state}</span></h1>
<p>Route <code>{_e(c.route_key)}</code>, plan <code>{_e(c.plan_hash)}</code>, {c.runs} run(s).</p>
<p>Bottleneck prediction error <b>{c.bottleneck_prediction_error:.1%}</b> (tolerance {c.tolerance:.0%}):
predicted {_ms(c.predicted_bottleneck_s)} per decode microbatch (prediction: the installed plan's cost model),
measured median {_ms(c.measured_bottleneck_s.median)} (physical; low {_ms(c.measured_bottleneck_s.low)},
high {_ms(c.measured_bottleneck_s.high)}, spread {c.measured_bottleneck_s.spread:.1%}).</p>
<h2>Failed checks</h2><ul id="failures">{failures}</ul>
<h2>Where measured (every time here is physical unless labelled prediction)</h2>
<ul><li>fleet file {_e(facts.fleet_file)}</li>{hosts}<li>model snapshot {_e(facts.model_snapshot)}</li>
<li>command <code>{_e(facts.command)}</code></li>
<li>started {_e(facts.started_utc)}, load average {_e(facts.load_average)}</li>
<li>clocks: {_e(facts.skew)}</li><li>reference: {_e(facts.reference)}</li>
<li>parity gates: {_e(facts.gates)}</li></ul>
<h2>Per-stage time of one decode microbatch</h2>{stacked_breakdown_svg(runs, predicted)}
<h2>Predicted against measured stage service time (compute + pack + wire + unpack)</h2>
{predicted_vs_measured_svg(verdict)}
<h2>Activation parity per boundary</h2>
<p>max |staged - reference| after each stage and on the final logits: the plan's layer ranges run as stages in
qualify's process, each on its stage host's backend, each boundary through its hop's dtype as the route passes it,
against the reference; the fleet's own streams are checked token by token (token_parity). Which of these are
gated, and on what, is stated under parity gates above.</p>{parity_svg(runs)}
<h2>Checks</h2>{_checks_table(runs)}
<h2>Phase times per run (physical)</h2>{_stage_table(runs)}
</body></html>
"""
