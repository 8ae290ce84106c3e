"""`fornax bench placement --fleet FILE`: the calibrated placement against an even layer split.

One run, on a netns fleet of two unlike hosts (namespaces, cgroup quotas, shaped links):
1. the calibrated split is the planner's profile-based plan (`plan_from_profiles`) from the
   stage and link profile records `fornax profile` stored under `--state-dir` (physical);
   the benchmark keeps no cost estimator of its own. Its target decode context is the load's
   mean past per decode row (`load_mean_past`: prompt tokens plus half the output tokens), the
   context this load's decode steps run at;
2. the same load (same prompts, concurrency and length) is served under the even split and under
   the calibrated split, interleaved `repeats` times, best tokens/s of each kept; each run is
   one untimed pass of the load on the freshly loaded route, then `waves` timed passes;
3. each served split's stage times (GetHealth decode service per microbatch) are compared with
   the planner's prediction for that split at the rows per microbatch and the mean past per row
   it actually ran (the workers' counters), and the
   report says what explains the ratio: layers per host, whether the load kept every stage busy,
   and where the embeddings and head sit.
With `every_split` the same load is also served under every other placement of the layers on the
two hosts (both host orders, every cut), interleaved with the two above, so the report says which
placement this fleet serves fastest and how far the even split is from it (`every_split`).
Routes are loaded straight from the checkpoint with explicit layer ranges (the direct load path),
and served by an in-process serving core in the root namespace.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from apps.bench.placement_core import (
    PLACEMENT_REPEATS,
    PLACEMENT_WAVES,
    NotPhysical,
    Split,
    bottleneck_prediction_error,
    calibrated_split,
    even_split,
    every_split,
    layers_per_host,
    saturation,
    split_label,
    tok_s_ratio,
)
from apps.bench.serve import RunFigures, _drive, prompts
from apps.bench.stored_profiles import NoStoredProfiles, stored_profile_records
from apps.fleet.isolated import start_isolated_fleet
from apps.fleet.launcher import FleetOptions
from apps.fleet.netns import tear_down
from apps.fleet.spec import FleetSpec
from apps.qualify.gate import PHASES, PredictedStage
from apps.qualify.predict_at import planner_at, predicted_at_rows
from fornax.stage_worker.v1 import stage_worker_pb2 as sw_pb
from fornax.stage_worker.v1 import stage_worker_pb2_grpc as sw_grpc
from libs.common.kinds import DType
from libs.model.config import load_config
from libs.service.channels import open_aio_channel
from libs.service.errors import FornaxError
from libs.text.context import TextContext
from services.orchestrator.config import serving_defaults
from services.orchestrator.engine.model_card import served_model
from services.orchestrator.engine.serving import build_engine
from services.orchestrator.route.direct_load import checkpoint_stage_loads
from services.orchestrator.route.route_pipeline import RoutePipeline
from services.orchestrator.route.stage_chain import Route, load_route
from services.planner import domain as d
from services.planner.inventory import Target
from services.planner.inventory_facts import inventory_from, node_name
from services.planner.model import describe_checkpoint
from services.planner.planner import plan_from_profiles
from services.planner.profiles import ProfileRecordInput, book_from_records


class PlacementBenchError(RuntimeError):
    """The fleet or the checkpoint cannot give this benchmark's figures."""


@dataclass(frozen=True)
class PlacementBenchOptions:
    fleet_file: str
    spec: FleetSpec
    checkpoint: str
    prompt_tokens: int = 16
    max_tokens: int = 24
    concurrency: int = 8
    repeats: int = PLACEMENT_REPEATS
    waves: int = PLACEMENT_WAVES  # timed passes of the whole load per run, after one untimed pass
    load_timeout_s: float = 3600.0
    profiles_state_dir: str = ".fornax"  # where `fornax profile` stored the fleet's profile records
    every_split: bool = False  # also serve every other placement of the layers on the two hosts


def merged_runs(runs: list[RunFigures]) -> RunFigures:
    """Passes of one load served back to back, as one run: their tokens over their summed wall time."""
    return RunFigures(sum(r.output_tokens for r in runs), sum(r.wall_s for r in runs),
                      [t for r in runs for t in r.ttft_s], [g for r in runs for g in r.itl_s],
                      tuple(s for r in runs for s in r.streams))


