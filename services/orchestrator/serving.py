"""The async shell around the scheduler: drives a Pipeline and feeds per-request streams.

Everything here runs on one event loop, so the scheduler is never touched concurrently.
`_pump` is the only place that schedules: it runs after every state change (a new request,
a microbatch result, a release, a reader making room, a cancel) and on a timer when a
deadline is due.
"""

from __future__ import annotations

import asyncio
import collections
import secrets
import time
from dataclasses import dataclass, replace

import structlog

from libs.service.errors import (
    Cancelled,
    DeadlineExceeded,
    FornaxError,
    Internal,
    ResourceExhausted,
    Unavailable,
)
from libs.text.context import TextContext
from services.orchestrator import metrics
from services.orchestrator.admission import AdmissionConfig, AdmissionControl
from services.orchestrator.domain import (
    FinishReason,
    GenerationRequest,
    Microbatch,
    MicrobatchResult,
    RequestOutput,
    SchedulerConfig,
    RequestSliceResult,
    SequenceStatus,
    ServedModel,
)
from services.orchestrator.prompting import TokenLimits
from services.orchestrator.pipeline import Pipeline
from services.orchestrator.scheduler import RetiredRequest, Scheduler
from services.orchestrator.tracing import RequestSpans

_log = structlog.get_logger()
RELEASE_RETRY_S = 0.05
NO_KV_LIMIT_BYTES = 1 << 62


@dataclass(frozen=True)
class ServingConfig:
    scheduler: SchedulerConfig = SchedulerConfig()
    max_live_requests: int = 256
    # Per stage; None takes each stage's budget from the served model.
    stage_kv_budget_bytes: tuple[int, ...] | None = None
    default_max_tokens: int = 256
    default_deadline_budget_ns: int | None = None
    # 0 = only the context window bounds them.
    max_tokens_cap: int = 0
    max_prompt_tokens: int = 0

    @property
    def token_limits(self) -> TokenLimits:
        return TokenLimits(self.default_max_tokens, self.max_tokens_cap, self.max_prompt_tokens)


class RequestStream:
    """One request's events, bounded: a full stream stalls the request's decode."""

    def __init__(self, engine: ServingEngine, request_id: str, prompt_tokens: int,
                 capacity: int) -> None:
        self._engine = engine
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self._capacity = capacity
        self._events: collections.deque[RequestOutput] = collections.deque()
        self._ready = asyncio.Event()
        self._stalled = False
        self.finished = False

    def _push(self, output: RequestOutput) -> None:
        self._events.append(output)
        self._ready.set()
        if len(self._events) >= self._capacity and not output.finished:
            self._stalled = True
            self._engine._stall(self.request_id, True)

    async def next(self) -> RequestOutput:
        while not self._events:
            self._ready.clear()
            await self._ready.wait()
        output = self._events.popleft()
        if self._stalled and len(self._events) < self._capacity:
            self._stalled = False
            self._engine._stall(self.request_id, False)
        if output.finished:
            self.finished = True
        return output

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        return await self.next()

    def cancel(self) -> bool:
        return self._engine.cancel(self.request_id)

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(self, *exc) -> None:
        if not self.finished:
            self.cancel()  # the consumer went away, or failed, before the final event

    async def collect(self) -> Completion:
        """The whole generated text and the final event; raises the error a failed request ended with."""
        parts = []
        async for output in self:
            parts.append(output.text)
            if output.finished:
                error = terminal_error(output)
                if error is not None:
                    raise error
                return Completion("".join(parts), output)
        raise Internal("request stream ended without a final event")


@dataclass(frozen=True)
class Completion:
    text: str
    final: RequestOutput


