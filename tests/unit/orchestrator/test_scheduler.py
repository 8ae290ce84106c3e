from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.service.errors import ResourceExhausted
from libs.text.context import TextContext
from services.orchestrator.engine.admission import (
    AdmissionConfig,
    AdmissionControl,
    KvBlocksFull,
    KvFullPolicy,
    KvNeverFits,
    KvShortfall,
)
from services.orchestrator.engine.domain import (
    NO_DEADLINE_BUDGET_NS,
    FinishReason,
    GenerationRequest,
    Phase,
    RequestSliceResult,
    SchedulerConfig,
    StageLayout,
    sequence_ok,
)
from services.orchestrator.engine.scheduler import Scheduler
from tests.unit.orchestrator.fakes import FakeStages

STAGES = (StageLayout(0, 2, 100), StageLayout(2, 4, 100))
BLOCK_BYTES = 16 * 100  # a 16-token block of a stage at 100 bytes per token


def make_scheduler(text: TextContext, *, slots: int = 0, max_live: int = 64,
                   budget: int = 10**9, stages=STAGES, kv_full: KvFullPolicy = KvFullPolicy.QUEUE,
                   spare: int = 0, replay: bool = False) -> Scheduler:
    """Without spare microbatches unless asked: slot counts below are the stage count's."""
    admission = AdmissionControl(AdmissionConfig(max_live, (budget,) * len(stages), kv_full), stages)
    return Scheduler(SchedulerConfig(inflight_microbatches=slots, pipeline_spare_microbatches=spare), len(stages),
                     text, admission, replay=replay)


def req(rid: str, prompt=(5, 6, 7), max_tokens=4, stop=(), deadline=None) -> GenerationRequest:
    return GenerationRequest(request_id=rid, prompt_token_ids=tuple(prompt),
                             max_tokens=max_tokens, stop=tuple(stop),
                             deadline_budget_ns=deadline)


def run_to_idle(sched: Scheduler, stages: FakeStages, now_ns: int = 0, max_steps: int = 500):
    outputs = []
    for _ in range(max_steps):
        batches = sched.schedule(now_ns)
        for batch in batches:
            sched.update_from_output(*stages.answer(batch))
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
    decode_positions = [b.slices[0].sequence.token_position_start for b in stages.executed_batches[1:]]
    assert decode_positions == [3, 4, 5, 6]
    assert [b.slices[0].sequence.kv_epoch for b in stages.executed_batches] == [0, 1, 2, 3, 4]
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
    sched.update_from_output(*stages.answer(batches[0]))
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
    sched.update_from_output(*stages.answer(batch))
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


def test_a_microbatch_carries_fnx2_slices_laid_out_row_by_row_with_the_lease_left_to_the_route(text_context):
    sched = make_scheduler(text_context, stages=(StageLayout(0, 4, 100),))  # one slot: one microbatch
    sched.admit(req("a", prompt=(5, 6, 7)), now_ns=0)
    sched.admit(req("b", prompt=(8, 9)), now_ns=0)
    (batch,) = sched.schedule(0)
    sequences = [s.sequence for s in batch.slices]
    assert [(q.request_id, q.input_row_start, q.input_row_count) for q in sequences] == [("a", 0, 3), ("b", 3, 2)]
    assert [q.input_row_count for q in sequences] == [len(s.token_ids) for s in batch.slices]
    assert all(q.execution_lease_id == "" and q.trace_id == q.request_id for q in sequences)
    assert all(q.deadline_budget_ns == NO_DEADLINE_BUDGET_NS for q in sequences)  # no deadline: a day


def test_deadline_is_a_budget(text_context):
    sched, stages = make_scheduler(text_context), FakeStages(2)
    sched.admit(req("a", max_tokens=50, deadline=1000), now_ns=100)
    (batch,) = sched.schedule(now_ns=400)
    assert batch.slices[0].sequence.deadline_budget_ns == 700
    sched.update_from_output(*stages.answer(batch))
    sched.take_outputs()
    assert sched.schedule(now_ns=1100) == []
    (final,) = sched.take_outputs()
    assert final.finish_reason is FinishReason.DEADLINE
    assert sched.take_releases() == ["a"]


def test_stalled_request_is_not_decoded(text_context):
    sched, stages = make_scheduler(text_context), FakeStages(2)
    sched.admit(req("a", max_tokens=50), now_ns=0)
    (batch,) = sched.schedule(0)
    sched.update_from_output(*stages.answer(batch))
    sched.set_stalled("a", True)
    assert sched.schedule(0) == []
    sched.set_stalled("a", False)
    assert len(sched.schedule(0)) == 1


BLOCK_BYTES = 16 * 100  # a 16-token block of a stage at 100 bytes per token


def _batches_of(stages: FakeStages, rid: str) -> list[int]:
    return [i for i, b in enumerate(stages.executed_batches) if any(s.request_id == rid for s in b.slices)]


