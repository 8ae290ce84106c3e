"""Continuous-batching scheduler core: schedule -> (pipeline executes) -> update_from_output.

Pure: no clocks (callers pass `now_ns`), no I/O, no logging. The async shell in
`serving.py` drives it and moves its outputs to readers and its releases to the pipeline.

Invariants:
- a request is in at most one in-flight microbatch; microbatches are phase-homogeneous;
- at most `slots` microbatches are in flight, with `slots >= stages`, and ready requests are
  spread evenly over free slots so every stage has work;
- a request's KV identity follows FNX2: prefill is sequence 0 at position 0 with epoch 0;
  each decode is the next sequence at the next position with the epoch every stage reported
  after the previous success;
- every request that reached a stage is released on every stage before it retires, and its
  admission reservation is returned only then;
- a request reaches a stage only once its KV blocks are reserved on every stage; one queued
  for blocks waits (deadline running) and is admitted, oldest first, when releases free them.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from libs.model.logprobs import TokenLogprobs
from libs.model.sampling import SamplingParams
from libs.service.errors import Internal, InvalidArgument
from libs.text.context import TextContext
from libs.text.detokenizer import TextStream
from services.orchestrator.engine.admission import AdmissionControl
from services.orchestrator.engine.domain import (
    FinishReason,
    GenerationRequest,
    Microbatch,
    Phase,
    ReleaseReport,
    RequestOutput,
    RequestSlice,
    RequestSliceResult,
    SchedulerConfig,
    SequenceStatus,
    failed_result,
    request_slice,
)
from services.orchestrator.engine.step_budget import SlotView, StepBudget, plan_step


class _State(enum.Enum):
    QUEUED = "queued"  # accepted, waiting for its KV blocks on every stage (policy queue)
    WAITING = "waiting"  # admitted, prompt not yet (fully) prefilled
    RUNNING = "running"  # has KV on every stage, decodes
    RELEASING = "releasing"  # finished or cancelled; waiting for every stage's release
    SUSPENDED = "suspended"  # its route lost a stage; waits to be replayed on the new route


@dataclass
class _Request:
    req: GenerationRequest
    text: TextStream
    deadline_at_ns: int | None
    state: _State = _State.WAITING
    sequence_no: int = 0
    position: int = 0
    kv_epoch: int = 0
    prefilled: int = 0  # prompt tokens already in every stage's KV
    generated: list[int] = field(default_factory=list)
    # Tokens prefilled after the prompt on a replay: exactly the ones already emitted.
    replayed: tuple[int, ...] = ()
    replays: int = 0
    cached_tokens: int = 0  # prompt tokens the route reused at the latest admission
    inflight: bool = False
    stalled: bool = False
    reached_stage: bool = False
    abort_reason: FinishReason | None = None  # cancel or deadline requested while in flight
    finish_reason: FinishReason | None = None
    final_emitted: bool = False
    # Position in the ready queue: set on admission and each time a result comes back, so
    # decodes are served round-robin and nobody starves behind full microbatches.
    ready_seq: int = 0

    @property
    def prefill_ids(self) -> tuple[int, ...]:
        return self.req.prompt_token_ids + self.replayed


@dataclass(frozen=True)
class SuspendedRequest:
    """A request suspended for replay, as another route's scheduler adopts it."""

    request_id: str
    needed_tokens: int  # prompt + max output tokens: what a replay reserves
    state: _Request = field(repr=False, compare=False)


@dataclass(frozen=True)
class RetiredRequest:
    request_id: str
    finish_reason: FinishReason
    # Every stage's KV epoch at release; empty when the request never reached a stage.
    released_stage_epochs: tuple[int, ...]


def _step_budget(config: SchedulerConfig) -> StepBudget | None:
    if config.max_tokens_per_step < 0 or config.min_prefill_chunk_tokens < 1:
        raise InvalidArgument("max_tokens_per_step must be >= 0 and min_prefill_chunk_tokens >= 1",
                              reason="INVALID_STEP_BUDGET", field="max_tokens_per_step")
    if config.max_tokens_per_step == 0:
        return None
    return StepBudget(config.max_tokens_per_step, config.min_prefill_chunk_tokens,
                      config.max_sequences_per_microbatch)


