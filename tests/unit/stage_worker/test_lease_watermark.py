"""With the lease_sequence extension, ended leases are fenced by a watermark: memory in
proportion to live leases, not to the leases that ended, for the whole plan generation."""

import dataclasses
import uuid

import numpy as np

from libs.fnx2.wire.codec import decode_frame, encode_frame
from libs.fnx2.wire.control import EXT_LEASE_SEQUENCE, KNOWN_EXTENSIONS
from libs.fnx2.wire.errors import ErrorCode, Fnx2Error
from libs.fnx2.wire.leases import derive_execution_lease_id
from libs.fnx2.wire.messages import Batch, BatchDescriptor, Phase, SequenceSlice, Timings
from libs.fnx2.wire.tensor import Tensor
from services.stage_worker.leases.lease_watermark import LeaseWatermark
from services.stage_worker.leases.receiver_state import Outcome, ReceiverLimits, ReceiverState
from tests.unit.fnx2.factories import BINDING, MANIFEST_HASH, PLAN_HASH, PLAN_ID

TENSOR = Tensor.from_array("activation", "bf16", np.zeros((1, 4), np.float32))
DAY_NS = 24 * 3600 * 10**9
STEP_NS = 10**6
OK = np.zeros((1, 4), np.uint16)


def request(i: int) -> str:
    return str(uuid.UUID(int=i + 1, version=4))


def lease(request_id: str) -> str:
    return derive_execution_lease_id(BINDING.plan_generation_id, PLAN_ID, PLAN_HASH, request_id)


def batch(request_id: str, number: int | None, *, sequence_no: int = 0, budget_ns: int = DAY_NS) -> Batch:
    phase = Phase.PREFILL if sequence_no == 0 else Phase.DECODE
    item = SequenceSlice(request_id, sequence_no, 0, 1, sequence_no, sequence_no, budget_ns,
                         lease(request_id), "t", "s", number)
    descriptor = BatchDescriptor(str(uuid.uuid4()), 0, phase, 1, (item,))
    return Batch(PLAN_ID, PLAN_HASH, MANIFEST_HASH, "stage-0", "stage-1", descriptor, TENSOR)


def open_lease(state: ReceiverState, request_id: str, number: int | None, now: int):
    admission = state.admit(batch(request_id, number), now)
    if admission.rejected:
        return admission.rejected[0]
    item = admission.execute[0]
    state.complete(admission, {item.identity: Outcome(True, OK)}, Timings())
    return None


def refusal(state: ReceiverState, b: Batch, now: int):
    admission = state.admit(b, now)
    state.complete(admission, {}, Timings())
    assert not admission.execute
    return admission.rejected[0]


def test_200k_sequential_leases_never_refused_and_fencing_stays_o_of_live_leases():
    limits = ReceiverLimits()
    state = ReceiverState(BINDING, limits)
    now, live, refused, most = 10**12, [], [], 0
    for i in range(200_000):  # up to 64 live at once, ended in the order they opened
        now += STEP_NS
        rejected = open_lease(state, request(i), i, now)
        if rejected is not None:
            refused.append(rejected.code)
        live.append(request(i))
        if len(live) > 64:
            ended = live.pop(0)
            state.release(ended, lease(ended), 1, now)
        most = max(most, state.fence_entries)
    assert refused == []
    assert state.live_requests == 64 and state.tombstones == 0
    assert most <= limits.recent_end_reasons  # a constant bound, not 200,000 - 64
    first = request(0)  # ended 199,936 leases ago: no tombstone, yet still fenced
    stale = refusal(state, batch(first, 0), now)
    assert stale.code is ErrorCode.RELEASED
    assert refusal(state, batch(first, 0, sequence_no=1), now).code is ErrorCode.RELEASED
    recent = request(199_935)  # the latest to end: its exact code
    assert refusal(state, batch(recent, 199_935), now).code is ErrorCode.RELEASED


