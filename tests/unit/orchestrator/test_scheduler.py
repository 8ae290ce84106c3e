from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.service.errors import ResourceExhausted
from libs.text.context import TextContext
from services.orchestrator.admission import AdmissionConfig, AdmissionControl
from services.orchestrator.domain import (
    FinishReason,
    GenerationRequest,
    Phase,
    SchedulerConfig,
    StageLayout,
)
from services.orchestrator.scheduler import Scheduler
from tests.unit.orchestrator.fakes import FakeStages

STAGES = (StageLayout(0, 2, 100), StageLayout(2, 4, 100))


def make_scheduler(text: TextContext, *, slots: int = 0, max_live: int = 64,
                   budget: int = 10**9, stages=STAGES) -> Scheduler:
    admission = AdmissionControl(AdmissionConfig(max_live, (budget,) * len(stages)), stages)
    return Scheduler(SchedulerConfig(inflight_microbatches=slots), len(stages), text, admission)


def req(rid: str, prompt=(5, 6, 7), max_tokens=4, stop=(), deadline=None) -> GenerationRequest:
    return GenerationRequest(request_id=rid, prompt_token_ids=tuple(prompt),
                             max_tokens=max_tokens, stop=tuple(stop),
                             deadline_budget_ns=deadline)


def run_to_idle(sched: Scheduler, stages: FakeStages, now_ns: int = 0, max_steps: int = 500):
    outputs = []
    for _ in range(max_steps):
        batches = sched.schedule(now_ns)
        for batch in batches:
            sched.update_from_output(stages.execute(batch))
        for rid in sched.take_releases():
            sched.on_released(stages.release(rid))
        outputs += sched.take_outputs()
        if not batches and sched.live_requests == 0:
            return outputs
    raise AssertionError("scheduler did not go idle")


def by_request(outputs):
    grouped = {}
    for out in outputs:
        grouped.setdefault(out.request_id, []).append(out)
    return grouped


def test_prefill_then_decode_with_fnx2_kv_identity(text_context):
    sched, stages = make_scheduler(text_context), FakeStages(2)
    sched.admit(req("a", max_tokens=5), now_ns=0)
    outs = run_to_idle(sched, stages)
    phases = [b.phase for b in stages.executed_batches]
    assert phases == [Phase.PREFILL] + [Phase.DECODE] * 4
    decode_positions = [b.slices[0].token_position_start for b in stages.executed_batches[1:]]
    assert decode_positions == [3, 4, 5, 6]
    assert [b.slices[0].kv_epoch for b in stages.executed_batches] == [0, 1, 2, 3, 4]
    tokens = [t for o in outs for t in o.token_ids]
    assert len(tokens) == 5
    assert outs[-1].finish_reason is FinishReason.LENGTH
    assert (outs[-1].prompt_tokens, outs[-1].completion_tokens) == (3, 5)
    assert "".join(o.text for o in outs) == text_context.tokenizer.decode(tokens)
    assert stages.released["a"] == (5, 5)
    assert stages.live_kv() == [0, 0]
    assert [r.released_stage_epochs for r in sched.take_retired()] == [(5, 5)]


def test_requests_are_partitioned_over_at_least_stage_count_slots(text_context):
    sched, stages = make_scheduler(text_context, stages=STAGES + (StageLayout(4, 6, 100),)), \
        FakeStages(3)
    for i in range(7):
        sched.admit(req(f"r{i}"), now_ns=0)
    batches = sched.schedule(0)
    assert sched.slots == 3
    assert len(batches) == 3
    ids = [s.request_id for b in batches for s in b.slices]
    assert sorted(ids) == sorted(f"r{i}" for i in range(7))
    assert sorted(len(b.slices) for b in batches) == [2, 2, 3]
    assert sched.schedule(0) == []  # every slot busy, every request in flight
    sched.update_from_output(stages.execute(batches[0]))
    again = sched.schedule(0)
    assert len(again) == 1 and again[0].phase is Phase.DECODE
    assert {s.request_id for s in again[0].slices} == {s.request_id for s in batches[0].slices}


def test_eos_finishes_with_stop_and_is_not_in_text(text_context):
    eos = min(text_context.eos_token_ids)
    stages = FakeStages(2, script=lambda rid, i: eos if i == 2 else 70)
    sched = make_scheduler(text_context)
    sched.admit(req("a", max_tokens=10), now_ns=0)
    outs = run_to_idle(sched, stages)
    assert outs[-1].finish_reason is FinishReason.STOP
    assert outs[-1].completion_tokens == 3
    assert "<|im_end|>" not in "".join(o.text for o in outs)