def test_a_request_waits_for_kv_blocks_then_runs_once_an_earlier_one_retires(text_context):
    sched, stages = make_scheduler(text_context, budget=4 * BLOCK_BYTES), FakeStages(2)
    sched.admit(req("a", max_tokens=45), now_ns=0)  # 48 tokens: 3 of the 4 blocks, runs long
    sched.admit(req("b", max_tokens=13), now_ns=0)  # 16 tokens: the last block, ends first
    sched.admit(req("c", max_tokens=13), now_ns=0)  # 1 block, none free: queued, not refused
    assert sched.queued_requests == 1 and sched.live_requests == 3
    outs = by_request(run_to_idle(sched, stages))
    assert {rid: o[-1].finish_reason for rid, o in outs.items()} == dict.fromkeys("abc", FinishReason.LENGTH)
    assert sum(len(o.token_ids) for o in outs["c"]) == 13
    # c starts once b's release frees its block, while a still runs.
    assert max(_batches_of(stages, "b")) < min(_batches_of(stages, "c")) < max(_batches_of(stages, "a"))
    assert sched.queued_requests == 0 and stages.live_kv() == [0, 0]


def test_requests_waiting_for_blocks_are_admitted_in_arrival_order(text_context):
    sched, stages = make_scheduler(text_context, budget=4 * BLOCK_BYTES), FakeStages(2)
    sched.admit(req("a", max_tokens=45), now_ns=0)  # 3 blocks
    sched.admit(req("big", max_tokens=20), now_ns=0)  # 2 blocks, 1 free: queued
    sched.admit(req("small", max_tokens=1), now_ns=0)  # 1 block would fit, but big came first
    assert sched.queued_requests == 2
    run_to_idle(sched, stages)
    assert max(_batches_of(stages, "a")) < min(_batches_of(stages, "big")) <= min(_batches_of(stages, "small"))


def test_a_request_queued_for_blocks_ends_at_its_deadline_without_reaching_a_stage(text_context):
    sched, stages = make_scheduler(text_context, budget=BLOCK_BYTES), FakeStages(2)
    sched.admit(req("a", max_tokens=13), now_ns=0)
    sched.admit(req("late", max_tokens=1, deadline=1_000), now_ns=0)
    (prefill,) = sched.schedule(0)
    sched.update_from_output(*stages.answer(prefill))
    for batch in sched.schedule(2_000):  # past late's deadline, a still holds the only block
        sched.update_from_output(*stages.answer(batch))
    (out,) = [o for o in sched.take_outputs() if o.request_id == "late"]
    assert out.finish_reason is FinishReason.DEADLINE
    assert sched.queued_requests == 0 and "late" not in _batches_of_ids(stages)
    run_to_idle(sched, stages, now_ns=2_000)
    assert stages.live_kv() == [0, 0]


def _batches_of_ids(stages: FakeStages) -> set[str]:
    return {s.request_id for b in stages.executed_batches for s in b.slices}


@settings(max_examples=30, deadline=None)
@given(max_tokens=st.lists(st.integers(1, 61), min_size=1, max_size=12), slots=st.integers(0, 3))
def test_under_block_pressure_every_request_fits_eventually_and_reservations_never_exceed_a_stage(
        text_context, max_tokens, slots):
    sched, stages = make_scheduler(text_context, slots=slots, budget=4 * BLOCK_BYTES), FakeStages(2)
    for i, n in enumerate(max_tokens):
        sched.admit(req(f"r{i}", max_tokens=n), now_ns=0)  # at most 4 blocks each: all fit alone
    finals = {}
    for _ in range(5000):
        batches = sched.schedule(0)
        assert all(used <= 4 for used in sched._admission.snapshot().stage_kv_reserved_blocks)
        for batch in batches:
            sched.update_from_output(*stages.answer(batch))
        for rid in sched.take_releases():
            sched.on_released(stages.release(rid))
        finals.update((o.request_id, o.finish_reason) for o in sched.take_outputs() if o.finished)
        if not batches and sched.live_requests == 0:
            break
    assert finals == {f"r{i}": FinishReason.LENGTH for i in range(len(max_tokens))}


def test_reject_policy_refuses_with_the_blocks_needed_and_free(text_context):
    sched, stages = make_scheduler(text_context, budget=4 * BLOCK_BYTES, kv_full=KvFullPolicy.REJECT), \
        FakeStages(2)
    sched.admit(req("a", max_tokens=45), now_ns=0)  # 3 of 4 blocks
    with pytest.raises(KvBlocksFull, match="KV space on stage 0") as info:
        sched.admit(req("b", max_tokens=20), now_ns=0)  # 2 blocks
    assert info.value.reason == "KV_BLOCKS_FULL"
    assert info.value.kv_shortfall == KvShortfall(stage=0, needed_blocks=2, free_blocks=1, total_blocks=4,
                                                  block_tokens=16, block_bytes=BLOCK_BYTES)
    assert sched.live_requests == 1 and sched.queued_requests == 0
    run_to_idle(sched, stages)
    sched.admit(req("b", max_tokens=20), now_ns=0)  # a retired: its blocks are free again


