"""Tombstones cost memory in proportion to leases that ended within their TTL, so a long
run of requests in one plan generation is never refused, while a late frame for a lease
that just ended is still fenced."""

import uuid

import numpy as np

from libs.fnx2.wire.leases import derive_execution_lease_id
from libs.fnx2.wire.messages import Batch, BatchDescriptor, Phase, SequenceSlice, Timings
from libs.fnx2.wire.tensor import Tensor
from services.stage_worker.leases.receiver_state import Outcome, ReceiverLimits, ReceiverState
from services.stage_worker.leases.tombstones import Tombstone, TombstoneTable
from tests.unit.fnx2.factories import BINDING, MANIFEST_HASH, PLAN_HASH, PLAN_ID

TENSOR = Tensor.from_array("activation", "bf16", np.zeros((1, 4), np.float32))
DAY_NS = 24 * 3600 * 10**9  # the orchestrator's budget when a request has no deadline
STEP_NS = 10**6  # one lease opened and released per millisecond: 1,000 per second


def prefill(request_id: str) -> Batch:
    lease = derive_execution_lease_id(BINDING.plan_generation_id, PLAN_ID, PLAN_HASH, request_id)
    item = SequenceSlice(request_id, 0, 0, 1, 0, 0, DAY_NS, lease, "t", "s")
    descriptor = BatchDescriptor(request_id, 0, Phase.PREFILL, 1, (item,))
    return Batch(PLAN_ID, PLAN_HASH, MANIFEST_HASH, "stage-0", "stage-1", descriptor, TENSOR)


def cycle(state: ReceiverState, request_id: str, now_ns: int) -> str | None:
    """Open a lease with a prefill, complete it and release it; the refusal code, if any."""
    admission = state.admit(prefill(request_id), now_ns)
    if admission.rejected:
        return admission.rejected[0].code.value
    item = admission.execute[0]
    state.complete(admission, {item.identity: Outcome(True, np.zeros((1, 4), np.uint16))}, Timings())
    state.release(request_id, item.execution_lease_id, 1, now_ns)
    return None


def test_200k_sequential_leases_in_one_generation_are_never_refused():
    limits = ReceiverLimits()
    state = ReceiverState(BINDING, limits)
    now, refused, most_tombstones = 10**12, [], 0
    requests = [str(uuid.UUID(int=i + 1, version=4)) for i in range(200_000)]
    for request_id in requests:
        now += STEP_NS
        code = cycle(state, request_id, now)
        if code is not None:
            refused.append(code)
        most_tombstones = max(most_tombstones, state.tombstones)
    assert refused == []
    assert state.live_requests == 0
    window = limits.tombstone_ttl_ns // STEP_NS
    assert most_tombstones <= window + 1 < limits.tombstone_capacity
    # the lease that ended last is still fenced: its late prefill cannot reopen it
    assert cycle(state, requests[-1], now + STEP_NS) == "RELEASED"


def test_tombstone_table_forgets_in_order_and_keeps_the_latest_clock():
    table = TombstoneTable(ttl_ns=100)
    table.add("a", Tombstone.RELEASED, now_ns=1000)
    table.add("b", Tombstone.EXPIRED, now_ns=1050)
    table.add("c", Tombstone.RELEASED, now_ns=900)  # a clock reading behind: dated 1050
    assert table.evict(1099) == 0 and len(table) == 3
    assert table.evict(1100) == 1 and "a" not in table and table.get("b") is Tombstone.EXPIRED
    assert table.evict(1150) == 2 and len(table) == 0


def test_a_lease_nobody_touches_expires_after_its_idle_ttl_even_with_a_day_of_budget():
    state = ReceiverState(BINDING, ReceiverLimits(lease_idle_ttl_ns=10 * 60 * 10**9))
    request = str(uuid.UUID(int=7, version=4))
    admission = state.admit(prefill(request), 10**12)
    item = admission.execute[0]
    state.complete(admission, {item.identity: Outcome(True, np.zeros((1, 4), np.uint16))}, Timings())
    assert state.sweep(10**12 + 10 * 60 * 10**9 - 1) == []  # the sender may still come back
    assert state.sweep(10**12 + 10 * 60 * 10**9) == [(request, item.execution_lease_id)]
    assert state.live_requests == 0