@dataclass(frozen=True)
class Served:
    """One split served once: physical figures."""

    split: Split
    figures: RunFigures
    stage_decode_s: list[float]  # mean decode service per microbatch, per stage
    rows_per_microbatch: list[float]
    past_per_row: list[float]  # mean tokens of past per decode row, per stage
    timing: list[str]  # the clock each stage timed its service on ("wall", or "sustained" under a quota)


async def _service_times(workers: list[str]) -> list[sw_pb.ServiceTimes]:
    async def one(address: str) -> sw_pb.ServiceTimes:
        async with open_aio_channel(address) as channel:
            reply = await sw_grpc.StageWorkerServiceStub(channel).GetHealth(sw_pb.GetHealthRequest(), timeout=30)
        return reply.service_times

    return list(await asyncio.gather(*(one(a) for a in workers)))


async def _capabilities(workers: list[str]) -> list[sw_pb.GetCapabilitiesResponse]:
    async def one(address: str) -> sw_pb.GetCapabilitiesResponse:
        async with open_aio_channel(address) as channel:
            return await sw_grpc.StageWorkerServiceStub(channel).GetCapabilities(
                sw_pb.GetCapabilitiesRequest(), timeout=30)

    return list(await asyncio.gather(*(one(a) for a in workers)))


class _Bench:
    def __init__(self, options: PlacementBenchOptions, workers: list[str]) -> None:
        self.options = options
        self.workers = workers
        self.backends = [h.backend.value for h in options.spec.hosts if h.stage_worker]
        self.config = load_config(options.checkpoint)
        self.text = TextContext.from_checkpoint(options.checkpoint)
        # Every pass its own prompts (the same ones for every split): a repeated prompt would be
        # served from the prefix cache, and a run would time decode without its prefill.
        self.warm_batch = prompts(self.config.vocab_size, options.concurrency, options.prompt_tokens, seed=4)
        self.batches = [prompts(self.config.vocab_size, options.concurrency, options.prompt_tokens, seed=5 + k)
                        for k in range(options.waves)]

    async def serve(self, split: Split) -> Served:
        workers = [self.workers[w] for w in split.workers]
        ranges = list(split.ranges)
        loads = checkpoint_stage_loads(workers, self.options.checkpoint, ranges,
                                       backends=[self.backends[w] for w in split.workers])
        plan = await load_route(loads, load_timeout_s=self.options.load_timeout_s)
        route = Route(plan)
        await route.open()
        served = served_model(self.config, ranges, "bench")
        engine = build_engine(replace(serving_defaults(), max_live_requests=self.options.concurrency * 2),
                              RoutePipeline(route, served), self.text)
        try:
            await _drive(engine, self.warm_batch, self.options.max_tokens)  # warm: a load like it, untimed
            before = await _service_times(workers)
            figures = merged_runs([await _drive(engine, batch, self.options.max_tokens) for batch in self.batches])
            after = await _service_times(workers)
        finally:
            await engine.close()
        batches = [a.decode_microbatches - b.decode_microbatches for a, b in zip(after, before, strict=True)]
        if min(batches) <= 0:
            raise PlacementBenchError(f"a stage ran no decode microbatch under {ranges}")
        stage_s = [(a.decode_service_ns - b.decode_service_ns) / n / 1e9
                   for a, b, n in zip(after, before, batches, strict=True)]
        rows = [(a.decode_rows - b.decode_rows) / n for a, b, n in zip(after, before, batches, strict=True)]
        past = [(a.decode_past_tokens - b.decode_past_tokens) / max(a.decode_rows - b.decode_rows, 1)
                for a, b in zip(after, before, strict=True)]
        return Served(split, figures, stage_s, rows, past, [a.timing or "wall" for a in after])


def load_mean_past(prompt_tokens: int, max_tokens: int) -> int:
    """Mean tokens of past per decode row of a load whose every sequence prefills `prompt_tokens`
    and decodes `max_tokens - 1` rows (output token n >= 1 comes from a row at past prompt + n - 1)."""
    rows = max(max_tokens - 1, 1)
    return round(prompt_tokens + (rows - 1) / 2)


