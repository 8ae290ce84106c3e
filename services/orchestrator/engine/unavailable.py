"""The error a request gets when its route cannot serve it (a stage is down or gone)."""

from __future__ import annotations

from libs.service.errors import Unavailable

ROUTE_UNAVAILABLE = "ROUTE_UNAVAILABLE"

_PREFIX = "the route is unavailable: "


def route_unavailable(detail: str) -> Unavailable:
    return Unavailable(_PREFIX + detail_of(detail), reason=ROUTE_UNAVAILABLE)


def detail_of(message: str) -> str:
    """The reason without the "route is unavailable" preamble, so it is never doubled."""
    return message.removeprefix(_PREFIX)
