"""Per-sequence and runtime FNX2 rules of the receiver core, with an explicit clock."""

import numpy as np
import pytest

from libs.fnx2.wire.errors import ErrorCode, Fnx2Error
from libs.fnx2.wire.messages import Phase, SequenceStatus, Timings
from services.stage_worker.leases.receiver_state import Outcome, ReceiverLimits, ReceiverState
from tests.unit.fnx2.factories import BINDING, MINUTE_NS, REQ_A, REQ_B, batch, lease, roundtrip

HOUR_NS = 3600 * 10**9
T0 = 5 * HOUR_NS


def run(state, b, now=T0, ok=True):
    admission = state.admit(roundtrip(b), now)
    outcomes = {s.identity: Outcome(ok, np.asarray(admission.batch.tensor.rows(
        s.input_row_start, s.input_row_count)), kind=None) for s in admission.execute}
    entries = state.complete(admission, outcomes, Timings())
    return admission, {e.result.request_id: e.result for e in entries}


def codes(results):
    return {rid: r.error_code for rid, r in results.items()}


def prefill_both(state):
    return run(state, batch(rows=(2, 2)))


def decode(step, **kw):
    return batch(Phase.DECODE, rows=(1, 1), sequence_no=step, position=1 + step,
                 epoch=step, **kw)


def test_epochs_advance_by_one_on_success_only():
    state = ReceiverState(BINDING)
    _, results = prefill_both(state)
    assert {r.kv_epoch_after for r in results.values()} == {1}
    _, results = run(state, batch(Phase.DECODE, rows=(1, 1), sequence_no=1, position=2, epoch=1,
                                  requests=(REQ_A, REQ_B)), ok=False)
    assert all(r.status is SequenceStatus.FAILED and r.kv_epoch_after == 1 for r in results.values())
    assert state.epoch_of(REQ_A) == 1


def test_exact_replay_returns_cached_result_without_execution():
    state = ReceiverState(BINDING)
    first, results = prefill_both(state)
    again, replayed = run(state, batch(rows=(2, 2)))
    assert again.execute == () and len(again.replayed) == 2
    assert replayed[REQ_A] == results[REQ_A]
    assert state.epoch_of(REQ_A) == 1


def test_same_identity_with_different_input_is_sequence_conflict():
    state = ReceiverState(BINDING)
    prefill_both(state)
    _, results = run(state, batch(rows=(2, 2), seed=99))
    assert codes(results) == {REQ_A: "SEQUENCE_CONFLICT", REQ_B: "SEQUENCE_CONFLICT"}


def test_sequence_position_phase_and_stale_kv():
    state = ReceiverState(BINDING)
    prefill_both(state)
    _, r = run(state, batch(Phase.DECODE, rows=(1, 1), sequence_no=5, position=2, epoch=1))
    assert set(codes(r).values()) == {"SEQUENCE"}
    _, r = run(state, batch(Phase.DECODE, rows=(1, 1), sequence_no=1, position=2, epoch=0))
    assert set(codes(r).values()) == {"STALE_KV"}
    _, r = run(state, batch(Phase.DECODE, rows=(1, 1), sequence_no=1, position=9, epoch=1))
    assert set(codes(r).values()) == {"POSITION"}
    _, r = run(state, batch(Phase.DECODE, rows=(1,), requests=(REQ_A,), sequence_no=1,
                            position=2, epoch=1))
    assert r[REQ_A].status is SequenceStatus.OK
    _, r = run(state, batch(Phase.PREFILL, rows=(1,), requests=(REQ_A,), sequence_no=2,
                            position=3, epoch=2))
    assert codes(r) == {REQ_A: "PHASE"}


def test_new_lease_rules():
    state = ReceiverState(BINDING)
    _, r = run(state, batch(Phase.DECODE, rows=(1, 1)))
    assert set(codes(r).values()) == {"PHASE"}
    _, r = run(state, batch(sequence_no=1))
    assert set(codes(r).values()) == {"UNKNOWN_LEASE"}
    _, r = run(state, batch(leases=(lease(REQ_A, "88888888-8888-4888-8888-888888888888"),
                                    lease(REQ_B))))
    assert codes(r) == {REQ_A: "UNKNOWN_LEASE", REQ_B: None}


def test_lease_conflict_and_inflight():
    state = ReceiverState(BINDING, ReceiverLimits(frames=2))
    admission = state.admit(roundtrip(batch(rows=(2,), requests=(REQ_A,))), T0)
    b = roundtrip(batch(rows=(2,), requests=(REQ_A,), seed=3))
    second = state.admit(b, T0)
    assert second.rejected[0].code is ErrorCode.REQUEST_INFLIGHT
    state.complete(second, {}, Timings())
    state.complete(admission, {admission.execute[0].identity: Outcome(True, np.zeros((2, 4)))},
                   Timings())
    foreign = "33333333-3333-4333-8333-333333333333"
    _, r = run(state, batch(Phase.DECODE, rows=(1,), requests=(REQ_A,), sequence_no=1, position=2,
                            epoch=1, leases=(lease(foreign),)))
    assert codes(r) == {REQ_A: "UNKNOWN_LEASE"}  # a lease derived for another request


