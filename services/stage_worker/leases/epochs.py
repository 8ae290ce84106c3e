"""Where a stage process keeps each lease's KV epoch: one place, injected into the lease rules.

FNX2's KV epoch counts a lease's committed steps. A stage worker's KV store already advances it
when a step's rows are committed and forgets it when the lease's KV is released, so the worker
hands the lease rules (`receiver_state.py`) a view of the store (`StageKvEpochs`) and they keep
no counter of their own. Tools whose handler keeps no KV (the frame fuzzer, the bench peer, the
link probe) use `CommittedSteps`, which counts the steps the rules saw succeed.
"""

from __future__ import annotations

from typing import Protocol

from libs.model.errors import ModelError
from libs.model.kv_store import KvStore


class LeaseEpochs(Protocol):
    def epoch_of(self, request_id: str, lease_id: str) -> int:
        """The lease's KV epoch; 0 while it has committed nothing."""
        ...

    def step_committed(self, request_id: str, lease_id: str) -> None:
        """A step of the lease succeeded (a KV store has already advanced its own epoch)."""
        ...

    def forget(self, request_id: str, lease_id: str) -> None:
        """The lease ended."""
        ...


class CommittedSteps:
    """Epochs for a channel whose handler keeps no KV: the count of successful steps."""

    def __init__(self) -> None:
        self._steps: dict[tuple[str, str], int] = {}

    def epoch_of(self, request_id: str, lease_id: str) -> int:
        return self._steps.get((request_id, lease_id), 0)

    def step_committed(self, request_id: str, lease_id: str) -> None:
        key = (request_id, lease_id)
        self._steps[key] = self._steps.get(key, 0) + 1

    def forget(self, request_id: str, lease_id: str) -> None:
        self._steps.pop((request_id, lease_id), None)


class StageKvEpochs:
    """The stage's KV store as the lease rules' epoch source. The store advances a lease's
    epoch when it commits the step's rows and forgets it on release, so the rules'
    notifications need no action here."""

    def __init__(self, store: KvStore) -> None:
        self._store = store

    def epoch_of(self, request_id: str, lease_id: str) -> int:
        try:
            return self._store.epoch((request_id, lease_id))
        except ModelError:  # no KV committed yet (or released): nothing counted
            return 0

    def step_committed(self, request_id: str, lease_id: str) -> None:
        return None

    def forget(self, request_id: str, lease_id: str) -> None:
        return None
