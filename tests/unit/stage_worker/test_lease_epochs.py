"""A stage process keeps each lease's KV epoch in one place: the lease rules read it from the
epoch source they are given (the stage's KV store in a worker) and keep no counter of their own."""

import dataclasses

import numpy as np

from libs.fnx2.wire.messages import Phase
from libs.model.kv_store import KvLayout, KvStore, kv_slice
from services.stage_worker.leases.epochs import CommittedSteps, StageKvEpochs
from services.stage_worker.leases.receiver_state import ReceiverState, _Lease
from tests.unit.fnx2.factories import BINDING, REQ_A, REQ_B, batch
from tests.unit.stage_worker.test_receiver_state import codes, prefill_both, run


class FixedEpochs(CommittedSteps):
    """An epoch source that disagrees with the steps the rules saw: the rules must follow it."""

    def __init__(self, epoch: int) -> None:
        super().__init__()
        self.epoch = epoch
        self.committed: list[str] = []
        self.forgotten: list[str] = []

    def epoch_of(self, request_id: str, lease_id: str) -> int:
        return self.epoch

    def step_committed(self, request_id: str, lease_id: str) -> None:
        self.committed.append(request_id)

    def forget(self, request_id: str, lease_id: str) -> None:
        self.forgotten.append(request_id)


def test_the_lease_rules_keep_no_epoch_of_their_own():
    assert "epoch" not in {f.name for f in dataclasses.fields(_Lease)}


def test_a_slice_is_checked_against_the_injected_epoch_source():
    epochs = FixedEpochs(epoch=1)
    state = ReceiverState(BINDING, epochs=epochs)
    prefill_both(state)
    assert epochs.committed == [REQ_A, REQ_B]
    epochs.epoch = 7  # the KV store says so: a slice at epoch 1 is stale
    _, results = run(state, batch(Phase.DECODE, rows=(1, 1), sequence_no=1, position=2, epoch=1))
    assert set(codes(results).values()) == {"STALE_KV"}
    assert all("stage KV epoch is 7" in r.error_message for r in results.values())
    assert state.epoch_of(REQ_A) == 7
    ack = state.release(REQ_A, state._leases[REQ_A].lease_id, None)
    assert ack.released and ack.kv_epoch == 7 and epochs.forgotten == [REQ_A]


def test_a_stage_kv_store_is_the_epoch_source_and_advances_on_commit_only():
    layout = KvLayout(layer_count=1, kv_lora_rank=4, rope_dim=2)
    store = KvStore(layout, bytes_limit=1 << 20)
    epochs = StageKvEpochs(store)
    assert epochs.epoch_of("r", "lease") == 0  # nothing committed yet
    piece = kv_slice("r", "lease", 0, 0, 0, 3)
    store.commit(piece, np.zeros((1, 3, 4), np.float32), np.zeros((1, 3, 2), np.float32))
    epochs.step_committed("r", "lease")  # the store already advanced: no double count
    assert epochs.epoch_of("r", "lease") == 1 == store.epoch(("r", "lease"))
    store.release("r", "lease")
    assert epochs.epoch_of("r", "lease") == 0