async def _plan(options: PlacementBenchOptions, records: list[ProfileRecordInput], workers: list[str],
                hosts: list[str]):
    caps = await _capabilities(workers)
    inventory = inventory_from(caps, tuple(hosts))
    model = describe_checkpoint(options.checkpoint)
    target = Target(concurrency=options.concurrency, min_stages=len(workers), max_stages=len(workers),
                    boundary_dtype=DType.FP32, prefill_tokens=options.prompt_tokens,
                    decode_context_tokens=load_mean_past(options.prompt_tokens, options.max_tokens))
    book = book_from_records(records)
    now = time.time_ns()
    try:
        result = plan_from_profiles(model, inventory, target, book, now)
    except FornaxError as exc:
        raise PlacementBenchError(f"the planner refused: {exc}") from exc
    if not result.feasible or result.plan is None:
        raise PlacementBenchError(f"the planner found no placement: {result.infeasibility_reason} "
                                  f"{result.infeasibility}")
    names = tuple(node_name(i) for i in range(len(workers)))
    try:
        split = calibrated_split(result.plan, names, hosts)
    except NotPhysical as exc:
        raise PlacementBenchError(str(exc)) from exc
    return result.plan, split, model, inventory, book, now, caps


def _predicted(split: Split, served: Served, model, inventory, book, now) -> list[PredictedStage]:
    """The planner's terms for this served split, at each stage's measured rows per microbatch and
    the served mean past per row (every stage runs the same rows, so their pasts agree)."""
    placement = [(node_name(w), a, b) for w, (a, b) in zip(split.workers, split.ranges, strict=True)]
    past = round(max(served.past_per_row, default=0.0))
    at = planner_at(model, inventory, book, placement, now, past)
    blank = [PredictedStage(i, h, "", a, b, dict.fromkeys(PHASES, 0.0))
             for i, (h, (a, b)) in enumerate(zip(split.hosts, split.ranges, strict=True))]
    return predicted_at_rows(blank, served.rows_per_microbatch, at, past=past)


async def _run(options: PlacementBenchOptions, records: list[ProfileRecordInput], workers: list[str], log) -> dict:
    hosts = [h.name for h in options.spec.hosts if h.stage_worker]
    plan, calibrated, model, inventory, book, now, caps = await _plan(options, records, workers, hosts)
    bench = _Bench(options, workers)
    even = even_split(bench.config.num_hidden_layers, hosts)
    log(f"calibrated split (planner, from profiles) {list(zip(calibrated.hosts, calibrated.ranges, strict=True))}; "
        f"even {list(zip(even.hosts, even.ranges, strict=True))}")
    named = [("even", even), ("calibrated", calibrated)]
    if options.every_split:
        named += [(split_label(s), s) for s in every_split(bench.config.num_hidden_layers, hosts)]
    best: dict[str, Served] = {}
    runs: dict[str, list[float]] = {}
    for _ in range(options.repeats):
        for name, split in named:
            served = await bench.serve(split)
            log(f"{name}: {_tok_s(served):.1f} tok/s (physical)")
            runs.setdefault(name, []).append(_tok_s(served))
            kept = best.get(name)
            if kept is None or _tok_s(served) > _tok_s(kept):
                best[name] = served
    predictions = {name: _predicted(s.split, s, model, inventory, book, now) for name, s in best.items()}
    report = _report(options, plan, best, predictions, caps)
    if options.every_split:
        report["every_split"] = _every_split_view(named[2:], best, runs, predictions, even, calibrated)
        report["figure_classes"]["every_split"] = (
            "physical tokens/s of every placement under the same load, interleaved (best and every run); "
            "predicted_bottleneck_s: the planner's prediction at the rows per microbatch each ran")
    return report


def _every_split_view(named: list[tuple[str, Split]], best: dict[str, Served], runs: dict[str, list[float]],
                      predictions: dict[str, list[PredictedStage]], even: Split, calibrated: Split) -> list[dict]:
    even_tok_s = _tok_s(best["even"])
    return [{"placement": name, "output_tokens_per_s": _tok_s(best[name]), "runs_tok_s": runs[name],
             "vs_even_tok_s": tok_s_ratio(_tok_s(best[name]), even_tok_s),
             "measured_bottleneck_s": max(best[name].stage_decode_s),
             "measured_stage_s": best[name].stage_decode_s,
             "rows_per_microbatch": best[name].rows_per_microbatch,
             "predicted_bottleneck_s": max(_service(p) for p in predictions[name]),
             "is_even": split == even, "is_calibrated": split == calibrated}
            for name, split in named]


