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


def route_lines(result: d.PlanResult, shown: int = 20) -> list[str]:
    """The replica-route layout choice: every candidate (up to `shown`, the chosen always) with its
    predicted fleet tokens/s at the target concurrency, and why the chosen one won."""
    choice = result.route_choice
    if choice is None:
        return []
    lines = ["route layouts (fleet decode tokens/s at the target concurrency: predictions of the cost model, "
             "summed over each route at its share of the sequences; not measurements):"]
    order = sorted(range(len(choice.candidates)),
                   key=lambda i: (not choice.candidates[i].feasible, -choice.candidates[i].tokens_per_s, i))
    keep = set(order[:shown]) | ({choice.chosen} if choice.chosen >= 0 else set())
    for i in order:
        if i not in keep:
            continue
        c = choice.candidates[i]
        mark = "*" if i == choice.chosen else " "
        if c.feasible:
            low, high = c.band_tokens_per_s
            band = f", spread {low:.4g}..{high:.4g}" if high > low else ""
            shares = "+".join(str(x) for x in c.shares)
            lines.append(f" {mark} {c.layout:<40} {c.tokens_per_s:>10.4g} tokens/s (prediction{band}; "
                         f"sequences {shares})")
        else:
            lines.append(f" {mark} {c.layout:<40} {'infeasible':>10} [{c.reason}] {c.detail}")
    if len(keep) < len(choice.candidates):
        lines.append(f"   ... and {len(choice.candidates) - len(keep)} more layout(s) (see --json)")
    lines.append(f"route choice: {choice.explanation}")
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
