"""Replay in the scheduler core: a request the route failure hit is suspended, then prefills
its prompt plus exactly the tokens it emitted on a fresh generation, and continues with the
tokens an uninterrupted run gives; a non-greedy request ends instead."""

from __future__ import annotations

from dataclasses import replace

from services.orchestrator.engine.domain import (
    FinishReason,
    GenerationRequest,
    Phase,
    RequestSliceResult,
    SamplingParams,
    failed_result,
    sequence_ok,
)
from tests.unit.orchestrator.fakes import FakeStages
from tests.unit.orchestrator.test_scheduler import by_request, make_scheduler, req, run_to_idle


def _tokens(outputs) -> list[int]:
    return [t for o in outputs for t in o.token_ids]


def _script(request_id: str, sample_index: int) -> int:
    """The next token as a function of how far the sequence is, like a greedy model."""
    return 10 + (sample_index * 7) % 50


def _step_until(sched, stages, emitted: int):
    outputs = []
    while len(_tokens(outputs)) < emitted:
        for batch in sched.schedule(0):
            sched.update_from_output(*stages.answer(batch))
        outputs += sched.take_outputs()
    return outputs


def test_suspended_greedy_request_replays_to_the_same_tokens(text_context):
    reference = by_request(run_to_idle(_fresh(text_context), FakeStages(2, _script)))["g"]

    sched, stages = _fresh(text_context), FakeStages(2, _script)
    before = _step_until(sched, stages, 3)
    batch = sched.schedule(0)[0]  # this decode is lost with the stage
    sched.pause()
    sched.update_from_output(batch.batch_id, tuple(
        failed_result(s, "stage 1 died", route_lost=True) for s in batch.slices))
    assert sched.suspended_requests == 1 and sched.schedule(0) == []
    new_generation = FakeStages(2, _script)  # no KV anywhere
    assert sched.replay_suspended() == 1
    sched.resume()
    first = sched.schedule(0)[0]
    assert first.phase is Phase.PREFILL
    emitted = _tokens(before)
    assert first.slices[0].token_ids == (5, 6, 7, *emitted)  # prompt + exactly what was emitted
    # The final stage resumes grammar state and penalties from what was already emitted.
    assert first.slices[0].sampling.generated_token_ids == tuple(emitted)
    assert (first.slices[0].sequence.request_sequence_no, first.slices[0].sequence.kv_epoch) == (0, 0)
    sched.update_from_output(*new_generation.answer(first))
    after = before + sched.take_outputs() + run_to_idle(sched, new_generation)
    assert _tokens(after) == _tokens(reference)  # nothing duplicated, nothing missing
    assert after[-1].finish_reason is FinishReason.LENGTH


def test_a_sampled_request_ends_instead_of_replaying(text_context):
    sched, stages = make_scheduler(text_context, replay=True), FakeStages(2)
    sampled = replace(req("s", max_tokens=10), sampling=SamplingParams(temperature=0.8, seed=3))
    sched.admit(sampled, now_ns=0)
    _step_until(sched, stages, 2)
    sched.suspend_live("the route is unavailable: stage 1 is unreachable")
    final = sched.take_outputs()[-1]
    assert final.finish_reason is FinishReason.UNAVAILABLE
    assert sched.suspended_requests == 0
    assert sched.take_releases() == []  # its leases belong to a fenced generation


def _fresh(text_context):
    sched = make_scheduler(text_context, replay=True)
    sched.admit(req("g", max_tokens=12), now_ns=0)
    return sched


def test_a_request_that_keeps_failing_its_route_stops_being_replayed(text_context):
    from services.orchestrator.engine.scheduler import MAX_REPLAYS

    sched, stages = _fresh(text_context), FakeStages(2, _script)
    _step_until(sched, stages, 1)
    for attempt in range(MAX_REPLAYS + 1):
        batch = sched.schedule(0)[0]
        sched.update_from_output(batch.batch_id, tuple(
            failed_result(s, "lost", route_lost=True) for s in batch.slices))
        if attempt < MAX_REPLAYS:
            assert sched.replay_suspended() == 1
    final = sched.take_outputs()[-1]
    assert final.finish_reason is FinishReason.UNAVAILABLE and sched.suspended_requests == 0


def test_a_replayed_salted_request_reuses_the_prefix_the_new_route_holds(text_context):
    """Replay after a stage failure reuses surviving prefixes: the replay's first slice asks the
    route it runs on (a recovered route, or a replica the stream was handed to) for the prompt
    plus the emitted tokens under the request's own salt, and prefill starts after the whole
    blocks every stage of that route holds."""
    prompt = tuple(range(100, 120))
    sched, stages = make_scheduler(text_context, replay=True), FakeStages(2, _script)
    sched.admit(GenerationRequest("g", prompt, max_tokens=12, prefix_salt=b"tenant"), now_ns=0)
    emitted = _tokens(_step_until(sched, stages, 3))
    batch = sched.schedule(0)[0]  # this decode is lost with the stage
    sched.update_from_output(batch.batch_id, tuple(
        failed_result(s, "stage 1 died", route_lost=True) for s in batch.slices))
    assert sched.replay_suspended() == 1

    first = sched.schedule(0)[0]
    (piece,) = first.slices
    assert first.phase is Phase.PREFILL and piece.sequence.request_sequence_no == 0
    assert piece.prefix_salt == b"tenant"
    assert piece.prefix_token_ids == prompt + tuple(emitted)
    # The route's stages all hold the first 16 tokens (one block): the slice computes only the
    # rest, and the request is fully prefilled after this one pass.
    assert piece.computed_token_ids(16) == (prompt + tuple(emitted))[16:]
    next_token = _script("g", len(emitted))
    sched.update_from_output(first.batch_id, (RequestSliceResult(
        sequence_ok(piece, 1), next_token, cached_tokens=16),))
    assert _tokens(sched.take_outputs()) == [next_token]
    (decode,) = sched.schedule(0)[0].slices
    assert decode.token_ids == (next_token,)
    assert decode.sequence.token_position_start == len(prompt) + len(emitted)
