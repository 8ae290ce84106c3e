"""Run a coroutine at once, in the caller's turn of the event loop, and make it a task only
if it suspends (what Python 3.12's eager task factory does, for 3.11).

A receiver hands each admitted batch to its stage handler this way: a batch whose handler
completes without waiting is executed and answered with no event-loop hop at all; one that
waits (a next hop, a device) continues as a task, so the channel keeps reading.
The inline part runs in the caller's task: code that needs its own task identity
(`asyncio.timeout`, `current_task`) must not run before the first suspension. It runs in its
own copy of the caller's context variables, and the task carries on in that same copy, as a
task would: a context variable set before the first suspension (an OpenTelemetry span made
current, say) is reset after it against the context that set it, and never leaks into the
caller's.
"""

from __future__ import annotations

import asyncio
import contextvars
import types
from collections.abc import Coroutine, Generator
from typing import Any


def start_eagerly(coro: Coroutine[Any, Any, None]) -> asyncio.Task | None:
    """None when `coro` finished inline; otherwise the task that carries on with it."""
    context = contextvars.copy_context()
    try:
        blocked_on = context.run(coro.send, None)
    except StopIteration:
        return None
    task = asyncio.get_running_loop().create_task(_carry_on(coro, blocked_on), context=context)
    # A task cancelled before its first step never enters `_carry_on`: close `coro` then,
    # so its `finally` blocks still run (a no-op once it finished).
    task.add_done_callback(lambda _task: coro.close())
    return task


@types.coroutine
def _carry_on(coro: Coroutine[Any, Any, None], blocked_on: Any) -> Generator[Any, None, None]:
    """Hand the future `coro` is blocked on to the task, then keep driving `coro`, passing
    a cancellation (or anything thrown in) through to it."""
    while True:
        try:
            yield blocked_on
        except BaseException as exc:  # noqa: BLE001 - forwarded to the coroutine, which decides
            try:
                blocked_on = coro.throw(exc)
            except StopIteration:
                return
            continue
        try:
            blocked_on = coro.send(None)
        except StopIteration:
            return
