"""The async shell around the scheduler: drives a Pipeline and feeds per-request streams.

Everything here runs on one event loop, so the scheduler is never touched concurrently.
`_pump` is the only place that schedules: it runs after every state change (a new request,
a microbatch result, a release, a reader making room, a cancel) and on a timer when a
deadline is due. New requests and releases ask for it at the end of the loop turn, so a
burst of either costs one scheduling pass and a burst of prompts shares one prefill.
"""

from __future__ import annotations

import asyncio
import collections
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import structlog

from libs.service.errors import FornaxError, Internal, Unavailable
from libs.service.log_limit import LogLimiter
from libs.text.context import TextContext
from services.orchestrator.engine import metrics
from services.orchestrator.engine.admission import AdmissionConfig, AdmissionControl, KvFullPolicy
from services.orchestrator.engine.domain import (
    EngineSnapshot,
    GenerationRequest,
    Microbatch,
    RequestOutput,
    RequestSliceResult,
    SchedulerConfig,
    ServedModel,
    StageStats,
    TokenLimits,
    failed_result,
)
from services.orchestrator.engine.drift import RouteCalibration
from services.orchestrator.engine.pipeline import Pipeline
from services.orchestrator.engine.prefix_salt import PrefixPolicy

# Re-exported: the front ends take a request's stream and its ending from here.
from services.orchestrator.engine.request_stream import (  # noqa: F401
    Completion,
    RequestStream,
    terminal_error,
)
from services.orchestrator.engine.route_choice import RouteLoad
from services.orchestrator.engine.route_events import (
    BatchLostRoute,
    CalibrationObserved,
    EngineClosing,
    EngineServing,
    NewPipeline,
    RequestsSuspended,
    RouteEvents,
    RouteLost,
    RouteRecovered,
)
from services.orchestrator.engine.scheduler import RetiredRequest, Scheduler, SuspendedRequest
from services.orchestrator.engine.tracing import RequestSpans
from services.orchestrator.engine.unavailable import ROUTE_UNAVAILABLE, route_unavailable

_log = structlog.get_logger()
# The engine's one source of time: monotonic nanoseconds. Every deadline, stall, release
# budget and latency the engine reads goes through it; asyncio's own sleeps and timers
# still run on the event loop's real clock.
Clock = Callable[[], int]
RELEASE_RETRY_S = 0.05
NO_KV_LIMIT_BYTES = 1 << 62
_LOGS = LogLimiter()


@dataclass(frozen=True)
class ServingConfig:
    scheduler: SchedulerConfig = SchedulerConfig()
    max_live_requests: int = 256
    # Per stage; None takes each stage's budget from the served model.
    stage_kv_budget_bytes: tuple[int, ...] | None = None
    default_max_tokens: int = 256
    # Deadline budget of a request that brings none; None: no deadline.
    default_deadline_budget_ns: int | None = 600 * 10**9
    # Release retries stop after this long and return the admission slot anyway; stages
    # free the lease's KV when it expires.
    release_budget_s: float = 10.0
    # A request whose reader has taken nothing for this long (its stream full) is cancelled,
    # so a client that stops reading frees its slot. None: wait forever.
    stall_timeout_s: float | None = 30.0
    # When the route loses a stage, greedy requests wait this long for the route to be
    # reloaded and are then replayed; 0 ends them at once with ROUTE_UNAVAILABLE.
    recovery_timeout_s: float = 30.0
    # 0 = only the context window bounds them.
    max_tokens_cap: int = 0
    max_prompt_tokens: int = 0
    # Who shares prompt-prefix KV blocks (services.orchestrator.engine.prefix_salt).
    prefix_cache: PrefixPolicy = PrefixPolicy.TENANT
    # A request whose KV blocks are not free now: queue (wait within its deadline) or reject (429).
    kv_full: KvFullPolicy = KvFullPolicy.QUEUE

    @property
    def token_limits(self) -> TokenLimits:
        return TokenLimits(self.default_max_tokens, self.max_tokens_cap, self.max_prompt_tokens)