class Scheduler:
    def __init__(self, config: SchedulerConfig, num_stages: int, text: TextContext,
                 admission: AdmissionControl, *, replay: bool = False) -> None:
        self._config = config
        self._num_stages = num_stages
        if config.pipeline_spare_microbatches < 0:
            raise InvalidArgument(f"pipeline_spare_microbatches {config.pipeline_spare_microbatches} is negative",
                                  reason="INVALID_SCHEDULER_CONFIG", field="pipeline_spare_microbatches")
        spare = config.pipeline_spare_microbatches if num_stages > 1 else 0
        self.slots = max(config.inflight_microbatches, num_stages + spare)
        self._step_budget = _step_budget(config)
        self._text = text
        self._admission = admission
        self._requests: dict[str, _Request] = {}
        self._inflight: dict[int, Microbatch] = {}
        self._busy_slots: set[int] = set()
        self._next_batch_id = 0
        self._ready_counter = 0
        self._last_phase = Phase.DECODE
        self._outputs: list[RequestOutput] = []
        self._releases: list[str] = []
        self._retired: list[RetiredRequest] = []
        # While the route is down nothing is scheduled; with `replay`, greedy requests the
        # failure hit are suspended (not ended) and replayed once the route is back.
        self._paused = False
        self._replay = replay

    @property
    def replay(self) -> bool:
        """Whether greedy requests a route failure hits are suspended for replay (else ended)."""
        return self._replay

    @property
    def paused(self) -> bool:
        return self._paused

    def pause(self) -> None:
        """The route is down: nothing is scheduled until `resume`."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False

    def _next_ready_seq(self) -> int:
        self._ready_counter += 1
        return self._ready_counter

    # ----- intake -----

    def admit(self, req: GenerationRequest, now_ns: int) -> None:
        """Reserves queue and KV space for the request, queues it for KV blocks, or raises a
        capacity error."""
        if req.max_tokens < 1:
            raise InvalidArgument("max_tokens must be at least 1", reason="INVALID_MAX_TOKENS",
                                  field="max_tokens")
        reserved = self._admission.reserve(req.request_id, len(req.prompt_token_ids) + req.max_tokens)
        deadline = None if req.deadline_budget_ns is None else now_ns + req.deadline_budget_ns
        self._requests[req.request_id] = _Request(
            req=req, text=self._text.stream(req.stop), deadline_at_ns=deadline,
            state=_State.WAITING if reserved is not None else _State.QUEUED,
            ready_seq=self._next_ready_seq())

    def cancel(self, request_id: str, reason: FinishReason = FinishReason.CANCELLED) -> bool:
        """Cancels a live request; returns False when it is unknown or already finishing."""
        r = self._requests.get(request_id)
        if r is None or r.state is _State.RELEASING:
            return False
        if r.inflight:
            r.abort_reason = reason
        else:
            self._begin_release(r, reason, emit_now=False)
        return True

    def is_inflight(self, request_id: str) -> bool:
        r = self._requests.get(request_id)
        return r is not None and r.inflight

    def set_stalled(self, request_id: str, stalled: bool) -> None:
        """A reader that cannot keep up stalls its request's decode (backpressure)."""
        r = self._requests.get(request_id)
        if r is not None:
            r.stalled = stalled

    # ----- schedule -----

    def schedule(self, now_ns: int) -> list[Microbatch]:
        self._expire(now_ns)
        if self._paused:
            return []
        self._admit_queued()
        free = [s for s in range(self.slots) if s not in self._busy_slots]
        batches: list[Microbatch] = []
        # A slot takes no more than its fair share of the active requests, so that slots
        # coming back one at a time converge to a balanced partition.
        fair = math.ceil(sum(1 for r in self._requests.values()
                             if r.state not in (_State.RELEASING, _State.QUEUED)) / self.slots)
        if self._step_budget is not None:
            return self._schedule_budgeted(self._step_budget, free, now_ns)
        for index, slot in enumerate(free):
            waiting, decodable = self._ready()
            if not waiting and not decodable:
                break
            phase = (Phase.PREFILL if waiting and (not decodable or self._last_phase is Phase.DECODE)
                     else Phase.DECODE)
            share = min(math.ceil((len(waiting) + len(decodable)) / (len(free) - index)), fair)
            picked = self._pick(waiting if phase is Phase.PREFILL else decodable, share, phase)
            batches.append(self._issue(slot, phase, picked, now_ns))
        return batches

    def _schedule_budgeted(self, budget: StepBudget, free: list[int], now_ns: int) -> list[Microbatch]:
        waiting, decodable = self._ready()
        # One slot is kept for prompt chunks while prompts wait; running requests share the rest.
        running = sum(1 for r in self._requests.values() if r.state is _State.RUNNING)
        fair = math.ceil(running / max(1, self.slots - (1 if waiting else 0)))
        remaining = [len(r.req.prompt_token_ids) - r.prefilled for r in waiting]
        slots = SlotView(len(free), self.slots, any(
            b.phase is Phase.PREFILL for b in self._inflight.values()), self._last_phase, running)
        plan = plan_step(budget, waiting, remaining, decodable, slots, fair)
        return [self._issue(slot, step.phase, list(step.picked), now_ns)
                for slot, step in zip(free, plan, strict=False)]  # plan may fill fewer slots

    def _admit_queued(self) -> None:
        """Requests queued for KV blocks that now fit start prefilling."""
        for reservation in self._admission.admit_waiting():
            r = self._requests[reservation.request_id]
            r.state, r.ready_seq = _State.WAITING, self._next_ready_seq()

    def _ready(self) -> tuple[list[_Request], list[_Request]]:
        waiting, decodable = [], []
        for r in self._requests.values():
            if r.inflight or r.abort_reason is not None:
                continue
            if r.state is _State.WAITING:
                waiting.append(r)
            elif r.state is _State.RUNNING and not r.stalled:
                decodable.append(r)
        decodable.sort(key=lambda r: r.ready_seq)
        return waiting, decodable

    def _pick(self, candidates: list[_Request], share: int,
              phase: Phase) -> list[tuple[_Request, int]]:
        """(request, rows) pairs; a prompt longer than the row budget is prefilled in chunks."""
        limit = min(share, self._config.max_sequences_per_microbatch)
        if phase is Phase.DECODE:
            return [(r, 1) for r in candidates[:limit]]
        picked, budget = [], self._config.max_prefill_rows_per_microbatch
        for r in candidates[:limit]:
            rows = min(len(r.prefill_ids) - r.prefilled, budget)
            if rows <= 0:
                break
            picked.append((r, rows))
            budget -= rows
        return picked

    def _issue(self, slot: int, phase: Phase, picked: list[tuple[_Request, int]],
               now_ns: int) -> Microbatch:
        starts = [0]
        for _, rows in picked:
            starts.append(starts[-1] + rows)
        slices = tuple(self._slice(r, phase, rows, start, now_ns)
                       for (r, rows), start in zip(picked, starts, strict=False))
        for r, _ in picked:
            r.inflight = True
            r.reached_stage = True
        batch = Microbatch(batch_id=self._next_batch_id, slot=slot, phase=phase, slices=slices)
        self._next_batch_id += 1
        self._inflight[batch.batch_id] = batch
        self._busy_slots.add(slot)
        self._last_phase = phase
        return batch

    def _slice(self, r: _Request, phase: Phase, rows: int, row_start: int, now_ns: int) -> RequestSlice:
        tokens = (r.prefill_ids[r.prefilled:r.prefilled + rows]
                  if phase is Phase.PREFILL else (r.generated[-1],))
        budget = None if r.deadline_at_ns is None else max(r.deadline_at_ns - now_ns, 0)
        return request_slice(
            r.req.request_id, r.sequence_no, tuple(tokens), r.position, r.kv_epoch, budget, _sampling(r),
            len(r.generated), len(r.req.prompt_token_ids) + r.req.max_tokens, input_row_start=row_start,
            traceparent=r.req.traceparent,
            prefix_salt=r.req.prefix_salt if r.sequence_no == 0 else None,
            prefix_tail=(tuple(r.prefill_ids[r.prefilled + rows:])
                         if phase is Phase.PREFILL and r.sequence_no == 0 and r.req.prefix_salt is not None
                         else ()))

    def _expire(self, now_ns: int) -> None:
        """A request past its deadline ends now, in flight or not: its reader gets the final
        DEADLINE event at once; an in-flight one is released when its batch comes back."""
        for r in list(self._requests.values()):
            if (r.deadline_at_ns is None or now_ns < r.deadline_at_ns
                    or r.state is _State.RELEASING):
                continue
            if not r.inflight:
                self._begin_release(r, FinishReason.DEADLINE, emit_now=True)
            elif r.abort_reason is None:
                r.abort_reason = FinishReason.DEADLINE
                if not r.final_emitted:
                    self._emit(r, "", (), FinishReason.DEADLINE)
                    r.final_emitted = True

    # ----- results -----

    def update_from_output(self, batch_id: int, results: Sequence[RequestSliceResult]) -> None:
        """Applies microbatch `batch_id`'s results (one per slice, any order)."""
        batch = self._inflight.pop(batch_id, None)
        if batch is None:
            raise Internal(f"result for unknown microbatch {batch_id}",
                           reason="BATCH_RESULT")
        self._busy_slots.discard(batch.slot)
        by_id = {s.request_id: s for s in results}
        for piece in batch.slices:
            r = self._requests[piece.request_id]
            r.inflight = False
            r.ready_seq = self._next_ready_seq()
            seq = by_id.get(piece.request_id) or failed_result(piece, "no result for sequence")
            self._apply(r, piece, seq)

    def _apply(self, r: _Request, piece: RequestSlice, seq: RequestSliceResult) -> None:
        if r.abort_reason is not None:
            self._begin_release(r, r.abort_reason, emit_now=r.abort_reason is not
                                FinishReason.CANCELLED)
            return
        if seq.route_lost and self._replay and _replayable(r):
            r.state = _State.SUSPENDED
            return
        if seq.status is not SequenceStatus.OK:
            reason = FinishReason.UNAVAILABLE if seq.route_lost else {
                SequenceStatus.DEADLINE: FinishReason.DEADLINE,
                SequenceStatus.CANCELLED: FinishReason.CANCELLED,
                SequenceStatus.REJECTED: FinishReason.REJECTED}.get(seq.status, FinishReason.ERROR)
            self._begin_release(r, reason, emit_now=True, error=seq.error or seq.status.value)
            return
        expected = r.kv_epoch + 1
        if seq.sampled_token_id is None or seq.kv_epoch_after != expected:
            self._begin_release(r, FinishReason.ERROR, emit_now=True, error=(
                f"inconsistent result: kv epoch {seq.kv_epoch_after}, expected {expected}, "
                f"token {seq.sampled_token_id}"))
            return
        consumed = len(piece.token_ids)
        if r.sequence_no == 0:
            r.cached_tokens = seq.cached_tokens
            consumed = piece.consumed_tokens(seq.cached_tokens)
        r.kv_epoch = expected
        r.sequence_no += 1
        r.position += consumed
        if r.state is _State.WAITING:
            r.prefilled += consumed
            if r.prefilled < len(r.prefill_ids):
                return  # a middle chunk: its sampled token is not the next token
        r.state = _State.RUNNING
        self._on_token(r, seq.sampled_token_id, () if seq.logprobs is None else (seq.logprobs,))

    def _on_token(self, r: _Request, token_id: int, logprobs: tuple[TokenLogprobs, ...]) -> None:
        r.generated.append(token_id)
        if token_id in r.req.stop_token_ids or (
                token_id in self._text.eos_token_ids and not r.req.ignore_eos):
            self._finish(r, FinishReason.STOP, (token_id,), self._flush(r), logprobs)
            return
        delta = r.text.push(token_id)
        if delta.stopped:
            self._finish(r, FinishReason.STOP, (token_id,), delta.text, logprobs)
        elif len(r.generated) >= r.req.max_tokens:
            self._finish(r, FinishReason.LENGTH, (token_id,), delta.text + self._flush(r),
                         logprobs)
        else:
            self._emit(r, delta.text, (token_id,), None, logprobs=logprobs)

    @staticmethod
    def _flush(r: _Request) -> str:
        return r.text.finish().text

    def _finish(self, r: _Request, reason: FinishReason, token_ids: tuple[int, ...],
                text: str, logprobs: tuple[TokenLogprobs, ...] = ()) -> None:
        self._emit(r, text, token_ids, reason, logprobs=logprobs)
        r.final_emitted = True
        self._begin_release(r, reason, emit_now=False)

    # ----- release and retirement -----

    def _begin_release(self, r: _Request, reason: FinishReason, emit_now: bool,
                       error: str = "") -> None:
        if r.state is _State.SUSPENDED:
            r.reached_stage = False  # its leases belong to a generation that is gone
        r.finish_reason = reason
        if emit_now and not r.final_emitted:
            self._emit(r, "", (), reason, error)
            r.final_emitted = True
        if not r.reached_stage:
            self._retire(r, ())
            return
        r.state = _State.RELEASING
        self._releases.append(r.req.request_id)

    def on_released(self, report: ReleaseReport) -> None:
        """Every stage reported its KV epoch for the request: retire it."""
        r = self._requests.get(report.request_id)
        if r is None or r.state is not _State.RELEASING:
            raise Internal(f"release report for {report.request_id}, which is not releasing",
                           reason="RELEASE")
        if len(report.stage_epochs) != self._num_stages:
            raise Internal(f"release of {report.request_id} reported {len(report.stage_epochs)}"
                           f" of {self._num_stages} stages", reason="RELEASE")
        self._retire(r, report.stage_epochs)

    def suspend_live(self, error: str) -> int:
        """The route failed: greedy requests not in flight are suspended for replay (those in
        flight follow when their batch fails); any other ends now with `error`. Returns how
        many ended."""
        ended = 0
        for r in list(self._requests.values()):
            if r.inflight or r.state not in (_State.WAITING, _State.RUNNING):
                continue
            r.state = _State.SUSPENDED  # ended or not: its fenced leases are not released
            if not _replayable(r):
                self._begin_release(r, FinishReason.UNAVAILABLE, emit_now=True, error=error)
                ended += 1
        return ended

    def replay_suspended(self) -> int:
        """The route is back under a new generation, with no KV anywhere: each suspended
        request prefills its prompt plus every token it already emitted (nothing past what
        the client saw), so its next sampled token is the next new one. Returns how many."""
        count = 0
        for r in self._requests.values():
            if r.state is _State.SUSPENDED:
                self._rewind_for_replay(r)
                r.state = _State.WAITING
                count += 1
        return count

    def _rewind_for_replay(self, r: _Request) -> None:
        r.replayed = tuple(r.generated)
        r.replays += 1
        r.sequence_no = r.position = r.kv_epoch = r.prefilled = 0
        r.reached_stage = False  # the old leases are fenced by the new generation (or another route's)
        r.ready_seq = self._next_ready_seq()

    # ----- hand-off between replica routes -----

    def suspended(self) -> list[SuspendedRequest]:
        """The suspended requests, oldest first, with what a replay of each reserves."""
        waiting = sorted((r for r in self._requests.values() if r.state is _State.SUSPENDED),
                         key=lambda r: r.ready_seq)
        return [SuspendedRequest(r.req.request_id, len(r.req.prompt_token_ids) + r.req.max_tokens, r)
                for r in waiting]

    def adopt(self, moved: SuspendedRequest) -> None:
        """Takes over a request suspended on another route's scheduler, to replay it here
        exactly as `replay_suspended` would there: its prompt plus every token it emitted,
        its detokenizer and stop state carried along. Raises (nothing changed) when this
        route's admission refuses it; queues it when its KV blocks are not free yet."""
        r = moved.state
        if r.state is not _State.SUSPENDED or r.req.request_id in self._requests:
            raise Internal(f"request {r.req.request_id} cannot be adopted", reason="HANDOFF")
        reserved = self._admission.reserve(r.req.request_id, moved.needed_tokens)
        self._rewind_for_replay(r)
        r.inflight = False
        r.state = _State.WAITING if reserved is not None else _State.QUEUED
        self._requests[r.req.request_id] = r

    def forget(self, request_id: str) -> None:
        """A suspended request another route adopted leaves this one: its admission slot is
        returned; its leases here belong to a generation that is fenced or gone."""
        if self._requests.pop(request_id, None) is None:
            raise Internal(f"request {request_id} is not held here", reason="HANDOFF")
        self._admission.release(request_id)

    @property
    def queued_tokens(self) -> int:
        """Tokens admitted and not yet computed: prompts still to prefill plus outputs still to decode."""
        return sum(len(r.prefill_ids) - r.prefilled + r.req.max_tokens - len(r.generated)
                   for r in self._requests.values() if r.state is not _State.RELEASING)

    def end_suspended(self, error: str) -> int:
        """Recovery did not come in time: every suspended request ends with `error`."""
        suspended = [r for r in self._requests.values() if r.state is _State.SUSPENDED]
        for r in suspended:
            r.reached_stage = False  # nothing to release: the route is gone or fenced
            self._begin_release(r, FinishReason.UNAVAILABLE, emit_now=True, error=error)
        return len(suspended)

    @property
    def suspended_requests(self) -> int:
        return sum(1 for r in self._requests.values() if r.state is _State.SUSPENDED)

    def abandon_release(self, request_id: str) -> None:
        """Release could not reach every stage in its time budget: retire the request and
        return its admission slot anyway; the stages' lease expiry frees the KV."""
        r = self._requests.get(request_id)
        if r is None or r.state is not _State.RELEASING:
            raise Internal(f"abandoned release of {request_id}, which is not releasing",
                           reason="RELEASE")
        self._retire(r, ())

    def _retire(self, r: _Request, epochs: tuple[int, ...]) -> None:
        assert r.finish_reason is not None
        if not r.final_emitted:
            self._emit(r, "", (), r.finish_reason)
            r.final_emitted = True
        del self._requests[r.req.request_id]
        self._admission.release(r.req.request_id)
        self._retired.append(RetiredRequest(r.req.request_id, r.finish_reason, epochs))

    def _emit(self, r: _Request, text: str, token_ids: tuple[int, ...],
              reason: FinishReason | None, error: str = "",
              logprobs: tuple[TokenLogprobs, ...] = ()) -> None:
        self._outputs.append(RequestOutput(
            request_id=r.req.request_id, text=text, token_ids=token_ids, finish_reason=reason,
            prompt_tokens=len(r.req.prompt_token_ids), completion_tokens=len(r.generated),
            error=error, logprobs=logprobs, cached_tokens=r.cached_tokens))

    # ----- hand-off to the shell -----

    def take_outputs(self) -> list[RequestOutput]:
        out, self._outputs = self._outputs, []
        return out

    def publish_tokens(self, request_id: str) -> tuple[int, ...]:
        """Every token a releasing request's KV holds (its prompt, then each output fed back)
        when it ended cleanly (stop or length) with a prefix salt: its stages publish those
        blocks, so a later turn repeating this output reuses them. Empty otherwise."""
        r = self._requests.get(request_id)
        if (r is None or r.req.prefix_salt is None
                or r.finish_reason not in (FinishReason.STOP, FinishReason.LENGTH)):
            return ()
        return (r.req.prompt_token_ids + tuple(r.generated))[: r.position]

    def take_releases(self) -> list[str]:
        out, self._releases = self._releases, []
        return out

    def take_retired(self) -> list[RetiredRequest]:
        out, self._retired = self._retired, []
        return out

    @property
    def inflight_microbatches(self) -> int:
        return len(self._inflight)

    @property
    def queued_requests(self) -> int:
        """Requests waiting for KV blocks (not yet on any stage)."""
        return sum(1 for r in self._requests.values() if r.state is _State.QUEUED)

    @property
    def stalled_requests(self) -> int:
        return sum(1 for r in self._requests.values() if r.stalled)

    @property
    def live_requests(self) -> int:
        return len(self._requests)


# A request that fails its route again after this many replays is ended: it may be what
# breaks the route, and replaying it forever would take the route down with it.
MAX_REPLAYS = 2


def _sampling(r: _Request) -> SamplingParams:
    """A replayed request tells the final stage what it already emitted, so grammar state and
    penalties resume where the lost route left them instead of starting over."""
    if not r.replayed:
        return r.req.sampling
    return replace(r.req.sampling, generated_token_ids=r.replayed)


def _replayable(r: _Request) -> bool:
    """Only greedy decoding replays to the same tokens; anything else would be ambiguous."""
    return (r.req.sampling.temperature == 0 and r.abort_reason is None
            and r.replays < MAX_REPLAYS)
