"""Chunked prefill under a per-step token budget, mixed with decode rows."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.service.errors import InvalidArgument
from services.orchestrator.engine.admission import AdmissionConfig, AdmissionControl
from services.orchestrator.engine.domain import Phase, SchedulerConfig
from services.orchestrator.engine.scheduler import Scheduler
from services.orchestrator.engine.step_budget import SlotView, StepBudget, plan_step, prefill_budget
from tests.unit.orchestrator.fakes import FakeStages
from tests.unit.orchestrator.test_scheduler import STAGES, by_request, req, run_to_idle

BUDGET = StepBudget(tokens_per_step=16, min_prefill_chunk_tokens=4, max_sequences_per_microbatch=64)


def budgeted(text, tokens_per_step=16, min_chunk=4, slots=2, stages=2) -> Scheduler:
    layout = STAGES[:stages] if stages <= len(STAGES) else STAGES
    admission = AdmissionControl(AdmissionConfig(64, (10**9,) * len(layout)), layout)
    config = SchedulerConfig(inflight_microbatches=slots, max_tokens_per_step=tokens_per_step,
                             min_prefill_chunk_tokens=min_chunk)
    return Scheduler(config, len(layout), text, admission)


def test_prefill_budget_counts_the_decode_rows_of_the_step():
    assert prefill_budget(BUDGET, 0) == 16
    assert prefill_budget(BUDGET, 10) == 6
    assert prefill_budget(BUDGET, 40) == 4  # never below the minimum chunk


def test_one_step_carries_every_decode_row_and_a_budgeted_chunk():
    plan = plan_step(BUDGET, ["long"], [100], ["d1", "d2", "d3"],
                     SlotView(2, 2, False, Phase.DECODE), fair_share=4)
    assert [(p.phase, p.picked) for p in plan] == [
        (Phase.DECODE, (("d1", 1), ("d2", 1), ("d3", 1))),
        (Phase.PREFILL, (("long", 13),)),
    ]


def test_one_slot_alternates_decode_and_chunk():
    args = (BUDGET, ["long"], [100], ["d1"])
    after_decode = plan_step(*args, SlotView(1, 1, False, Phase.DECODE), fair_share=2)
    after_prefill = plan_step(*args, SlotView(1, 1, False, Phase.PREFILL), fair_share=2)
    assert [(p.phase, p.picked) for p in after_decode] == [(Phase.PREFILL, (("long", 15),))]
    assert [(p.phase, p.picked) for p in after_prefill] == [(Phase.DECODE, (("d1", 1),))]


def test_short_prompts_share_a_chunk_first_come_first_served():
    plan = plan_step(BUDGET, ["a", "b", "c"], [5, 7, 30], [], SlotView(1, 1, False, Phase.DECODE),
                     fair_share=3)
    assert plan[0].picked == (("a", 5), ("b", 7), ("c", 4))


@settings(max_examples=60, deadline=None)
@given(decode=st.integers(0, 40), remaining=st.lists(st.integers(1, 600), max_size=5),
       slots=st.integers(1, 4), last=st.sampled_from([Phase.DECODE, Phase.PREFILL]),
       prefill_inflight=st.booleans())
def test_plans_stay_within_slots_budget_and_prompts(decode, remaining, slots, last,
                                                    prefill_inflight):
    waiting = [f"w{i}" for i in range(len(remaining))]
    decodable = [f"d{i}" for i in range(decode)]
    plan = plan_step(BUDGET, waiting, remaining, decodable,
                     SlotView(slots, 4, prefill_inflight, last), fair_share=64)
    assert len(plan) <= slots
    prefill_rows = [rows for p in plan if p.phase is Phase.PREFILL for _, rows in p.picked]
    assert sum(prefill_rows) <= prefill_budget(BUDGET, decode)
    chunk = dict(pair for p in plan if p.phase is Phase.PREFILL for pair in p.picked)
    assert all(0 < rows <= remaining[int(w[1:])] for w, rows in chunk.items())
    decoded = [r for p in plan if p.phase is Phase.DECODE for r, rows in p.picked]
    assert len(decoded) == len(set(decoded)) and all(p.picked for p in plan)
    if prefill_inflight:
        assert not prefill_rows  # one prompt chunk at a time: decode keeps a slot
    if decode and (slots > 1 or prefill_inflight or not remaining or last is Phase.PREFILL):
        assert sorted(decoded) == sorted(decodable)  # nobody's next token waits for a prompt


def test_running_requests_get_a_token_every_step_while_a_long_prompt_prefills(text_context):
    sched, stages = budgeted(text_context), FakeStages(2)
    for i in range(3):
        sched.admit(req(f"d{i}", max_tokens=40), now_ns=0)
    for _ in range(2):  # prefill, then the first decode step
        for batch in sched.schedule(0):
            sched.update_from_output(*stages.answer(batch))
    sched.admit(req("long", prompt=range(20, 120), max_tokens=2), now_ns=0)
    before = len(stages.executed_batches)
    for _ in range(8):
        batches = sched.schedule(0)
        assert sorted(s.request_id for b in batches if b.phase is Phase.DECODE
                      for s in b.slices) == ["d0", "d1", "d2"]
        assert sum(b.row_count for b in batches if b.phase is Phase.PREFILL) <= 16 - 3
        for batch in batches:
            sched.update_from_output(*stages.answer(batch))
        sched.take_outputs()
    chunks = [(s.sequence.token_position_start, len(s.token_ids), s.sequence.kv_epoch)
              for b in stages.executed_batches[before:] if b.phase is Phase.PREFILL for s in b.slices]
    assert chunks[:3] == [(0, 13, 0), (13, 13, 1), (26, 13, 2)]


def test_decode_rows_in_flight_count_against_the_chunk():
    plan = plan_step(BUDGET, ["long"], [100], [], SlotView(1, 2, False, Phase.DECODE, running=10),
                     fair_share=10)
    assert [(p.phase, p.picked) for p in plan] == [(Phase.PREFILL, (("long", 6),))]


def test_a_returning_decode_slot_is_not_taken_by_a_second_chunk():
    plan = plan_step(BUDGET, ["long"], [100], ["d1", "d2"], SlotView(1, 2, True, Phase.DECODE),
                     fair_share=2)
    assert [(p.phase, p.picked) for p in plan] == [(Phase.DECODE, (("d1", 1), ("d2", 1)))]


def test_budgeted_scheduling_finishes_every_request_with_fnx2_kv_identity(text_context):
    sched, stages = budgeted(text_context, tokens_per_step=8, min_chunk=2, slots=1), FakeStages(2)
    sched.admit(req("long", prompt=range(20, 61), max_tokens=3), now_ns=0)
    sched.admit(req("short", prompt=(1, 2), max_tokens=5), now_ns=0)
    outs = by_request(run_to_idle(sched, stages))  # FakeStages raises on any KV violation
    assert outs["long"][-1].completion_tokens == 3 and outs["long"][-1].prompt_tokens == 41
    assert outs["short"][-1].completion_tokens == 5
    assert all(b.row_count <= 8 for b in stages.executed_batches)
    assert stages.live_kv() == [0, 0]


def test_a_negative_step_budget_is_refused(text_context):
    with pytest.raises(InvalidArgument) as info:
        budgeted(text_context, tokens_per_step=-1)
    assert info.value.reason == "INVALID_STEP_BUDGET"