def test_stop_string_across_tokens(text_context):
    ids = text_context.tokenizer.encode("the lazy dog jumps over")
    stages = FakeStages(2, script=lambda rid, i: ids[i])
    sched = make_scheduler(text_context)
    sched.admit(req("a", max_tokens=50, stop=("dog",)), now_ns=0)
    outs = run_to_idle(sched, stages)
    assert "".join(o.text for o in outs) == "the lazy "
    assert outs[-1].finish_reason is FinishReason.STOP


def test_cancel_in_flight_finishes_only_after_every_stage_released(text_context):
    sched, stages = make_scheduler(text_context), FakeStages(2)
    sched.admit(req("a", max_tokens=50), now_ns=0)
    (batch,) = sched.schedule(0)
    assert sched.cancel("a")
    sched.update_from_output(stages.execute(batch))
    assert sched.take_outputs() == []
    assert sched.take_releases() == ["a"]
    assert stages.live_kv() == [1, 1]
    assert sched.schedule(0) == []
    sched.on_released(stages.release("a"))
    (final,) = sched.take_outputs()
    assert final.finish_reason is FinishReason.CANCELLED
    assert stages.live_kv() == [0, 0]
    assert sched.live_requests == 0
    sched.admit(req("b", max_tokens=1), now_ns=0)  # reservation came back


def test_cancel_before_prefill_needs_no_release(text_context):
    sched = make_scheduler(text_context)
    sched.admit(req("a"), now_ns=0)
    assert sched.cancel("a")
    assert sched.take_releases() == []
    assert [o.finish_reason for o in sched.take_outputs()] == [FinishReason.CANCELLED]
    assert not sched.cancel("a")


def test_deadline_is_a_budget(text_context):
    sched, stages = make_scheduler(text_context), FakeStages(2)
    sched.admit(req("a", max_tokens=50, deadline=1000), now_ns=100)
    (batch,) = sched.schedule(now_ns=400)
    assert batch.slices[0].deadline_budget_ns == 700
    sched.update_from_output(stages.execute(batch))
    sched.take_outputs()
    assert sched.schedule(now_ns=1100) == []
    (final,) = sched.take_outputs()
    assert final.finish_reason is FinishReason.DEADLINE
    assert sched.take_releases() == ["a"]


def test_stalled_request_is_not_decoded(text_context):
    sched, stages = make_scheduler(text_context), FakeStages(2)
    sched.admit(req("a", max_tokens=50), now_ns=0)
    (batch,) = sched.schedule(0)
    sched.update_from_output(stages.execute(batch))
    sched.set_stalled("a", True)
    assert sched.schedule(0) == []
    sched.set_stalled("a", False)
    assert len(sched.schedule(0)) == 1


def test_admission_rejects_at_once_and_returns_space_on_retire(text_context):
    sched, stages = make_scheduler(text_context, budget=100 * 10), FakeStages(2)
    sched.admit(req("a", prompt=(1, 2, 3), max_tokens=7), now_ns=0)  # 10 tokens, 1000 bytes
    with pytest.raises(ResourceExhausted, match="KV space on stage 0"):
        sched.admit(req("b", prompt=(1,), max_tokens=1), now_ns=0)
    run_to_idle(sched, stages)
    sched.admit(req("b", prompt=(1,), max_tokens=1), now_ns=0)


def test_queue_space_is_reserved(text_context):
    sched = make_scheduler(text_context, max_live=1)
    sched.admit(req("a"), now_ns=0)
    with pytest.raises(ResourceExhausted, match="queue is full") as info:
        sched.admit(req("b"), now_ns=0)
    assert info.value.reason == "CAPACITY"


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 9), max_tokens=st.lists(st.integers(1, 6), min_size=9, max_size=9),
       order=st.randoms(use_true_random=False), cancels=st.sets(st.integers(0, 8)))
def test_random_interleavings_keep_invariants(text_context, n, max_tokens, order, cancels):
    sched, stages = make_scheduler(text_context, slots=3), FakeStages(2)
    for i in range(n):
        sched.admit(req(f"r{i}", max_tokens=max_tokens[i]), now_ns=0)
    inflight, finals = [], {}
    for step in range(400):
        inflight += sched.schedule(0)
        members = [s.request_id for b in inflight for s in b.slices]
        assert len(members) == len(set(members)), "request in two in-flight microbatches"
        assert len(inflight) <= sched.slots
        if step == 2:
            for i in cancels:
                sched.cancel(f"r{i}")
        if inflight:
            batch = inflight.pop(order.randrange(len(inflight)))
            sched.update_from_output(stages.execute(batch))
        for rid in sched.take_releases():
            sched.on_released(stages.release(rid))
        for out in sched.take_outputs():
            assert out.request_id not in finals, "event after the final one"
            if out.finished:
                finals[out.request_id] = out
        if sched.live_requests == 0 and not inflight:
            break
    assert set(finals) == {f"r{i}" for i in range(n)}
    assert stages.live_kv() == [0, 0]
    for rid, out in finals.items():
        if out.finish_reason is FinishReason.LENGTH:
            assert out.completion_tokens == max_tokens[int(rid[1:])]