def every_split_lines(report: dict) -> list[str]:
    """One line per placement of `every_split` (none without it)."""
    lines = []
    for row in report.get("every_split", []):
        mark = ("even " if row["is_even"] else "") + ("calibrated" if row["is_calibrated"] else "")
        runs = " ".join(f"{x:.0f}" for x in row["runs_tok_s"])
        lines.append(f"  {row['placement']:<26} physical {row['output_tokens_per_s']:7.1f} tok/s (runs {runs}) "
                     f"{row['vs_even_tok_s']:.2f}x even; bottleneck measured "
                     f"{row['measured_bottleneck_s'] * 1e3:.2f} ms, predicted "
                     f"{row['predicted_bottleneck_s'] * 1e3:.2f} ms (prediction) {mark}")
    return lines


def _tok_s(served: Served) -> float:
    return served.figures.output_tokens / served.figures.wall_s


def _service(p: PredictedStage) -> float:
    """What the stage's GetHealth decode service covers: unpack + compute + pack."""
    return p.seconds["compute"] + p.seconds["pack"] + p.seconds["unpack"]


def _split_view(served: Served, predicted: list[PredictedStage], concurrency: int) -> dict:
    split = served.split
    first, last = split.hosts[0], split.hosts[-1]
    return {
        "layer_ranges": [list(r) for r in split.ranges],
        "hosts": list(split.hosts),
        "layers_per_host": layers_per_host(split),
        "embeddings_on": first, "head_on": last,
        "output_tokens_per_s": _tok_s(served),
        "serving": served.figures.summary(),
        "stages": [{"host": host, "layer_start": a, "layer_end_exclusive": b,
                    "measured_decode_service_s": measured, "measured_timing": timing,
                    "predicted_decode_service_s": _service(p),
                    "predicted_terms_s": p.seconds, "predicted_at_rows": p.rows,
                    "predicted_at_past_tokens": p.past,
                    "measured_rows_per_microbatch": rows, "measured_past_per_row": past}
                   for host, (a, b), measured, p, rows, past, timing in zip(
                       split.hosts, split.ranges, served.stage_decode_s, predicted, served.rows_per_microbatch,
                       served.past_per_row, served.timing, strict=True)],
        "measured_bottleneck_s": max(served.stage_decode_s),
        "predicted_bottleneck_s": max(_service(p) for p in predicted),
        "bottleneck_prediction_error": bottleneck_prediction_error([_service(p) for p in predicted],
                                                                   served.stage_decode_s),
        "load": saturation(concurrency, served.rows_per_microbatch, len(split.hosts)),
    }