class ServingEngine:
    def __init__(self, pipeline: Pipeline, served: ServedModel, text: TextContext,
                 config: ServingConfig = ServingConfig(), clock: Clock = time.monotonic_ns,
                 events: RouteEvents | None = None) -> None:
        budgets = config.stage_kv_budget_bytes or tuple(
            NO_KV_LIMIT_BYTES if s.kv_budget_bytes is None else s.kv_budget_bytes
            for s in served.stages)
        admission = AdmissionControl(AdmissionConfig(config.max_live_requests, budgets, config.kv_full),
                                     served.stages)
        self.pipeline = pipeline
        self.served = served
        self.text = text
        self.config = config
        self.clock = clock
        self.admission = admission
        self.scheduler = Scheduler(config.scheduler, served.num_stages, text, admission,
                                   replay=config.recovery_timeout_s > 0)
        self._recovery_timer: asyncio.TimerHandle | None = None
        self._degraded_at_ns: int | None = None
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
        self._stalled_since_ns: dict[str, int] = {}
        self._pump_pending = False
        # Why the route cannot serve (a stage is down); None while it can.
        self.degraded_reason: str | None = None
        # What this engine and its route tell each other (`route_events.py`).
        self.events = events if events is not None else RouteEvents()
        self._calibration: RouteCalibration | None = None
        self.events.subscribe(RouteLost, lambda e: self.degrade(e.reason))
        self.events.subscribe(RouteRecovered, lambda e: self.recover())
        self.events.subscribe(NewPipeline, lambda e: self.recover(e.pipeline))
        self.events.subscribe(CalibrationObserved, self._observe_calibration)

    # ----- public -----

    def submit(self, request: GenerationRequest) -> RequestStream:
        """Admits the request or raises at once (capacity, draining); never waits. A request
        queued for KV blocks (policy queue) gets its stream now; its first token waits."""
        if self._closed:
            raise Unavailable("the serving engine is closed", reason="NOT_ADMITTING")
        if self.degraded_reason is not None:
            metrics.REJECTED.labels(ROUTE_UNAVAILABLE).inc()
            raise route_unavailable(self.degraded_reason)
        if request.sampling.seed is None:
            # Each unseeded request gets its own random stream; a seeded one is reproducible.
            request = replace(request, sampling=replace(request.sampling,
                                                        seed=secrets.randbits(63)))
        if request.deadline_budget_ns is None and self.config.default_deadline_budget_ns:
            request = replace(request, deadline_budget_ns=self.config.default_deadline_budget_ns)
        now = self.clock()
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
        # Requests that arrive in the same loop turn (a burst) are scheduled together, so a
        # burst's prompts share one prefill instead of the first one running alone.
        self._pump_soon()
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

    def degrade(self, reason: str) -> None:
        """The route lost a stage: refuse new requests (503) and schedule nothing until it
        recovers; requests hit by the failure are suspended for replay or ended."""
        if self.degraded_reason is None:
            _log.warning("route_degraded", reason=reason)
            metrics.DEGRADATIONS.inc()
            self._degraded_at_ns = self.clock()
            if self.scheduler.replay:
                self._recovery_timer = asyncio.get_running_loop().call_later(
                    self.config.recovery_timeout_s, self._give_up_recovery)
        self.degraded_reason = reason
        metrics.ROUTE_DEGRADED.set(1)
        if self.scheduler.replay:  # without replay, what is queued fails fast instead
            self.scheduler.pause()
            self.scheduler.suspend_live(route_unavailable(reason).message)
            self._pump()

    def recover(self, pipeline: Pipeline | None = None) -> None:
        """The route serves again; with a new `pipeline` (the stages were reloaded under a
        new generation), every suspended request is replayed on it."""
        if self._recovery_timer is not None:
            self._recovery_timer.cancel()
            self._recovery_timer = None
        replayed = 0
        if pipeline is not None:
            self.pipeline = pipeline
            replayed = self.scheduler.replay_suspended()
        if self.degraded_reason is not None:
            now = self.clock()
            took = (now - (now if self._degraded_at_ns is None else self._degraded_at_ns)) / 1e9
            metrics.RECOVERY_SECONDS.observe(took)
            _log.info("route_recovered", reason=self.degraded_reason, replayed=replayed,
                      recovery_s=round(took, 3))
        self.degraded_reason, self._degraded_at_ns = None, None
        self.scheduler.resume()
        metrics.ROUTE_DEGRADED.set(0)
        self._pump()
        self.events.notify(EngineServing())

    def _give_up_recovery(self) -> None:
        self._recovery_timer = None
        ended = self.scheduler.end_suspended(route_unavailable(
            self.degraded_reason or "the route did not recover in time").message)
        _log.warning("recovery_timed_out", ended=ended)
        self._pump()

    async def suspend_remaining(self, reason: str, settle_s: float = 10.0) -> tuple[int, int]:
        """The route leaves (its host drains): nothing more is scheduled, the microbatches in
        flight come back (within `settle_s`), then every greedy stream is suspended for replay
        on another route (`on_suspended` hands it over) and any other ends with `reason`.
        Returns (suspended, ended)."""
        self.scheduler.pause()
        loop = asyncio.get_running_loop()
        settle_by = loop.time() + settle_s
        while self.scheduler.inflight_microbatches and loop.time() < settle_by:
            await asyncio.sleep(0.005)
        before = self.scheduler.suspended_requests
        ended = self.scheduler.suspend_live(route_unavailable(reason).message)
        suspended = self.scheduler.suspended_requests - before
        self._pump()
        return suspended, ended

    def end_suspended(self, reason: str) -> int:
        """Streams suspended here that no route took: they end with `reason`."""
        ended = self.scheduler.end_suspended(route_unavailable(reason).message)
        self._pump()
        return ended

    def stream_ids(self) -> tuple[str, ...]:
        """The requests whose clients this route streams to."""
        return tuple(self._streams)

    def last_token_ns(self, request_id: str) -> int | None:
        """When the request's latest token reached its stream (engine clock); None before its
        first token, or once it is not streamed here."""
        last = self._last_token_ns.get(request_id)
        return last if last is not None and last >= 0 else None

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
        except TimeoutError:
            _log.warning("release_incomplete", live_requests=self.scheduler.live_requests)
            for task in list(self._tasks):
                task.cancel()
        if self._timer is not None:
            self._timer.cancel()
        await self.events.publish(EngineClosing())
        await self.pipeline.close()

    @property
    def live_requests(self) -> int:
        return self.scheduler.live_requests

    @property
    def admitting(self) -> bool:
        """Takes new requests: not degraded, not draining, not closed."""
        return not self._closed and self.degraded_reason is None and self.admission.closed_reason is None

    def load(self, index: int) -> RouteLoad:
        """This route's load as `route_choice` weighs it, as replica route `index`."""
        return RouteLoad(index, self.admitting, self.scheduler.queued_tokens, self.admission.free_tokens())

    def suspended(self) -> list[SuspendedRequest]:
        return self.scheduler.suspended()

    def hand_off(self, moved: SuspendedRequest, target: ServingEngine) -> None:
        """Moves a suspended request, with its client's stream, deadline and backpressure, to
        `target`, which replays it (prompt plus what it emitted). Raises, with nothing
        moved, when `target` refuses it."""
        request_id = moved.request_id
        if moved not in self.scheduler.suspended():
            raise Internal(f"request {request_id} is not suspended on this route", reason="HANDOFF")
        target.scheduler.adopt(moved)
        self.scheduler.forget(request_id)
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream._rebind(target)
            target._streams[request_id] = stream
        for mine, theirs in ((self._deadlines, target._deadlines),
                             (self._last_token_ns, target._last_token_ns),
                             (self._stalled_since_ns, target._stalled_since_ns)):
            if request_id in mine:
                theirs[request_id] = mine.pop(request_id)
        self._spans.move(request_id, target._spans)
        target._idle.clear()
        target._pump_soon()
        if self.scheduler.live_requests == 0:
            self._idle.set()

    def snapshot(self) -> EngineSnapshot:
        return EngineSnapshot(self.scheduler.live_requests, self.degraded_reason, self.admission.closed_reason)

    def route_calibration(self) -> RouteCalibration | None:
        """The route's calibration as its supervisor last observed it; None when nothing watches it."""
        return self._calibration

    def _observe_calibration(self, event: CalibrationObserved) -> None:
        self._calibration = event.calibration

    async def stage_stats(self) -> list[StageStats]:
        return await self.pipeline.stage_stats()

    def set_stalled(self, request_id: str, stalled: bool) -> None:
        """A request's reader fell behind (its stream is full) or caught up: pause or resume its decode."""
        self.scheduler.set_stalled(request_id, stalled)
        if stalled:
            self._stalled_since_ns[request_id] = self.clock()
        else:
            self._stalled_since_ns.pop(request_id, None)
            self._pump()

    # ----- loop -----

    def _cancel_idle_readers(self, now_ns: int) -> None:
        if self.config.stall_timeout_s is None:
            return
        limit_ns = int(self.config.stall_timeout_s * 1e9)
        for request_id, since in list(self._stalled_since_ns.items()):
            if now_ns - since >= limit_ns:
                del self._stalled_since_ns[request_id]
                _log.info("reader_idle_cancelled", request_id=request_id)
                metrics.IDLE_READER_CANCELLATIONS.inc()
                self.cancel(request_id)

    def _pump_soon(self) -> None:
        """One `_pump` at the end of this loop turn, however many state changes ask for it."""
        if not self._pump_pending:
            self._pump_pending = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        self._pump_pending = False
        self._cancel_idle_readers(self.clock())
        self._dispatch()  # first, so a reader's stall is known before scheduling
        for batch in self.scheduler.schedule(self.clock()):
            metrics.MICROBATCH_ROWS.labels(batch.phase.value).observe(batch.row_count)
            for piece in batch.slices:
                self._spans.scheduled(piece.request_id)
            self._spawn(self._run_batch(batch))
        self._dispatch()
        if self.scheduler.suspended_requests:
            self.events.notify(RequestsSuspended(self.scheduler.suspended_requests))
        metrics.LIVE_REQUESTS.set(self.scheduler.live_requests)
        metrics.INFLIGHT_MICROBATCHES.set(self.scheduler.inflight_microbatches)
        metrics.STALLED_REQUESTS.set(self.scheduler.stalled_requests)
        metrics.KV_QUEUED_REQUESTS.set(self.scheduler.queued_requests)

    def _dispatch(self) -> None:
        for output in self.scheduler.take_outputs():
            self._observe(output)
            stream = self._streams.get(output.request_id)
            if stream is not None:
                stream._push(output)
                if output.finished:
                    del self._streams[output.request_id]
        for request_id in self.scheduler.take_releases():
            self._spawn(self._release(request_id, self.scheduler.publish_tokens(request_id)))
        for retired in self.scheduler.take_retired():
            self.retired.append(retired)
            self._deadlines.pop(retired.request_id, None)
            self._last_token_ns.pop(retired.request_id, None)
            self._stalled_since_ns.pop(retired.request_id, None)
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
        now, last = self.clock(), self._last_token_ns[output.request_id]
        (metrics.TTFT if last < 0 else metrics.INTER_TOKEN).observe((now - abs(last)) / 1e9)
        self._last_token_ns[output.request_id] = now
        metrics.OUTPUT_TOKENS.inc(len(output.token_ids))

    def _arm_deadline_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # Only future deadlines: one already past is acted on at the next schedule, which
        # the request's in-flight result or release triggers anyway.
        now = self.clock()
        upcoming = [d for d in self._deadlines.values() if d > now]
        if self.config.stall_timeout_s is not None:
            upcoming += [since + int(self.config.stall_timeout_s * 1e9)
                         for since in self._stalled_since_ns.values()]
        if upcoming:
            delay_s = (min(upcoming) - now) / 1e9
            self._timer = asyncio.get_running_loop().call_later(delay_s + 1e-4, self._pump)

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_batch(self, batch: Microbatch) -> None:
        try:
            results = await self.pipeline.submit(batch)
        except Exception as exc:  # a failed microbatch fails its sequences, not the loop
            results = await self._failed_batch(batch, exc)
        else:
            lost = next((s for s in results if s.route_lost), None)
            if lost is not None:
                await self.events.publish(BatchLostRoute(lost.error))
        self.scheduler.update_from_output(batch.batch_id, results)
        self._pump()

    async def _failed_batch(self, batch: Microbatch, exc: Exception) -> tuple[RequestSliceResult, ...]:
        """Every sequence of the batch fails with a clean message (no peer addresses)."""
        route_lost = isinstance(exc, FornaxError) and exc.reason == ROUTE_UNAVAILABLE
        if isinstance(exc, FornaxError) and route_lost:
            error = exc.message
            if _LOGS.allow("microbatch_route_unavailable") is not None:
                _log.warning("microbatch_failed", batch_id=batch.batch_id, error=exc.message)
            await self.events.publish(BatchLostRoute(exc.message))
        else:
            error = f"the pipeline failed ({type(exc).__name__})"
            if _LOGS.allow("microbatch_failed") is not None:
                _log.error("microbatch_failed", batch_id=batch.batch_id, exc_info=exc)
        return tuple(failed_result(s, error, route_lost=route_lost) for s in batch.slices)

    async def _cancel_inflight(self, request_id: str) -> None:
        """Best effort: stages drop the rows early; the release that follows is what counts."""
        try:
            await self.pipeline.cancel(request_id)
        except Exception as exc:
            if _LOGS.allow("cancel_failed") is not None:
                _log.warning("cancel_failed", request_id=request_id, error=_brief(exc))

    async def _release(self, request_id: str, publish_token_ids: tuple[int, ...] = ()) -> None:
        """Retries within `release_budget_s`, then gives up and frees the slot regardless."""
        give_up_at_ns = self.clock() + int(self.config.release_budget_s * 1e9)
        attempt, report = 0, None
        while report is None:
            try:
                report = await self.pipeline.release(request_id, publish_token_ids)
            except Exception as exc:
                attempt += 1
                if self.clock() >= give_up_at_ns or self._closed:
                    break
                suppressed = _LOGS.allow("release_failed")
                if suppressed is not None:
                    _log.warning("release_failed", request_id=request_id, attempt=attempt,
                                 error=_brief(exc), suppressed=suppressed)
                await asyncio.sleep(RELEASE_RETRY_S * min(attempt, 20))
        if report is None:
            metrics.RELEASES_ABANDONED.inc()
            if _LOGS.allow("release_abandoned") is not None:
                _log.warning("release_abandoned", request_id=request_id, attempts=attempt)
            self.scheduler.abandon_release(request_id)
        else:
            self.scheduler.on_released(report)
        self._pump_soon()  # releases finish in bursts (a batch's requests end together)


def build_engine(config: ServingConfig, pipeline: Pipeline, text: TextContext,
                 clock: Clock = time.monotonic_ns) -> ServingEngine:
    """The one place a serving engine is assembled: over `pipeline`, serving its `served` model.

    The service passes `services.orchestrator.config.serving_config` of its settings; benches
    pass `serving_defaults()` from there (or a replacement of it) to run what the service runs.
    `clock` (monotonic nanoseconds) is the engine's only time source; tests pass a fake one.
    """
    return ServingEngine(pipeline, pipeline.served, text, config, clock)


def _brief(exc: BaseException) -> str:
    """One line about a failure, without a peer's address or a traceback."""
    if isinstance(exc, FornaxError):
        return f"{exc.reason}: {exc.message}"
    return type(exc).__name__