@pytest.mark.parametrize("policy", list(KvFullPolicy))
def test_a_request_larger_than_a_stage_is_refused_at_once_under_either_policy(text_context, policy):
    sched = make_scheduler(text_context, budget=4 * BLOCK_BYTES, kv_full=policy)
    with pytest.raises(KvNeverFits) as info:
        sched.admit(req("huge", max_tokens=62), now_ns=0)  # 65 tokens: 5 blocks, the stage holds 4
    assert info.value.reason == "KV_NEVER_FITS" and info.value.field == "max_tokens"
    assert (info.value.kv_shortfall.needed_blocks, info.value.kv_shortfall.total_blocks) == (5, 4)
    assert "stage 0" in info.value.message  # the stage and the bytes are named
    assert f"{5 * BLOCK_BYTES} KV bytes needed, {4 * BLOCK_BYTES} held" in info.value.message
    assert sched.live_requests == 0 and sched.queued_requests == 0


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
            sched.update_from_output(*stages.answer(batch))
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
    from services.orchestrator.engine.domain import RequestSliceResult, sequence_ok

    sched = make_scheduler(text_context)
    sched.admit(req("a"), now_ns=0)
    (batch,) = sched.schedule(0)
    sched.update_from_output(batch.batch_id, (RequestSliceResult(sequence_ok(batch.slices[0], 2), 42),))
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
        sched.update_from_output(*stages.answer(inflight.pop(0)))
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
    prefills = [(s.request_id, s.sequence.token_position_start, len(s.token_ids), s.sequence.kv_epoch)
                for b in stages.executed_batches if b.phase is Phase.PREFILL for s in b.slices]
    assert [p for p in prefills if p[0] == "long"] == [("long", 0, 4, 0), ("long", 4, 4, 1),
                                                        ("long", 8, 2, 2)]
    assert all(b.row_count <= 4 for b in stages.executed_batches)
    finals = {o.request_id: o for o in outs if o.finished}
    assert finals["long"].completion_tokens == 3 and finals["long"].prompt_tokens == 10
    first_decode = next(b for b in stages.executed_batches if b.phase is Phase.DECODE
                        and b.slices[0].request_id == "long")
    assert first_decode.slices[0].sequence.token_position_start == 10
    assert stages.released["long"] == (5, 5)  # three prefill chunks and two decodes


@pytest.mark.parametrize(("cached", "slices"), [
    (0, [(0, 20, 20), (20, 20, 0)]),     # nothing reused: two chunks of the row budget
    (16, [(0, 20, 20), (36, 4, 0)]),     # 16 reused: the first chunk runs on to token 36
    (32, [(0, 20, 20)]),                 # 32 reused: the first chunk finishes the prompt
])
def test_a_reused_prefix_moves_a_chunked_prompts_first_chunk_into_the_rest(text_context, cached, slices):
    """The first chunk carries the rest of the prompt (hashed with it); the tokens every stage
    holds advance the request as well as the rows it computed, so a prompt whose uncached part
    fits the row budget is prefilled in one pass."""
    sched = Scheduler(SchedulerConfig(max_prefill_rows_per_microbatch=20), 2, text_context,
                      AdmissionControl(AdmissionConfig(64, (10**9, 10**9)), STAGES))
    prompt = tuple(range(100, 140))
    sched.admit(GenerationRequest("r", prompt, max_tokens=1, prefix_salt=b"salt"), now_ns=0)
    seen = []
    for epoch in range(4):
        batches = sched.schedule(0)
        if not batches or batches[0].phase is not Phase.PREFILL:
            break
        (piece,) = batches[0].slices
        seen.append((piece.sequence.token_position_start, len(piece.token_ids), len(piece.prefix_tail)))
        if epoch == 0:
            assert piece.prefix_salt == b"salt" and piece.prefix_token_ids == prompt
        reused = cached if epoch == 0 else 0
        sched.update_from_output(batches[0].batch_id, (RequestSliceResult(
            sequence_ok(piece, epoch + 1), 7, cached_tokens=reused),))
    assert seen == slices
    final = [o for o in sched.take_outputs() if o.finished]
    assert final and final[0].prompt_tokens == 40 and final[0].cached_tokens == cached


@pytest.mark.parametrize(("salt", "cancel"), [(b"salt", False), (None, False), (b"salt", True)])
def test_a_cleanly_finished_salted_request_publishes_every_token_its_kv_holds(text_context, salt, cancel):
    sched = make_scheduler(text_context)
    stages = FakeStages(2)
    sched.admit(GenerationRequest("r", (5, 6, 7), max_tokens=3, prefix_salt=salt), now_ns=0)
    published, outputs = None, []
    for _ in range(50):
        if cancel and sched.live_requests and stages.executed_batches:
            sched.cancel("r")
        for batch in sched.schedule(0):
            sched.update_from_output(*stages.answer(batch))
        outputs += sched.take_outputs()
        for rid in sched.take_releases():
            published = sched.publish_tokens(rid)
            sched.on_released(stages.release(rid))
        if published is not None:
            break
    generated = [t for o in outputs for t in o.token_ids]
    if salt is None or cancel:
        assert published == ()
    else:  # the prompt and the outputs fed back: the last one was sampled, never fed
        assert len(generated) == 3 and published == (5, 6, 7, *generated[:-1])


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