def test_a_result_with_the_wrong_kv_epoch_fails_the_request(text_context):
    from services.orchestrator.domain import MicrobatchResult, RequestSliceResult, SequenceStatus

    sched = make_scheduler(text_context)
    sched.admit(req("a"), now_ns=0)
    (batch,) = sched.schedule(0)
    sched.update_from_output(MicrobatchResult(batch.batch_id, (
        RequestSliceResult("a", SequenceStatus.OK, 42, kv_epoch_after=2),)))
    (final,) = sched.take_outputs()
    assert final.finish_reason is FinishReason.ERROR
    assert "expected 1" in final.error
    assert sched.take_releases() == ["a"]


def test_full_microbatches_do_not_starve_anyone(text_context):
    admission = AdmissionControl(AdmissionConfig(64, (10**9, 10**9)), STAGES)
    sched = Scheduler(SchedulerConfig(max_sequences_per_microbatch=2), 2, text_context, admission)
    stages = FakeStages(2)
    for i in range(7):
        sched.admit(req(f"r{i}", max_tokens=1000), now_ns=0)
    inflight = []
    for _ in range(60):  # retire the oldest microbatch each step, as a pipeline would
        inflight += sched.schedule(0)
        sched.update_from_output(stages.execute(inflight.pop(0)))
        sched.take_outputs()
    steady = stages.executed_batches[-35:]  # after every prefill: 35 batches of 2 decodes
    served = [sum(1 for b in steady for s in b.slices if s.request_id == f"r{i}")
              for i in range(7)]
    assert all(b.phase is Phase.DECODE for b in steady)
    assert max(served) - min(served) <= 1, served


def test_long_prompts_are_prefilled_in_chunks_within_the_row_budget(text_context):
    admission = AdmissionControl(AdmissionConfig(64, (10**9, 10**9)), STAGES)
    sched = Scheduler(SchedulerConfig(max_prefill_rows_per_microbatch=4), 2, text_context,
                      admission)
    stages = FakeStages(2)
    sched.admit(req("long", prompt=range(20, 30), max_tokens=3), now_ns=0)
    sched.admit(req("short", prompt=(1, 2), max_tokens=3), now_ns=0)
    outs = run_to_idle(sched, stages)
    prefills = [(s.request_id, s.token_position_start, len(s.token_ids), s.kv_epoch)
                for b in stages.executed_batches if b.phase is Phase.PREFILL for s in b.slices]
    assert [p for p in prefills if p[0] == "long"] == [("long", 0, 4, 0), ("long", 4, 4, 1),
                                                        ("long", 8, 2, 2)]
    assert all(b.row_count <= 4 for b in stages.executed_batches)
    finals = {o.request_id: o for o in outs if o.finished}
    assert finals["long"].completion_tokens == 3 and finals["long"].prompt_tokens == 10
    first_decode = next(b for b in stages.executed_batches if b.phase is Phase.DECODE
                        and b.slices[0].request_id == "long")
    assert first_decode.slices[0].token_position_start == 10
    assert stages.released["long"] == (5, 5)  # three prefill chunks and two decodes


def test_a_multi_stage_route_keeps_spare_microbatches_in_flight_and_a_single_stage_none(text_context):
    admission = AdmissionControl(AdmissionConfig(64, (10**9,) * 2), STAGES)
    pipeline = Scheduler(SchedulerConfig(pipeline_spare_microbatches=1), 2, text_context, admission)
    for i in range(6):
        pipeline.admit(req(f"r{i}"), now_ns=0)
    assert pipeline.slots == 3 and sorted(len(b.slices) for b in pipeline.schedule(0)) == [2, 2, 2]
    one = (StageLayout(0, 4, 100),)
    single = Scheduler(SchedulerConfig(pipeline_spare_microbatches=1), 1, text_context,
                       AdmissionControl(AdmissionConfig(64, (10**9,)), one))
    assert single.slots == 1
