"""`fornax host drain` / `fornax host add`, their pure core: whether a host may leave the serving
replica-route layout, the layout change a join proposes, as a diff against the serving one, and
the record of a route that left (`RemovedRoute`: drained, or its host did not come back).

Routes are named by their stage hosts in stage order (`alpha>beta`). No sockets, no clocks: the
caller measures the admitted load and each route's capacity (requests it may hold at once) and
passes them in; a refusal is a `FailedPrecondition` with a stable reason, and the serving layout
is kept.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from libs.service.errors import FailedPrecondition, NotFound

Route = tuple[str, ...]  # stage hosts, stage order


@dataclass(frozen=True)
class DrainDecision:
    host: str
    leaving: tuple[Route, ...]  # routes that hold the host: they stop taking requests, then finish
    remaining: tuple[Route, ...]  # routes that keep serving, serving order
    remaining_capacity: int  # requests the remaining routes may hold at once


def route_name(route: Route) -> str:
    return ">".join(route)


def decide_drain(serving: Sequence[Route], capacity: Sequence[int], host: str,
                 admitted: int) -> DrainDecision:
    """The routes that lose `host` leave, the others keep serving. Refused with HOST_NOT_SERVING
    when no route holds the host, DRAIN_LEAVES_NO_ROUTE when every route holds it, and
    DRAIN_BELOW_ADMITTED_LOAD when the remaining routes cannot hold the `admitted` requests."""
    if len(capacity) != len(serving):
        raise ValueError("one capacity per serving route")
    leaving = tuple(route for route in serving if host in route)
    if not leaving:
        raise NotFound(f"host {host!r} is in no serving route "
                       f"({', '.join(route_name(r) for r in serving) or 'none serving'})",
                       reason="HOST_NOT_SERVING")
    kept = [(route, held) for route, held in zip(serving, capacity, strict=True) if host not in route]
    if not kept:
        raise FailedPrecondition(f"draining {host!r} would leave no serving route "
                                 f"(every route holds it: {', '.join(route_name(r) for r in leaving)})",
                                 reason="DRAIN_LEAVES_NO_ROUTE")
    remaining_capacity = sum(held for _, held in kept)
    if remaining_capacity < admitted:
        raise FailedPrecondition(f"draining {host!r} leaves room for {remaining_capacity} requests, "
                                 f"below the {admitted} admitted", reason="DRAIN_BELOW_ADMITTED_LOAD")
    return DrainDecision(host, leaving, tuple(route for route, _ in kept), remaining_capacity)


@dataclass(frozen=True)
class LayoutDiff:
    kept: tuple[Route, ...]
    added: tuple[Route, ...]
    removed: tuple[Route, ...]

    @property
    def unchanged(self) -> bool:
        return not self.added and not self.removed

    def lines(self) -> tuple[str, ...]:
        """`= alpha>beta`, `- gamma>delta`, `+ gamma>delta>epsilon`: kept, removed, added."""
        return (tuple(f"= {route_name(r)}" for r in self.kept)
                + tuple(f"- {route_name(r)}" for r in self.removed)
                + tuple(f"+ {route_name(r)}" for r in self.added))


def diff_layouts(serving: Sequence[Route], proposed: Sequence[Route]) -> LayoutDiff:
    """Routes kept as they are (same hosts, same stage order), removed, and added; each in its
    layout's order. A route whose hosts change is one removed and one added: make-before-break
    installs the added ones beside the serving ones before the removed ones drain."""
    serving_set, proposed_set = set(serving), set(proposed)
    return LayoutDiff(kept=tuple(r for r in serving if r in proposed_set),
                      added=tuple(r for r in proposed if r not in serving_set),
                      removed=tuple(r for r in serving if r not in proposed_set))


class RemovalReason(enum.Enum):
    """Why a replica route left the serving set."""

    HOST_DRAINED = "HOST_DRAINED"  # `fornax host drain` took its host out
    REJOIN_TIMEOUT = "REJOIN_TIMEOUT"  # its host was gone longer than the rejoin timeout


@dataclass(frozen=True)
class RemovedRoute:
    route: Route  # its stage workers, stage order
    reason: RemovalReason
    host: str  # the stage worker that drained or did not come back
    detail: str = ""  # in words, for `fornax status`
