"""Prometheus metrics of the serving loop (served on the shared /metrics endpoint)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram

from libs.service.counter_mirror import CounterMirror
from services.orchestrator.engine.domain import StageStats

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

# Names shared with the Grafana dashboard in helm/fornax/dashboards.
ADMITTED = Counter("fornax_admissions_total", "Requests admitted")
REJECTED = Counter("fornax_admission_rejections_total", "Requests refused at admission", ["reason"])
CANCELLED = Counter("fornax_cancellations_total", "Requests cancelled by the client or a disconnect")
FINISHED = Counter("fornax_orchestrator_requests_finished_total",
                   "Requests retired, KV released on every stage", ["finish_reason"])
OUTPUT_TOKENS = Counter("fornax_generated_tokens_total", "Tokens generated")
TTFT = Histogram("fornax_ttft_seconds",
                 "Admission to first generated token", buckets=_LATENCY_BUCKETS)
INTER_TOKEN = Histogram("fornax_itl_seconds",
                        "Time between consecutive tokens of one request",
                        buckets=_LATENCY_BUCKETS)
MICROBATCH_ROWS = Histogram("fornax_orchestrator_microbatch_rows", "Rows per microbatch",
                            ["phase"], buckets=(1, 2, 4, 8, 16, 32, 64, 128, 512, 2048, 8192))
LIVE_REQUESTS = Gauge("fornax_orchestrator_live_requests", "Admitted requests not yet retired")
INFLIGHT_MICROBATCHES = Gauge("fornax_orchestrator_inflight_microbatches",
                              "Microbatches submitted to the pipeline and not yet answered")
KV_QUEUED_REQUESTS = Gauge("fornax_orchestrator_kv_queued_requests",
                           "Requests waiting in the queue for KV blocks on every stage (--kv-full queue)")
STALLED_REQUESTS = Gauge("fornax_orchestrator_stalled_requests",
                         "Requests whose reader is behind (decode paused)")
ROUTE_DEGRADED = Gauge("fornax_orchestrator_route_degraded",
                       "1 while the installed route has a dead, stopped or unloaded stage")
DEGRADATIONS = Counter("fornax_orchestrator_route_degradations_total",
                       "Times the installed route became degraded")
ROUTE_HANDOFFS = Counter("fornax_orchestrator_route_handoffs_total",
                         "Streams a degraded replica route handed to another route for replay")
ROUTES_REMOVED = Counter("fornax_orchestrator_routes_removed_total",
                         "Replica routes taken out of the serving set: a host drain (HOST_DRAINED) or a host "
                         "gone longer than the rejoin timeout (REJOIN_TIMEOUT)", ["reason"])
RELEASES_ABANDONED = Counter("fornax_orchestrator_releases_abandoned_total",
                             "Releases given up after their time budget (lease expiry frees the KV)")
IDLE_READER_CANCELLATIONS = Counter("fornax_orchestrator_idle_reader_cancellations_total",
                                    "Requests cancelled because their reader stopped reading")
RECOVERY_SECONDS = Histogram("fornax_orchestrator_route_recovery_seconds",
                             "From a route degrading to serving again (requests replayed)",
                             buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120))
ROUTE_UNCALIBRATED = Gauge("fornax_orchestrator_route_uncalibrated",
                           "1 while a stage's measured decode service time stays outside the installed "
                           "plan's prediction bound")
STAGE_UNCALIBRATED = Gauge("fornax_orchestrator_stage_uncalibrated",
                           "1 while this stage's measured decode service time stays outside its prediction bound",
                           ["stage"])
STAGE_DECODE_SERVICE = Gauge("fornax_orchestrator_stage_decode_service_seconds",
                             "Decode service seconds per microbatch: the plan's prediction (figure=predicted) "
                             "and the stage's rolling measurement (figure=measured, physical)",
                             ["stage", "figure"])
# Each stage's own running totals (GetHealth), re-exported per stage index.
STAGE_PREFIX_HIT_BLOCKS = Counter("fornax_orchestrator_stage_prefix_hit_blocks_total",
                                  "Prompt-prefix blocks the stage found resident at admission", ["stage"])
STAGE_PREFIX_MISSED_BLOCKS = Counter("fornax_orchestrator_stage_prefix_missed_blocks_total",
                                     "Prompt-prefix blocks the stage looked up and did not hold", ["stage"])
STAGE_KV_EVICTED_BLOCKS = Counter("fornax_orchestrator_stage_kv_evicted_blocks_total",
                                  "Cached prefix blocks the stage evicted to make room", ["stage"])
_STAGE_BLOCK_COUNTERS = ((CounterMirror(STAGE_PREFIX_HIT_BLOCKS), "prefix_hit_blocks"),
                         (CounterMirror(STAGE_PREFIX_MISSED_BLOCKS), "prefix_missed_blocks"),
                         (CounterMirror(STAGE_KV_EVICTED_BLOCKS), "kv_evicted_blocks"))


def publish_stage_blocks(stats: Iterable[StageStats]) -> None:
    """Brings the per-stage prefix and eviction counters up to what each stage reported (a
    stage that restarted counts from zero again, as a Prometheus counter reset)."""
    for stage in stats:
        for mirror, field in _STAGE_BLOCK_COUNTERS:
            mirror.observe((str(stage.index),), getattr(stage, field), stage.host)