class ServingEngine:
    def __init__(self, pipeline: Pipeline, served: ServedModel, text: TextContext,
                 config: ServingConfig = ServingConfig()) -> None:
        budgets = config.stage_kv_budget_bytes or tuple(
            NO_KV_LIMIT_BYTES if s.kv_budget_bytes is None else s.kv_budget_bytes
            for s in served.stages)
        admission = AdmissionControl(AdmissionConfig(config.max_live_requests, budgets), served.stages)
        self.pipeline = pipeline
        self.served = served
        self.text = text
        self.config = config
        self.admission = admission
        self.scheduler = Scheduler(config.scheduler, served.num_stages, text, admission)
        self._streams: dict[str, RequestStream] = {}
        self._tasks: set[asyncio.Task] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._deadlines: dict[str, int] = {}
        self._last_token_ns: dict[str, int] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self.retired: collections.deque[RetiredRequest] = collections.deque(maxlen=1024)
        self._spans = RequestSpans()
        self._closed = False

    # ----- public -----

    def submit(self, request: GenerationRequest) -> RequestStream:
        """Admits the request or raises at once (capacity, draining); never waits."""
        if self._closed:
            raise Unavailable("the serving engine is closed", reason="NOT_ADMITTING")
        if request.sampling.seed is None:
            # Each unseeded request gets its own random stream; a seeded one is reproducible.
            request = replace(request, sampling=replace(request.sampling,
                                                        seed=secrets.randbits(63)))
        if request.deadline_budget_ns is None and self.config.default_deadline_budget_ns:
            request = replace(request, deadline_budget_ns=self.config.default_deadline_budget_ns)
        now = time.monotonic_ns()
        _, traceparent = self._spans.begin(request.request_id)
        request = replace(request, traceparent=traceparent)
        try:
            with self._spans.admission(request.request_id):
                self.scheduler.admit(request, now)
        except FornaxError as exc:
            metrics.REJECTED.labels(exc.reason).inc()
            self._spans.rejected(request.request_id, exc.reason)
            raise
        metrics.ADMITTED.inc()
        self._spans.queued(request.request_id)
        self._last_token_ns[request.request_id] = -now  # negative: no token yet
        stream = RequestStream(self, request.request_id, len(request.prompt_token_ids),
                               self.config.scheduler.output_queue_capacity)
        self._streams[request.request_id] = stream
        if request.deadline_budget_ns is not None:
            self._deadlines[request.request_id] = now + request.deadline_budget_ns
        self._idle.clear()
        self._pump()
        return stream

    def cancel(self, request_id: str) -> bool:
        found = self.scheduler.cancel(request_id)
        if found:
            metrics.CANCELLED.inc()
        if found and self.scheduler.is_inflight(request_id):
            self._spawn(self._cancel_inflight(request_id))
        self._pump()
        return found

    def stop_admitting(self, reason: str) -> None:
        self.admission.close(reason)

    async def wait_idle(self) -> None:
        """Returns once every admitted request has retired (drain)."""
        await self._idle.wait()

    async def close(self, release_timeout_s: float | None = None) -> None:
        """Cancels what is live, waits for every release, then closes the pipeline.

        With a timeout, releases that cannot complete (a stage that is gone) are abandoned
        after it: the next plan generation fences those leases anyway.
        """
        self._closed = True
        self.stop_admitting("closing")
        for request_id in list(self._streams):
            self.scheduler.cancel(request_id)
        self._pump()
        try:
            await asyncio.wait_for(self.wait_idle(), release_timeout_s)
        except asyncio.TimeoutError:
            _log.warning("release_incomplete", live_requests=self.scheduler.live_requests)
            for task in list(self._tasks):
                task.cancel()
        if self._timer is not None:
            self._timer.cancel()
        await self.pipeline.close()

    @property
    def live_requests(self) -> int:
        return self.scheduler.live_requests

    # ----- loop -----

    def _stall(self, request_id: str, stalled: bool) -> None:
        self.scheduler.set_stalled(request_id, stalled)
        if not stalled:
            self._pump()

    def _pump(self) -> None:
        self._dispatch()  # first, so a reader's stall is known before scheduling
        for batch in self.scheduler.schedule(time.monotonic_ns()):
            metrics.MICROBATCH_ROWS.labels(batch.phase.value).observe(batch.row_count)
            for piece in batch.slices:
                self._spans.scheduled(piece.request_id)
            self._spawn(self._run_batch(batch))
        self._dispatch()
        metrics.LIVE_REQUESTS.set(self.scheduler.live_requests)
        metrics.INFLIGHT_MICROBATCHES.set(self.scheduler.inflight_microbatches)
        metrics.STALLED_REQUESTS.set(self.scheduler.stalled_requests)

    def _dispatch(self) -> None:
        for output in self.scheduler.take_outputs():
            self._observe(output)
            stream = self._streams.get(output.request_id)
            if stream is not None:
                stream._push(output)
                if output.finished:
                    del self._streams[output.request_id]
        for request_id in self.scheduler.take_releases():
            self._spawn(self._release(request_id))
        for retired in self.scheduler.take_retired():
            self.retired.append(retired)
            self._deadlines.pop(retired.request_id, None)
            self._last_token_ns.pop(retired.request_id, None)
            metrics.FINISHED.labels(retired.finish_reason.value).inc()
            self._spans.finish(retired.request_id, retired.finish_reason.value)
            _log.info("request_retired", request_id=retired.request_id,
                      finish_reason=retired.finish_reason.value,
                      released_stage_epochs=list(retired.released_stage_epochs))
        if self.scheduler.live_requests == 0:
            self._idle.set()
        self._arm_deadline_timer()

    def _observe(self, output: RequestOutput) -> None:
        """Token latency: TTFT from admission, then the gap between a request's tokens."""
        if not output.token_ids or output.request_id not in self._last_token_ns:
            return
        now, last = time.monotonic_ns(), self._last_token_ns[output.request_id]
        (metrics.TTFT if last < 0 else metrics.INTER_TOKEN).observe((now - abs(last)) / 1e9)
        self._last_token_ns[output.request_id] = now
        metrics.OUTPUT_TOKENS.inc(len(output.token_ids))

    def _arm_deadline_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # Only future deadlines: one already past is acted on at the next schedule, which
        # the request's in-flight result or release triggers anyway.
        now = time.monotonic_ns()
        upcoming = [d for d in self._deadlines.values() if d > now]
        if upcoming:
            delay_s = (min(upcoming) - now) / 1e9
            self._timer = asyncio.get_running_loop().call_later(delay_s + 1e-4, self._pump)

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_batch(self, batch: Microbatch) -> None:
        try:
            result = await self.pipeline.submit(batch)
        except Exception as exc:  # a failed microbatch fails its sequences, not the loop
            _log.exception("microbatch_failed", batch_id=batch.batch_id)
            result = MicrobatchResult(batch.batch_id, tuple(
                RequestSliceResult(s.request_id, SequenceStatus.FAILED, None, s.kv_epoch,
                               f"pipeline error: {type(exc).__name__}: {exc}")
                for s in batch.slices))
        self.scheduler.update_from_output(result)
        self._pump()

    async def _cancel_inflight(self, request_id: str) -> None:
        """Best effort: stages drop the rows early; the release that follows is what counts."""
        try:
            await self.pipeline.cancel(request_id)
        except Exception:
            _log.exception("cancel_failed", request_id=request_id)

    async def _release(self, request_id: str) -> None:
        attempt = 0
        while True:
            try:
                report = await self.pipeline.release(request_id)
                break
            except Exception:  # KV must be freed everywhere: keep trying until it is
                attempt += 1
                _log.exception("release_failed", request_id=request_id, attempt=attempt)
                await asyncio.sleep(RELEASE_RETRY_S * min(attempt, 20))
        self.scheduler.on_released(report)
        self._pump()


class RouteSlot:
    """The engine of the currently installed route, or None before one is installed."""

    def __init__(self, engine: ServingEngine | None = None) -> None:
        self.engine = engine


def terminal_error(output: RequestOutput) -> FornaxError | None:
    """The error a final event stands for; None when it ended with stop or length."""
    if output.finish_reason is FinishReason.DEADLINE:
        return DeadlineExceeded("the request's deadline budget ran out",
                                reason="DEADLINE_EXCEEDED")
    if output.finish_reason is FinishReason.CANCELLED:
        return Cancelled("the request was cancelled")
    if output.finish_reason is FinishReason.REJECTED:
        return ResourceExhausted(f"a stage refused the request: {output.error}")
    if output.finish_reason is FinishReason.ERROR:
        return Internal(f"generation failed: {output.error}", reason="GENERATION_FAILED")
    return None