def test_an_expired_lease_keeps_its_code_and_a_skipped_number_may_still_open():
    state = ReceiverState(BINDING, ReceiverLimits(lease_idle_ttl_ns=10**9))
    now = 10**12
    assert open_lease(state, request(0), 0, now) is None
    assert open_lease(state, request(2), 2, now) is None  # 1 is still in transit: a gap
    state.sweep(now + DAY_NS)  # both expire at their deadline
    assert refusal(state, batch(request(0), 0), now + DAY_NS).code is ErrorCode.DEADLINE
    later = now + DAY_NS
    assert open_lease(state, request(3), 3, later) is None
    # the gap for 1 lived past its TTL (the idle TTL): closed, so a frame that late is fenced
    assert refusal(state, batch(request(1), 1), later + 1).code is ErrorCode.RELEASED
    state2 = ReceiverState(BINDING)
    assert open_lease(state2, request(0), 0, now) is None
    assert open_lease(state2, request(2), 2, now) is None
    assert open_lease(state2, request(1), 1, now + 1) is None  # out of order, in time: opens
    assert state2.fence_entries == 0 and state2.live_requests == 3


def test_a_plain_peer_keeps_ttl_tombstones():
    state = ReceiverState(BINDING)
    assert open_lease(state, request(0), None, 10**12) is None
    state.release(request(0), lease(request(0)), 1, 10**12)
    assert state.tombstones == 1
    assert refusal(state, batch(request(0), None), 10**12 + 1).code is ErrorCode.RELEASED


def test_watermark_gaps_are_bounded_in_number_and_time():
    mark = LeaseWatermark(max_gaps=3, gap_ttl_ns=100)
    mark.consume(10, now_ns=0)  # 0..9 skipped: only the 3 highest stay open
    assert mark.gaps == 3 and [mark.ended(n) for n in (6, 7, 9, 10, 11)] == [True, False, False, True, False]
    mark.consume(8, now_ns=50)
    assert mark.ended(8) and mark.gaps == 2
    assert mark.evict(100) == 2 and mark.ended(7) and mark.ended(9)


def test_the_field_travels_only_once_negotiated():
    b = batch(request(0), 41)
    encoded = encode_frame(b, 1).to_bytes()
    decoded = decode_frame(encoded, negotiated=KNOWN_EXTENSIONS).message
    assert EXT_LEASE_SEQUENCE in KNOWN_EXTENSIONS
    assert decoded.batch.sequences[0].lease_sequence == 41
    try:
        decode_frame(encoded, negotiated=frozenset())
    except Fnx2Error as exc:
        assert exc.code is ErrorCode.BATCH_CONTRACT
    else:
        raise AssertionError("a plain 2.0 receiver accepted the extension's field")
    plain = dataclasses.replace(b, batch=dataclasses.replace(
        b.batch, sequences=(b.batch.sequences[0]._replace(lease_sequence=None),)))
    assert "lease_sequence" not in encode_frame(plain, 1).to_bytes().decode("latin-1")


def test_the_extensions_ack_names_the_next_lease_number_only_with_lease_sequence():
    from libs.fnx2.wire.control import Ack, AckStage

    control_id = str(uuid.uuid4())
    accepted = Ack("extensions", control_id, AckStage("stage-0", (EXT_LEASE_SEQUENCE, "timings"), 7))
    meta = accepted.to_meta()
    assert meta["lease_sequence_next"] == 7
    assert Ack.from_meta(meta, allow_extensions=True) == accepted
    without = Ack("extensions", control_id, AckStage("stage-0", ("timings",)))
    assert "lease_sequence_next" not in without.to_meta()
    assert Ack.from_meta(without.to_meta(), allow_extensions=True).fields.lease_sequence_next is None
    bad_acks = [
        {**without.to_meta(), "lease_sequence_next": 7},  # the field without its extension
        {k: v for k, v in meta.items() if k != "lease_sequence_next"},  # the extension without it
        {**meta, "lease_sequence_next": -1},
        {**meta, "lease_sequence_next": "7"},
    ]
    for bad in bad_acks:
        try:
            Ack.from_meta(bad, allow_extensions=True)
        except Fnx2Error as exc:
            assert exc.code is ErrorCode.METADATA
        else:
            raise AssertionError(f"accepted {bad}")


def test_the_receiver_reports_one_above_every_number_it_has_seen():
    state = ReceiverState(BINDING)
    assert state.lease_sequence_next == 0
    assert open_lease(state, request(0), 0, 10**12) is None
    assert open_lease(state, request(5), 5, 10**12) is None  # 1..4 are gaps, still below
    assert state.lease_sequence_next == 6
    state.release(request(5), lease(request(5)), 1, 10**12)
    assert state.lease_sequence_next == 6
