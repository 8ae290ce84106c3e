"""A stage's wall time split into busy, waiting for credit and waiting for input."""

from __future__ import annotations

from services.stage_worker.occupancy import Occupancy, OccupancyTotals


class Clock:
    def __init__(self):
        self.now = 0

    def __call__(self) -> int:
        return self.now


def test_every_instant_lands_in_exactly_one_state():
    clock = Clock()
    occ = Occupancy(clock)
    clock.now = 10  # idle, nothing downstream: waiting for input
    occ.begin_work()  # batch A arrives
    clock.now = 30
    occ.begin_work()  # batch B arrives while A runs: still one busy span
    clock.now = 40
    occ.begin_handoff()  # A goes to the next hop
    occ.end_work()
    clock.now = 55
    occ.end_work()  # B done too (a final stage's answer): idle with A downstream
    clock.now = 70
    occ.begin_work()  # A's result returns: commit
    occ.end_handoff()
    clock.now = 75
    occ.end_work()
    clock.now = 100
    totals = occ.totals()
    assert totals == OccupancyTotals(busy_ns=(55 - 10) + (75 - 70), input_wait_ns=10 + 25, credit_wait_ns=70 - 55)
    assert totals.busy_ns + totals.input_wait_ns + totals.credit_wait_ns == 100
