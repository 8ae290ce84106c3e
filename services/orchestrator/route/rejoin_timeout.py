"""`--rejoin-timeout`, its pure core: which lost replica routes leave the serving set.

A route is *lost* while it does not admit requests and one of its stage workers does not
answer (unreachable or unresponsive: the host is gone). A route degraded for any other cause (a
worker that came back and is being reloaded, a draining stage) is not lost: its host is there.
`LostSince` turns what each health round sees into how long each route has been lost, with the
caller's clock; a route that serves again, or whose host answers again, starts from zero next
time (the timer is cancelled). `decide_rejoin` names the routes lost for at least the timeout;
they are removed only while another route serves, so removing never leaves no serving route
(a route kept says why, and keeps waiting and recovering as a single route does).

No sockets, no clocks, no logging: the shell (`rejoin_watch.py`) reads the routes and the time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.orchestrator.route.host_change import Route, route_name

OFF = 0.0  # a rejoin timeout of 0: a lost route waits for its host however long


@dataclass(frozen=True)
class RouteObservation:
    """One serving-set route as one health round sees it."""

    route: Route
    serving: bool  # admits requests now
    gone_host: str = ""  # a stage worker that does not answer; "" when every one answers


@dataclass(frozen=True)
class RouteWatch:
    route: Route
    serving: bool
    gone_host: str  # "" when the route is not lost
    lost_for_s: float  # how long it has been lost, with that host gone (0 when not lost)

    @property
    def lost(self) -> bool:
        return not self.serving and bool(self.gone_host)


@dataclass(frozen=True)
class RejoinDecision:
    drop: tuple[RouteWatch, ...]  # lost for at least the timeout, with another route serving
    kept: tuple[RouteWatch, ...]  # lost for at least the timeout, kept: no other route serves
    why_kept: str = ""  # "" when none is kept


class LostSince:
    """Since when each route has been lost, on the caller's clock (seconds)."""

    def __init__(self) -> None:
        self._since: dict[Route, float] = {}

    def observe(self, now_s: float, routes: Sequence[RouteObservation]) -> tuple[RouteWatch, ...]:
        """Each route's watch now; a route no longer lost (or no longer in the set) is forgotten."""
        watches = []
        for seen in routes:
            lost = not seen.serving and bool(seen.gone_host)
            if lost:
                since = self._since.setdefault(seen.route, now_s)
            else:
                self._since.pop(seen.route, None)
            watches.append(RouteWatch(seen.route, seen.serving, seen.gone_host if lost else "",
                                      now_s - since if lost else 0.0))
        for gone in self._since.keys() - {seen.route for seen in routes}:
            del self._since[gone]
        return tuple(watches)


def decide_rejoin(routes: Sequence[RouteWatch], timeout_s: float) -> RejoinDecision:
    """The routes lost for at least `timeout_s` (none when it is `OFF`). They are dropped when
    a route outside them serves; else every one is kept, and `why_kept` says so."""
    if timeout_s <= OFF:
        return RejoinDecision((), ())
    overdue = tuple(w for w in routes if w.lost and w.lost_for_s >= timeout_s)
    if not overdue:
        return RejoinDecision((), ())
    if any(w.serving for w in routes if w not in overdue):
        return RejoinDecision(overdue, ())
    names = ", ".join(f"{route_name(w.route)} (host {w.gone_host} gone {w.lost_for_s:.1f} s)" for w in overdue)
    return RejoinDecision((), overdue, f"removing {names} would leave no serving route: "
                                       "kept, waiting for its host")
