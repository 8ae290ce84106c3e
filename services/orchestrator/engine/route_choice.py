"""Which of several replica routes takes a request, and where a lost route's streams go.

Pure: each route's load at one instant in, a route index out; no clocks, no I/O. The shell
(`multiroute.py`) reads the loads from its engines and acts on the answer.

- A new request goes to the serving route with the fewest queued tokens (prompt tokens still
  to prefill plus output tokens still to decode) among those whose free KV holds it; more free
  KV breaks a tie, then route order. When no serving route has the KV free, the least queued
  serving route takes it anyway and its own admission queues or refuses it (its KV policy).
- A route that is degraded (a stage lost) or not admitting (draining, closed) takes nothing.
  When no route serves, the answer is None: the caller refuses with ROUTE_UNAVAILABLE.
- Streams stranded on a degraded route are placed one by one, oldest first, each on the route
  a new request of its size would get, counting the ones already placed. A stream with no
  serving route stays where it is and waits for its own route's recovery.

Which route holds a request's prompt prefix in its KV is not weighed: the prefix cache lives
on the stage workers and nothing reports its contents to the orchestrator, so preferring a
route for its prefix would be a guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class RouteLoad:
    index: int
    # Admits requests: not degraded, not draining, not closed.
    serving: bool
    # Tokens admitted and not yet computed: prompts still to prefill plus outputs still to decode.
    queued_tokens: int
    # Tokens of KV the route can still reserve on its fullest stage.
    free_kv_tokens: int


@dataclass(frozen=True)
class Stranded:
    """A stream on a degraded route, waiting to be replayed elsewhere."""

    request_id: str
    # What its replay reserves and computes: prompt plus max output tokens.
    needed_tokens: int


def choose_route(loads: Sequence[RouteLoad], needed_tokens: int) -> int | None:
    """The index of the route that takes a request of `needed_tokens`; None when no route serves."""
    serving = [load for load in loads if load.serving]
    if not serving:
        return None
    fitting = [load for load in serving if load.free_kv_tokens >= needed_tokens] or serving
    return min(fitting, key=lambda load: (load.queued_tokens, -load.free_kv_tokens, load.index)).index


def place_stranded(stranded: Sequence[Stranded], loads: Sequence[RouteLoad]) -> dict[str, int]:
    """Request id -> the route index that replays it, for every stream that has one."""
    current = {load.index: load for load in loads}
    placed: dict[str, int] = {}
    for stream in stranded:
        index = choose_route(list(current.values()), stream.needed_tokens)
        if index is None:
            break  # no route serves: every stream waits for its own route
        load = current[index]
        current[index] = replace(load, queued_tokens=load.queued_tokens + stream.needed_tokens,
                                 free_kv_tokens=load.free_kv_tokens - stream.needed_tokens)
        placed[stream.request_id] = index
    return placed


def unavailable_detail(reasons: Sequence[str | None]) -> str:
    """Why no route serves, naming each route's reason."""
    return "no route serves: " + "; ".join(
        f"route {index}: {reason or 'not admitting'}" for index, reason in enumerate(reasons))
