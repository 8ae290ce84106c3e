"""`fornax plan --explain` and `--replan` text: each stage's terms with their evidence, and the
difference between an installed placement and a proposed one. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.planner import domain as d

GIB = float(2**30)


def _value(term: d.TermEvidence) -> str:
    if term.unit == "bytes":
        return f"{term.value / GIB:9.3f} GiB"
    return f"{term.value * 1e3:9.4f} ms "


def _class(term: d.TermEvidence) -> str:
    if term.evidence_class == d.TERM_PHYSICAL:
        ids = ", ".join(term.record_ids) or "-"
        return f"physical (prediction from {term.basis}; measurement records {ids})"
    return "declared, exploratory"


def explain_lines(plan: d.Plan) -> list[str]:
    """Per stage: compute, pack, wire, unpack and memory with their evidence class and record ids."""
    lines = [f"plan {plan.plan_id} [{plan.mode}]", f"  {plan.label}"]
    if plan.route_key:
        lines.append(f"  route {plan.route_key}")
    if plan.choice:
        lines.append(f"  placement: {plan.choice}")
    for s in plan.stages:
        lines.append(f"stage {s.stage_index} on {s.node}@{s.host or s.node} ({s.backend}) layers "
                     f"[{s.layer_start}, {s.layer_end}), decode per microbatch:")
        if not s.terms:
            c = s.decode
            for name, value in (("compute", c.compute_s), ("pack", c.pack_s), ("wire", c.wire_s),
                                ("unpack", c.unpack_s)):
                lines.append(f"  {name:<8}{value * 1e3:9.4f} ms   declared cost model (roofline of declared figures)")
            lines.append(f"  {'memory':<8}{s.memory_bytes / GIB:9.3f} GiB  checkpoint config bookkeeping")
            continue
        for t in s.terms:
            lines.append(f"  {t.term:<8}{_value(t)}  {_class(t)}")
            lines.append(f"  {'':<8}{'':>13}  {t.note}")
    source = ("computed from physical measurements" if plan.from_profiles and not plan.declared_terms
              else "of the cost model, partly or wholly from declared figures")
    lines.append(f"predictions ({source}; not measurements of this plan):")
    lines += [f"  {p.name:<28} {p.value:.6g} {p.unit} (prediction)" for p in plan.predictions]
    if plan.evidence_ids:
        lines.append("evidence records: " + ", ".join(plan.evidence_ids))
    return lines


@dataclass(frozen=True)
class InstalledStage:
    stage_index: int
    node: str
    host: str
    layer_start: int
    layer_end: int


def _tokens_per_s(plan: d.Plan) -> str:
    return f"{plan.prediction('decode_tokens_per_s'):.4g} tokens/s"


def diff_lines(installed: Sequence[InstalledStage], proposed: d.Plan, current: d.Plan | None = None) -> list[str]:
    """Stage by stage: what moves from the installed placement to the proposed one; with
    `current` (the installed placement evaluated on the same evidence) both predictions."""
    before = [(s.host, s.layer_start, s.layer_end) for s in installed]
    after = [(s.host or s.node, s.layer_start, s.layer_end) for s in proposed.stages]
    if before == after:
        return ["replan: the proposed placement equals the installed one; nothing to move"]
    lines = ["replan: proposed placement differs from the installed one"]
    if current is not None:
        lines.append(f"  predicted decode throughput (predictions on the same evidence): installed "
                     f"{_tokens_per_s(current)} -> proposed {_tokens_per_s(proposed)}")
    for i in range(max(len(before), len(after))):
        old = before[i] if i < len(before) else None
        new = after[i] if i < len(after) else None
        mark = "  " if old == new else "* "
        lines.append(f"{mark}stage {i}: {_show(old):<34} -> {_show(new)}")
    return lines


def _show(stage: tuple[str, int, int] | None) -> str:
    if stage is None:
        return "(none)"
    host, start, end = stage
    return f"{host} [{start}, {end}) {end - start} layers"
