"""Deployment-mode evidence gate. Pure: record resolution is behind the `Resolver` protocol.

Deployment mode fails closed unless every referenced record resolves (right type, active,
inside its validity window, matching sha256) and the plan rests on evidence at all: a model
record, a capability record for every node it uses, and a route record for every route.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from services.planner import domain as d
from services.planner.inventory import EvidenceRef, Inventory, Link


@dataclass(frozen=True)
class Resolution:
    record_id: str
    ok: bool
    reason: str = ""  # stable registry reason code when not ok
    detail: str = ""
    evidence_class: str = ""  # the record's class as the registry holds it ("" when unknown)


class Resolver(Protocol):
    def resolve(self, refs: Sequence[EvidenceRef]) -> Sequence[Resolution]: ...


@dataclass(frozen=True)
class Reference:
    subject: str
    ref: EvidenceRef


def referenced(inventory: Inventory) -> list[Reference]:
    out = [Reference("model", r) for r in inventory.model_evidence]
    for node in inventory.nodes:
        out += [Reference(node.name, r) for r in node.evidence]
    for link in inventory.links:
        out += [Reference(f"{link.from_node}->{link.to_node}", r) for r in link.evidence]
    return out


def has_type(refs: Sequence[EvidenceRef], record_type: str) -> bool:
    return any(r.record_type == record_type for r in refs)


def evidenced_links(inventory: Inventory) -> tuple[tuple[Link, ...], tuple[Link, ...]]:
    """(links that reference a route record, links that don't)."""
    good = tuple(x for x in inventory.links if has_type(x.evidence, "route"))
    return good, tuple(x for x in inventory.links if not has_type(x.evidence, "route"))


def missing(inventory: Inventory, plan: d.Plan | None) -> list[d.EvidenceFailure]:
    """What deployment needs but nothing references: a model record, and for the plan's nodes
    and routes a capability and a route record (planning already avoids unevidenced ones)."""
    out = []
    if not has_type(inventory.model_evidence, "model"):
        out.append(d.EvidenceFailure("", "model", d.MISSING_EVIDENCE, "no model record referenced"))
    if plan is None:
        return out
    by_name = {n.name: n for n in inventory.nodes}
    for stage in plan.stages:
        if not has_type(by_name[stage.node].evidence, "capability"):
            out.append(d.EvidenceFailure("", stage.node, d.MISSING_EVIDENCE, "no capability record referenced"))
    for a, b in zip(plan.stages, plan.stages[1:], strict=False):
        link = inventory.link(a.node, b.node)
        if link is None or not has_type(link.evidence, "route"):
            out.append(d.EvidenceFailure("", f"{a.node}->{b.node}", d.MISSING_EVIDENCE, "no route record referenced"))
    return out


def unresolved(refs: Sequence[Reference], resolutions: Sequence[Resolution]) -> list[d.EvidenceFailure]:
    by_id = {r.record_id: r for r in resolutions}
    out = []
    for item in refs:
        got = by_id.get(item.ref.record_id)
        if got is None:
            out.append(
                d.EvidenceFailure(item.ref.record_id, item.subject, "NO_ANSWER", "the registry returned no resolution")
            )
        elif not got.ok:
            out.append(d.EvidenceFailure(item.ref.record_id, item.subject, got.reason or "UNRESOLVED", got.detail))
    return out


def gate(result: d.PlanResult, inventory: Inventory, resolver: Resolver) -> d.PlanResult:
    """Keeps a deployment plan only when all its evidence resolves; otherwise fails closed."""
    refs = referenced(inventory)
    resolutions = resolver.resolve([r.ref for r in refs]) if refs else []
    failures = unresolved(refs, resolutions) + missing(inventory, result.plan)
    if not failures:
        return result
    return d.PlanResult(
        feasible=False,
        plan=None,
        rejections=result.rejections,
        infeasibility=f"deployment mode: {len(failures)} evidence check(s) failed; no plan is issued",
        infeasibility_reason=d.EVIDENCE_UNRESOLVED,
        shortfall_bytes=result.shortfall_bytes,
        evidence_failures=tuple(failures),
    )
