"""Run a computation in a child process that exits with it.

A process that has run a MAX graph keeps a runtime thread awake even when idle: measured on
this project's AMD EPYC box (a 64x64 matmul graph run 100 times, then 3 s idle, per-thread
`/proc/self/task/*/schedstat`), one thread switched about 5,000 times a second and used 83 ms
of CPU per second; a process that never ran MAX, or ran only torch, used none. `fornax qualify`
measures the route's stages on the same CPUs its own process runs on, so its computations that
run stages on their backends (the staged boundary parity) run here, in a spawned child that
exits before any measured run: the gate's process holds no MAX runtime while it measures.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class ChildCallFailed(RuntimeError):
    """The child's call raised; the message names its exception type, `reason` its stable code."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


def _trampoline(fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[bool, Any]:
    """In the child: the call's result, or its exception as plain, picklable fields."""
    try:
        return True, fn(*args, **kwargs)
    except Exception as exc:  # re-raised in the parent as ChildCallFailed, reason kept
        return False, (type(exc).__name__, str(exc), str(getattr(exc, "reason", "") or ""))


def call_in_child(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` in a fresh spawned process (nothing inherited but the environment and
    the arguments), which has exited when this returns. `fn` must be a module-level function and
    its arguments and result picklable."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        ok, value = pool.submit(_trampoline, fn, args, kwargs).result()
    if not ok:
        name, message, reason = value
        raise ChildCallFailed(f"{name}: {message}", reason)
    return value
