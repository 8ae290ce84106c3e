"""The stage state machine: unloaded -> loading -> ready <-> executing -> draining -> unloaded.

Any state may fall to FAILED; FAILED may only be unloaded or reloaded.
"""

from __future__ import annotations

from enum import Enum

from libs.service.errors import FailedPrecondition


class StageState(Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    EXECUTING = "executing"
    DRAINING = "draining"
    FAILED = "failed"


_ALLOWED: dict[StageState, frozenset[StageState]] = {
    StageState.UNLOADED: frozenset({StageState.LOADING}),
    StageState.LOADING: frozenset({StageState.READY, StageState.FAILED}),
    StageState.READY: frozenset({StageState.EXECUTING, StageState.DRAINING, StageState.UNLOADED, StageState.FAILED}),
    StageState.EXECUTING: frozenset({StageState.READY, StageState.DRAINING, StageState.FAILED}),
    StageState.DRAINING: frozenset({StageState.UNLOADED, StageState.FAILED, StageState.DRAINING}),
    StageState.FAILED: frozenset({StageState.UNLOADED, StageState.LOADING}),
}


class Lifecycle:
    def __init__(self) -> None:
        self.state = StageState.UNLOADED
        self.failure_reason = ""

    def move(self, target: StageState) -> None:
        if target not in _ALLOWED[self.state]:
            raise FailedPrecondition(
                f"stage cannot go from {self.state.value} to {target.value}", reason="STAGE_STATE"
            )
        self.state = target

    def fail(self, reason: str) -> None:
        self.state = StageState.FAILED
        self.failure_reason = reason

    def require(self, *states: StageState) -> None:
        if self.state not in states:
            wanted = " or ".join(s.value for s in states)
            raise FailedPrecondition(f"stage is {self.state.value}, needs {wanted}", reason="STAGE_STATE")