def test_cancel_then_release_tombstones_the_lease():
    state = ReceiverState(BINDING)
    prefill_both(state)
    ack = state.cancel(REQ_A, lease(REQ_A))
    assert ack.cancelled and not ack.inflight and not ack.kv_mutated
    _, r = run(state, decode(1))
    assert r[REQ_A].status is SequenceStatus.CANCELLED and codes(r)[REQ_A] == "CANCELLED"
    assert r[REQ_B].status is SequenceStatus.OK
    with pytest.raises(Fnx2Error) as info:
        state.release(REQ_A, lease(REQ_A), expected_final_epoch=7)
    assert info.value.code is ErrorCode.STALE_KV
    released = state.release(REQ_A, lease(REQ_A), expected_final_epoch=1)
    assert released.released and released.kv_epoch == 1 and released.tombstone_present
    again = state.release(REQ_A, lease(REQ_A), None)
    assert not again.released and again.tombstone_present
    _, r = run(state, batch(rows=(2,), requests=(REQ_A,)))
    assert codes(r) == {REQ_A: "RELEASED"}
    assert state.live_requests == 1 and state.tombstones == 1


def test_release_while_executing_is_request_inflight():
    state = ReceiverState(BINDING)
    state.admit(roundtrip(batch(rows=(2,), requests=(REQ_A,))), T0)
    with pytest.raises(Fnx2Error) as info:
        state.release(REQ_A, lease(REQ_A), None)
    assert info.value.code is ErrorCode.REQUEST_INFLIGHT


def test_tombstone_table_full_fails_closed():
    state = ReceiverState(BINDING, ReceiverLimits(tombstone_capacity=2))
    prefill_both(state)
    state.release(REQ_A, lease(REQ_A), None)
    state.release(REQ_B, lease(REQ_B), None)
    fresh = "44444444-4444-4444-8444-444444444444"
    _, r = run(state, batch(rows=(1,), requests=(fresh,)))
    assert codes(r) == {fresh: "TOMBSTONE_CAPACITY"}
    with pytest.raises(Fnx2Error) as info:
        state.release(fresh, lease(fresh), None)
    assert info.value.code is ErrorCode.TOMBSTONE_CAPACITY


def test_deadline_budget_zero_and_retry_only_tightens():
    state = ReceiverState(BINDING)
    _, r = run(state, batch(rows=(1,), requests=(REQ_A,), budget_ns=0))
    assert r[REQ_A].status is SequenceStatus.DEADLINE and codes(r)[REQ_A] == "DEADLINE"
    _, r = run(state, batch(rows=(1,), requests=(REQ_A,)))  # expired leases stay tombstoned
    assert codes(r) == {REQ_A: "DEADLINE"}
    # B: first receipt sets a 1-minute deadline; a retry offering an hour cannot extend it.
    admission = state.admit(roundtrip(batch(rows=(1,), requests=(REQ_B,))), T0)
    state.complete(admission, {}, Timings())  # failed execution keeps the lease at epoch 0
    _, r = run(state, batch(rows=(1,), requests=(REQ_B,), budget_ns=HOUR_NS), now=T0 + 2 * MINUTE_NS)
    assert codes(r) == {REQ_B: "DEADLINE"}


def test_sweep_expires_idle_leases():
    state = ReceiverState(BINDING)
    prefill_both(state)
    assert state.sweep(T0 + MINUTE_NS // 2) == []
    freed = state.sweep(T0 + MINUTE_NS)
    assert sorted(freed) == sorted([(REQ_A, lease(REQ_A)), (REQ_B, lease(REQ_B))])
    assert state.live_requests == 0 and state.tombstones == 2


def test_credits_are_receiver_authoritative():
    state = ReceiverState(BINDING, ReceiverLimits(frames=1, rows=4, live_requests=1,
                                                  kv_bytes=100, kv_bytes_per_row=10))
    with pytest.raises(Fnx2Error) as info:
        state.admit(roundtrip(batch()), T0)  # 5 rows > 4
    assert info.value.code is ErrorCode.CREDIT
    admission = state.admit(roundtrip(batch(rows=(1, 1))), T0)
    assert [r.code for r in admission.rejected] == [ErrorCode.ADMISSION]  # one live request
    assert state.credit().frames == 0
    with pytest.raises(Fnx2Error):
        state.admit(roundtrip(batch(rows=(1,), requests=(REQ_B,), seed=5)), T0)
    state.complete(admission, {admission.execute[0].identity: Outcome(True, np.zeros((1, 4)))},
                   Timings())
    credit = state.credit()
    assert credit.frames == 1 and credit.live_requests == 0 and credit.kv_bytes == 90
    assert min(credit.frames, credit.rows, credit.kv_bytes, credit.replay_bytes) >= 0


def test_large_inputs_replay_and_conflict_by_crc():
    state = ReceiverState(BINDING)
    big = {"rows": (40,), "requests": (REQ_A,), "width": 1024, "dtype": "fp32"}  # 160 KiB slice
    _, first = run(state, batch(**big))
    again, replayed = run(state, batch(**big))
    assert again.execute == () and replayed[REQ_A] == first[REQ_A]
    _, conflict = run(state, batch(seed=4, **big))
    assert codes(conflict) == {REQ_A: "SEQUENCE_CONFLICT"}


def test_a_lease_opens_at_a_whole_block_prefix_only_when_the_stage_pages_kv():
    plain = ReceiverState(BINDING)
    _, r = run(plain, batch(rows=(2, 2), position=16))
    assert set(codes(r).values()) == {"POSITION"}  # no prefix reuse: position 0 only
    paged = ReceiverState(BINDING, ReceiverLimits(prefix_block_tokens=16))
    _, r = run(paged, batch(rows=(2, 2), position=5))
    assert set(codes(r).values()) == {"POSITION"}  # not a whole block
    _, r = run(paged, batch(rows=(2, 2), position=32))
    assert all(x.status is SequenceStatus.OK for x in r.values())
    _, r = run(paged, batch(Phase.DECODE, rows=(1, 1), sequence_no=1, position=34, epoch=1))
    assert all(x.status is SequenceStatus.OK for x in r.values())  # continues after the prefix