def _report(options: PlacementBenchOptions, plan: d.Plan, best: dict[str, Served],
            predictions: dict[str, list[PredictedStage]], caps: list[sw_pb.GetCapabilitiesResponse]) -> dict:
    hosts = [h.name for h in options.spec.hosts if h.stage_worker]
    calibrated, even = best["calibrated"], best["even"]
    views = {name: _split_view(best[name], predictions[name], options.concurrency) for name in ("calibrated", "even")}
    return {
        "calibrated_vs_even_tok_s": tok_s_ratio(_tok_s(calibrated), _tok_s(even)),
        "bottleneck_prediction_error": views["calibrated"]["bottleneck_prediction_error"],
        # Equal splits: the ratio then only shows this host's run-to-run noise, not placement.
        "calibrated_equals_even": (calibrated.split.ranges, calibrated.split.hosts) == (even.split.ranges,
                                                                                        even.split.hosts),
        "calibrated": views["calibrated"],
        "even": views["even"],
        "plan": {"plan_id": plan.plan_id, "route_key": plan.route_key, "evidence_record_ids": list(plan.evidence_ids),
                 "target_rows_per_microbatch": next((p.value for p in plan.predictions
                                                     if p.name == "decode_microbatch_rows"), None),
                 "target_decode_context_tokens": next((p.value for p in plan.predictions
                                                       if p.name == "decode_context_tokens"), None),
                 "target_decode_context_basis": "the bench load's mean past per decode row: prompt tokens plus "
                                                "half the output tokens (contract of this load)",
                 "stages": [{"host": s.host, "layer_start": s.layer_start, "layer_end_exclusive": s.layer_end,
                             "terms": [{"term": t.term, "value": t.value, "unit": t.unit, "class": t.label,
                                        "record_ids": list(t.record_ids)} for t in s.terms]}
                            for s in plan.stages]},
        "figure_classes": {
            "calibrated_vs_even_tok_s": "physical: ratio of tokens/s measured in this run, same load",
            "bottleneck_prediction_error": "physical measurement against a prediction: the calibrated split's "
                                           "measured bottleneck stage time vs the planner's prediction for it at "
                                           "the rows per microbatch and the mean past per row it ran",
            "plan": "the planner's profile-based plan: predictions computed from the physical profile records named",
            "predicted_*": "predictions of the planner's cost model from the stored profile records",
            "measured_*, serving, output_tokens_per_s": "physical measurements on this host",
        },
        "setup": {"prompt_tokens": options.prompt_tokens, "max_tokens": options.max_tokens,
                  "concurrency": options.concurrency, "repeats": options.repeats, "waves": options.waves,
                  "profiles_state_dir": str(options.profiles_state_dir),
                  "figure": "best tokens/s of the repeats, splits interleaved; a run is `waves` timed passes of "
                            "the load after one untimed pass on the freshly loaded route; stage times are each stage's "
                            "GetHealth decode service (unpack + compute + pack) per microbatch over the run, on the "
                            "clock its profiles use (measured_timing)"},
        "provenance": _provenance(options, hosts, caps),
    }


def _provenance(options: PlacementBenchOptions, hosts: list[str], caps: list) -> dict:
    from libs.service.host import cpu_name

    specs = {h.name: h for h in options.spec.hosts}
    return {
        "evidence_class": "physical",
        "label": "measurements on this host of a netns fleet (real namespaces, cgroup quotas, shaped links); "
                 "the plan and predicted_* figures are predictions from stored profile records",
        "fleet_file": options.fleet_file, "fleet_file_sha256": options.spec.file_sha256,
        "hosts": {host: {"backend": specs[host].backend.value, "backend_build": cap.backend_build,
                         "cpu_quota_cores": cap.device.cpu_quota_cores, "cpuset": cap.device.cpuset,
                         "memory_limit_bytes": cap.device.memory_limit_bytes, "cpu": cap.device.name,
                         "link_bits_per_s": specs[host].link.rate_bits_per_s}
                  for host, cap in zip(hosts, caps, strict=True)},
        "hardware": cpu_name(),
        "model_snapshot": describe_checkpoint(options.checkpoint).model_snapshot,
        "load_average": list(os.getloadavg()),
        "command": "",
    }


def run_placement_bench(options: PlacementBenchOptions, command: str, log=lambda message: None) -> dict:
    for name in ("repeats", "waves"):
        if getattr(options, name) < 1:
            raise PlacementBenchError(f"{name} must be at least 1, got {getattr(options, name)}")
    stage_hosts = [h for h in options.spec.hosts if h.stage_worker]
    if len(stage_hosts) != 2:
        raise PlacementBenchError(f"bench placement compares splits over two stage hosts; "
                                  f"{options.fleet_file} has {len(stage_hosts)}")
    try:
        records = stored_profile_records(Path(options.profiles_state_dir), options.spec.control_host)
    except NoStoredProfiles as exc:
        raise PlacementBenchError(str(exc)) from exc
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fornax-placement-bench-") as scratch:
        state_dir = Path(scratch) / ".fornax"
        fleet = FleetOptions(state_dir=state_dir, startup_timeout_s=600, insecure=True,
                             stage_read_roots=(options.checkpoint,))
        state, launcher = start_isolated_fleet(fleet, options.spec)
        try:
            workers = [state.entry(f"stage_worker_{i}").grpc for i in range(len(stage_hosts))]
            report = asyncio.run(_run(options, records, workers, log))
        finally:
            launcher.stop_all()
            tear_down(state_dir)
    report["provenance"]["command"] = command
    report["provenance"]["wall_s"] = time.perf_counter() - started
    return report
