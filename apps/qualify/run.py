"""`fornax qualify`: start the fleet file's hosts with skewed clocks, install the route, run the
scenarios N times, then write the verdict: JSON artifact, HTML report, and signed measurement,
calibration and qualification records in the fleet's registry.

The registry lives in the fleet (`<state>/hosts/<control>/evidence_registry`), so a later
`fornax up --fleet FILE --state-dir <state>` finds the calibration this wrote.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from apps.fleet.isolated import start_isolated_fleet
from apps.fleet.launcher import FleetOptions, Launcher
from apps.fleet.netns import read_record, tear_down
from apps.fleet.route_wait import wait_for_route
from apps.fleet.spec import FleetSpec, load_fleet_spec
from apps.fleet.supervisor import FleetSupervisor
from apps.qualify import skew
from apps.qualify.child_call import ChildCallFailed, call_in_child
from apps.qualify.diagnosis import shared_cpus
from apps.qualify.fencing import FirstStage, reconnect_fencing
from apps.qualify.gate import (
    CHECKS,
    DEFAULT_TOLERANCE,
    WINDOW_CHECKS,
    BoundaryParity,
    Check,
    PredictedStage,
    RunOutcome,
    StageTimes,
    Verdict,
    calibrate,
)
from apps.qualify.predict_at import ROWS_BASIS, answer_halves, planner_at, predicted_at_rows
from apps.qualify.probes import (
    Generator,
    StageHealth,
    capabilities,
    installed_plan,
    plan_evidence_ids,
    plan_status,
    predicted_stages,
    stage_health,
)
from apps.qualify.records import (
    MeasuredOn,
    calibration_record,
    put_signed,
    qualification_record,
    run_measurement,
)
from apps.qualify.reference import (
    RouteRefused,
    RouteWeights,
    TokenAgreement,
    boundary_parity,
    greedy_reference,
    route_hops,
    route_weights,
    streamed_boundary_parity,
    token_agreement,
    with_token_agreement,
)
from apps.qualify.reference_choice import AUTO, STREAMED, ReferenceChoice, choose_reference
from apps.qualify.report_html import ReportFacts, render_report
from apps.qualify.scenarios import StageRef, Workload, changing_subset, expiry, measured_decode
from fornax.orchestrator.v1 import orchestrator_pb2 as orch_pb
from libs.common.kinds import Backend, DType
from libs.profiles.schema import SERVING_WINDOW, HostFacts, to_json
from libs.security.identity import service_identity
from libs.security.store import CertStore
from libs.service.channels import ChannelConfig
from libs.service.errors import FornaxError
from libs.service.fleet_state import FleetState, fleet_path, write_fleet
from libs.service.host import host_facts
from services.evidence_registry.client import ClientOptions, RegistryCallFailed, RegistryClient
from services.evidence_registry.domain import LayerRange, Record, RecordContent
from services.planner.inventory_facts import hosts_from_profiles, inventory_from
from services.planner.model import describe_checkpoint
from services.planner.profile_source import fetch_profile_records
from services.planner.profiles import book_from_records

PROMPTS = ((5, 17, 42), (7, 8, 9, 10, 11), (3, 1, 4, 1, 5, 9, 2, 6), (11, 12))
# On the tiny test checkpoint (7, 8, 9, 10, 11) decodes 400 greedy tokens without an
# end-of-sequence token; (5, 17, 42) ends after 38.
EXPIRY_PROMPT = 1
CLEANUP_TIMEOUT_S = 20.0
SIGNER = service_identity("orchestrator")


@dataclass(frozen=True)
class QualifyConfig:
    fleet_file: Path
    checkpoint: Path
    runs: int = 3
    tolerance: float = DEFAULT_TOLERANCE
    parity_tolerance: float = 1e-4
    state_dir: Path = Path(".fornax")
    out_dir: Path = Path("qualify-report")
    skew_s: int = skew.DEFAULT_SKEW_S
    expiry_budget_s: float = 1.0
    expiry_tolerance_s: float = 0.5
    decode_tokens: int = 24
    install_timeout_s: float = 3600.0
    recovery_timeout_s: float = 90.0
    valid_for_s: int = 7 * 86400
    numpy_only: bool = False
    command: str = ""
    # `fornax profile`'s serving window: each run serves only the measured decode (token parity
    # checked), and the calibration is stored as SERVING_WINDOW, a measurement the planner feeds
    # back, never a verdict (no qualification record).
    serving_window: bool = False
    # apps.qualify.reference_choice.REFERENCES: the whole float32 model, the layer-streamed
    # reference, or whichever fits the memory available once the fleet is up.
    reference: str = AUTO
    # The weight policy of every stage a fleet file's host does not set (as `fornax up --weights`).
    weights: str = "fp32"


@dataclass(frozen=True)
class QualifyResult:
    verdict: Verdict
    runs: tuple[RunOutcome, ...]
    predicted: tuple[PredictedStage, ...]
    facts: ReportFacts
    record_ids: tuple[str, ...]
    json_path: Path
    html_path: Path


class QualifyError(RuntimeError):
    """The gate could not run at all (bad input, a fleet that did not come up); `reason` is a
    stable UPPER_SNAKE code where the refusal has one."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(f"{message} [{reason}]" if reason else message)
        self.reason = reason


def _log(message: str) -> None:
    print(f"qualify: {message}", file=sys.stderr, flush=True)


def prepare_spec(cfg: QualifyConfig) -> tuple[FleetSpec, dict[str, int]]:
    spec = load_fleet_spec(cfg.fleet_file)
    try:  # refused before any host starts: hops that carry no activations qualify can compare
        route_hops(spec.hop_dtypes, len(spec.hop_dtypes) + 1)
    except RouteRefused as exc:
        raise QualifyError(f"{cfg.fleet_file}: {exc}", exc.reason) from exc
    if cfg.numpy_only:
        spec = dataclasses.replace(spec, hosts=tuple(dataclasses.replace(h, backend=Backend.NUMPY)
                                                     for h in spec.hosts))
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    offsets = skew.skewed_offsets([h.name for h in spec.hosts], spec.control_host, cfg.skew_s, uptime)
    return skew.with_offsets(spec, offsets), offsets


@dataclass
class LiveRoute:
    """The running fleet as qualify sees it: addresses, hosts and the installed plan."""

    spec: FleetSpec
    state: FleetState
    launcher: Launcher
    supervisor: FleetSupervisor
    channel: ChannelConfig
    stages: list[StageRef]
    workers: list[str]  # service name per stage index
    facts: list[HostFacts]
    builds: list[str]
    predicted: list[PredictedStage]
    plan_hash: str
    model_snapshot: str
    plan_route_key: str  # set when the plan was made from profiles
    evidence_ids: list[str]  # the profile records the plan's terms rest on

    @property
    def orchestrator(self) -> str:
        return self.state.entry("orchestrator").grpc

    def address(self, stage: int) -> str:
        return self.state.entry(self.workers[stage]).grpc

    def health(self, stage: int) -> StageHealth:
        return stage_health(self.address(stage), self.channel)

    def pid(self, name: str) -> int:
        return next(s.process.pid for s in self.launcher.started if s.spec.name == name)


def _inspect(spec: FleetSpec, state: FleetState, launcher: Launcher, supervisor: FleetSupervisor) -> LiveRoute:
    channel = ChannelConfig(credentials=launcher.trust.operator_credentials())
    orchestrator = state.entry("orchestrator").grpc
    status = plan_status(orchestrator, channel)
    if status.state != orch_pb.ROUTE_STATE_SERVING:
        raise QualifyError(f"the route is not serving: {status.reason or orch_pb.RouteState.Name(status.state)}")
    plan = installed_plan(state.entry("planner").grpc, status.plan.plan_hash, channel)
    by_address = {s.grpc: s.name for s in state.services if s.kind == "stage_worker"}
    workers = [by_address[s.worker_address] for s in sorted(status.stages, key=lambda s: s.stage_index)]
    stage_hosts = spec.stage_hosts
    hosts = [stage_hosts[int(w.removeprefix("stage_worker_"))].name for w in workers]
    caps = [capabilities(state.entry(w).grpc, channel) for w in workers]
    backends = [c.backend_build.split()[0] for c in caps]
    predicted = predicted_stages(plan, hosts, backends)
    stages = [StageRef(p.stage_index, p.host, p.backend, p.layer_start, p.layer_end) for p in predicted]
    facts = [HostFacts(h, c.device.name, c.device.cpu_quota_cores, c.device.cpuset, c.device.memory_limit_bytes)
             for h, c in zip(hosts, caps, strict=True)]
    shared = shared_cpus(facts)  # overlapping cpusets are stated in every host line of the report
    facts = [replace(f, cpu_shared_with=",".join(shared.get(f.host, ()))) for f in facts]
    return LiveRoute(spec, state, launcher, supervisor, channel, stages, workers, facts,
                     [c.backend_build for c in caps], predicted, plan.plan_hash, plan.model_snapshot, plan.route_key,
                     plan_evidence_ids(plan))


async def _guarded(name: str, scenario) -> list[Check]:
    """A scenario that raises fails its check (named), instead of ending the gate."""
    try:
        result = await scenario
    except Exception as exc:  # the gate reports every failure as a failed check
        return [Check(name, False, f"{type(exc).__name__}: {exc or repr(exc)}")]
    return result if isinstance(result, list) else [result]


async def _cleanup(route: LiveRoute) -> Check:
    deadline = time.monotonic() + CLEANUP_TIMEOUT_S
    while True:
        seen = [await asyncio.to_thread(route.health, s.index) for s in route.stages]
        left = [(s.index, h.kv_bytes_used, h.live_sequences) for s, h in zip(route.stages, seen, strict=True)
                if h.kv_bytes_used or h.live_sequences or h.inflight_batches]
        if not left:
            return Check("cleanup", True, f"every stage ({len(seen)}) holds 0 KV bytes, 0 leases, 0 batches in flight")
        if time.monotonic() > deadline:
            return Check("cleanup", False, "; ".join(f"stage {i} still holds {kv} KV bytes and {n} leases"
                                                     for i, kv, n in left) + f" after {CLEANUP_TIMEOUT_S:g} s")
        await asyncio.sleep(0.2)


def _parity_checks(boundaries: list[BoundaryParity], gates: str) -> list[Check]:
    """The boundary and final-logit checks; each detail opens with which gates applied and why."""
    inner = [b for b in boundaries if b.label != "final logits"]
    final = [b for b in boundaries if b.label == "final logits"]

    def describe(items: list[BoundaryParity]) -> str:
        return "; ".join(f"{b.label}: {b.measure} {b.max_abs_diff:.3g} "
                         f"({f'tolerance {b.tolerance:.3g}' if b.gated else 'stated, not gated'})"
                         f"{'' if b.passed else ' FAILED'}" for b in items)

    return [Check("boundary_parity", bool(inner) and all(b.passed for b in inner),
                  f"{gates}. {describe(inner) or 'no boundary'}"),
            Check("final_logit_parity", bool(final) and all(b.passed for b in final),
                  f"{gates}. {describe(final) or 'none'}")]


async def _one_run(route: LiveRoute, cfg: QualifyConfig, work: Workload, run: int, clocks: str,
                   boundaries: list[BoundaryParity], agreement: TokenAgreement | None, gates: str) -> RunOutcome:
    gen = Generator(route.orchestrator, route.channel)
    times: list[StageTimes] = []
    try:
        try:
            decode_checks, times = await measured_decode(gen, work, run, route.stages, route.health)
        except Exception as exc:  # reported as failed checks below
            decode_checks = [Check("prefill", False, f"{type(exc).__name__}: {exc}"),
                             Check("token_parity", False, f"{type(exc).__name__}: {exc}")]
        checks = with_token_agreement(decode_checks, agreement)
        if cfg.serving_window:
            return RunOutcome(run, tuple(checks), tuple(times))
        checks += await _guarded("changing_subset_decode", changing_subset(gen, work, run))
        checks += await _guarded("expiry_skewed_clocks",
                                 expiry(gen, work, run, cfg.expiry_budget_s, cfg.expiry_tolerance_s, clocks))
        checks += await _guarded("reconnect_fencing", _fencing(route, gen, work, run, cfg))
        checks.append(await _cleanup(route))
    finally:
        await gen.close()
    checks += _parity_checks(boundaries, gates)
    return RunOutcome(run, tuple(checks), tuple(times), tuple(boundaries))


def _fencing(route: LiveRoute, gen: Generator, work: Workload, run: int, cfg: QualifyConfig):
    victim_name = route.workers[-1]
    restarts_before = len(route.supervisor.restarts)

    def restarted(old_pid: int) -> bool:
        if len(route.supervisor.restarts) <= restarts_before or route.pid(victim_name) == old_pid:
            return False
        status = plan_status(route.orchestrator, route.channel)
        return status.state == orch_pb.ROUTE_STATE_SERVING and all(s.healthy for s in status.stages)

    def first_stage() -> FirstStage:
        caps = capabilities(route.address(0), route.channel)
        manifest = next(s.manifest_hash for s in plan_status(route.orchestrator, route.channel).stages
                        if s.stage_index == 0)
        return FirstStage(caps.data_plane_address, manifest, caps.identity)

    tls_paths = CertStore(route.launcher.options.state_dir).paths_for(SIGNER)
    return reconnect_fencing(gen, work, run, lambda: route.pid(victim_name), lambda: route.health(0),
                             lambda pid: _poll_safe(restarted, pid), first_stage, tls_paths, cfg.recovery_timeout_s)


def _poll_safe(predicate: Callable[[int], bool], value: int) -> bool:
    try:
        return predicate(value)
    except Exception:  # an unreachable service while it restarts is "not yet"
        return False


def qualify(cfg: QualifyConfig) -> QualifyResult:
    _check_inputs(cfg)
    spec, offsets = prepare_spec(cfg)
    clocks = skew.describe(offsets, spec.control_host)
    state_dir = cfg.state_dir.resolve()
    if read_record(state_dir) is not None:
        raise QualifyError(f"a fleet's hosts exist under {state_dir}; run `fornax down --state-dir {cfg.state_dir}`")
    started_utc = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    options = FleetOptions(state_dir=state_dir, boundary_dtype=(spec.hop_dtypes or (DType.FP32,))[0].value,
                           checkpoint=str(Path(cfg.checkpoint).resolve()),
                           startup_timeout_s=300, grace_period_s=5.0,
                           env={"FORNAX_RECOVERY_TIMEOUT_S": str(cfg.recovery_timeout_s)}, weights=cfg.weights)
    _log(f"starting {cfg.fleet_file} with {clocks}")
    state, launcher = start_isolated_fleet(options, spec)
    write_fleet(state_dir, state)
    supervisor, supervising = FleetSupervisor(launcher), False
    try:
        wait_for_route(state, cfg.install_timeout_s, lambda line: _log(line))
        supervising = bool(supervisor.start())
        route = _inspect(spec, state, launcher, supervisor)
        _log("route " + " > ".join(f"{s.host}:{s.backend}[{s.layer_start}:{s.layer_end}]" for s in route.stages))
        choice = _choose_reference(cfg)
        _log(choice.describe())
        weights = _route_weights(cfg, route)
        work, boundaries, agreement = _workload(cfg, route, choice, weights)
        runs = _run_all(route, cfg, work, clocks, boundaries, agreement, weights.describe_gates())
        now_ns = time.time_ns()
        predicted, basis = _predictions_at_measured_rows(route, cfg, runs, now_ns, weights)
        verdict = _verdict(route, cfg, runs, predicted, basis, now_ns)
        facts = _report_facts(cfg, spec, route, started_utc, load, clocks, choice, weights)
        artifact = _artifact(cfg, route, verdict, runs, predicted, facts, basis)
        contents = _records(cfg, route, verdict, runs, work, artifact, now_ns, weights)
        cfg.out_dir.mkdir(parents=True, exist_ok=True)
        json_path, html_path = cfg.out_dir / "qualify.json", cfg.out_dir / "qualify.html"
        html_path.write_text(render_report(verdict, runs, predicted, facts), encoding="utf-8")
        json_path.write_text(json.dumps(artifact, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        records = _put_records(state, route, contents, state_dir, html_path)
        artifact["record_ids"] = [r.record_id for r in records]
        json_path.write_text(json.dumps(artifact, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return QualifyResult(verdict, tuple(runs), tuple(predicted), facts,
                             tuple(r.record_id for r in records), json_path, html_path)
    finally:
        if supervising:
            supervisor.stop()
        launcher.stop_all()
        left = tear_down(state_dir)
        fleet_path(state_dir).unlink(missing_ok=True)
        if left:
            _log(f"teardown left: {', '.join(left)}")


def _check_inputs(cfg: QualifyConfig) -> None:
    if cfg.runs < 1:
        raise QualifyError(f"--runs must be >= 1, got {cfg.runs}")
    if not Path(cfg.checkpoint, "config.json").is_file():
        raise QualifyError(f"--checkpoint {cfg.checkpoint} has no config.json")


def _choose_reference(cfg: QualifyConfig) -> ReferenceChoice:
    """Made once the fleet is up, so the memory available is what the fleet left."""
    model = describe_checkpoint(cfg.checkpoint, policy="fp32")
    f32_bytes = model.embedding_bytes + model.head_bytes + sum(layer.weight_bytes for layer in model.layers)
    return choose_reference(cfg.reference, f32_bytes, host_facts().memory_available_bytes)


def _route_weights(cfg: QualifyConfig, route: LiveRoute) -> RouteWeights:
    """The route's weight policy, backends and hop dtypes, which decide the parity gates."""
    try:
        weights = route_weights([route.spec.host(s.host).weights or cfg.weights for s in route.stages],
                                [s.backend for s in route.stages], route_hops(route.spec.hop_dtypes, len(route.stages)))
    except RouteRefused as exc:
        raise QualifyError(str(exc), exc.reason) from exc
    _log(weights.describe_gates())
    return weights


def _workload(cfg: QualifyConfig, route: LiveRoute, choice: ReferenceChoice,
              weights: RouteWeights) -> tuple[Workload, list[BoundaryParity], TokenAgreement | None]:
    """The prompts with the ids every stream must equal, each stage boundary's parity, and (for
    the streamed reference or a route that cannot be exact) the served tokens' agreement.

    Whole, on an exact route: the ids are transformers' greedy generation. Streamed: greedy
    generation through the whole model is out of reach; a route that cannot be exact (a rounding
    hop, block formats on MAX) cannot be held to it. Then the fleet's own greedy tokens (one
    prompt at a time, before any run) are scored teacher forced against the layer-streamed
    reference (`weights.token_agreement_min`), and every scenario must then reproduce them."""
    ranges = [(s.layer_start, s.layer_end) for s in route.stages]
    agreement = None
    if choice.kind == STREAMED or not weights.exact:
        served = asyncio.run(_served_greedy(route, PROMPTS, cfg.decode_tokens))
        agreement = token_agreement(cfg.checkpoint, weights, PROMPTS, served)
        _log(agreement.describe())
        work = Workload(PROMPTS, served, cfg.decode_tokens, EXPIRY_PROMPT,
                        "the route's own greedy tokens, scored against the layer-streamed reference")
    else:
        reference = greedy_reference(cfg.checkpoint, PROMPTS, cfg.decode_tokens)
        work = Workload(PROMPTS, tuple(tuple(r) for r in reference), cfg.decode_tokens, EXPIRY_PROMPT)
    if cfg.serving_window:
        return work, [], agreement
    parity = streamed_boundary_parity if choice.kind == STREAMED else boundary_parity
    try:  # in a child process: no MAX runtime stays in this one while it measures (child_call)
        boundaries, _, _ = call_in_child(parity, cfg.checkpoint, ranges, list(weights.backends),
                                         cfg.parity_tolerance, policy=weights.policy, hops=weights.hops)
    except ChildCallFailed as exc:
        raise QualifyError(f"boundary parity: {exc}", exc.reason) from exc
    return work, boundaries, agreement


async def _served_greedy(route: LiveRoute, prompts: tuple[tuple[int, ...], ...],
                         tokens: int) -> tuple[tuple[int, ...], ...]:
    gen = Generator(route.orchestrator, route.channel)
    try:
        outs = [await gen.generate(f"qualify-reference-{i}", p, tokens) for i, p in enumerate(prompts)]
    finally:
        await gen.close()
    failed = [f"{o.request_id}: {o.code} {o.error}" for o in outs if o.code]
    if failed:
        raise QualifyError(f"the route's greedy tokens for the streamed reference failed: {'; '.join(failed)}")
    return tuple(tuple(o.token_ids) for o in outs)


def _run_all(route: LiveRoute, cfg: QualifyConfig, work: Workload, clocks: str,
             boundaries: list[BoundaryParity], agreement: TokenAgreement | None, gates: str) -> list[RunOutcome]:
    runs = []
    for n in range(1, cfg.runs + 1):
        outcome = asyncio.run(_one_run(route, cfg, work, n, clocks, boundaries, agreement, gates))
        _log(f"run {n}: " + ", ".join(f"{c.name} {'pass' if c.passed else 'FAIL'}" for c in outcome.checks))
        for c in outcome.failed:
            _log(f"run {n}: {c.name} failed: {c.detail}")
        runs.append(outcome)
    return runs


def _verdict(route: LiveRoute, cfg: QualifyConfig, runs: list[RunOutcome], predicted: list[PredictedStage],
             basis: str, now_ns: int) -> Verdict:
    """The runs calibrated against the plan's predictions, which are logged."""
    try:
        verdict = calibrate(runs, predicted, model_snapshot=route.model_snapshot,
                            plan_hash=route.plan_hash, evidence_ids=route.evidence_ids, tolerance=cfg.tolerance,
                            command=cfg.command, measured_unix_ns=now_ns, valid_for_s=cfg.valid_for_s,
                            plan_route_key=route.plan_route_key, rows_basis=basis, hosts=route.facts,
                            expected_checks=WINDOW_CHECKS if cfg.serving_window else CHECKS)
    except ValueError as exc:
        raise QualifyError(f"cannot calibrate the installed plan: {exc}") from exc
    if cfg.serving_window:
        verdict = replace(verdict, calibration=replace(verdict.calibration, purpose=SERVING_WINDOW))
    _log("predictions " + (f"evaluated at each stage's {basis}" if basis else "at the plan's target rows")
         + " (predictions): " + "; ".join(f"stage {p.stage_index} {p.rows:.3g} rows, {_past(p.past)}: " + ", ".join(
             f"{k} {v * 1e3:.3g} ms" for k, v in p.seconds.items()) for p in predicted))
    return verdict


def _report_facts(cfg: QualifyConfig, spec: FleetSpec, route: LiveRoute, started_utc: str, load: str,
                  clocks: str, choice: ReferenceChoice, weights: RouteWeights) -> ReportFacts:
    return ReportFacts(
        fleet_file=f"{cfg.fleet_file} (sha256 {spec.file_sha256[:12]})",
        hosts=tuple(f"stage {s.index} on {f.describe()}; build {b}"
                    for s, f, b in zip(route.stages, route.facts, route.builds, strict=True)),
        model_snapshot=route.model_snapshot, command=cfg.command, started_utc=started_utc, skew=clocks,
        load_average=f"{load} at start, " + "{:.2f} {:.2f} {:.2f} at end".format(*os.getloadavg()),
        reference=choice.describe(), gates=weights.describe_gates())


def _artifact(cfg: QualifyConfig, route: LiveRoute, verdict: Verdict, runs: list[RunOutcome],
              predicted: list[PredictedStage], facts: ReportFacts, basis: str) -> dict:
    """qualify.json: the verdict, calibration, runs, predictions and facts."""
    return {"verdict": {"passed": verdict.passed, "failures": list(verdict.failures),
                        "bottleneck_prediction_error": verdict.calibration.bottleneck_prediction_error,
                        "tolerance": cfg.tolerance},
            "calibration": json.loads(to_json(verdict.calibration)), "runs": [asdict(r) for r in runs],
            "predictions": [asdict(p) for p in predicted],
            "predictions_at_target_rows": [asdict(p) for p in route.predicted], "facts": asdict(facts),
            "evidence_class": "physical",
            "predictions_label": "cost-model predictions of the installed plan"
                                 + (f", evaluated at each stage's {basis} per microbatch from the plan's own "
                                    "profile records" if basis else ", at the plan's target rows")}


def _records(cfg: QualifyConfig, route: LiveRoute, verdict: Verdict, runs: list[RunOutcome], work: Workload,
             artifact: dict, now_ns: int, weights: RouteWeights) -> list[tuple[RecordContent, bytes]]:
    """The registry records the gate leaves: each run's measurement, the calibration, the qualification."""
    on = MeasuredOn(hardware="; ".join(f.describe() for f in route.facts),
                    backend_build=" | ".join(f"stage {s.index} {s.host}: {b}"
                                             for s, b in zip(route.stages, route.builds, strict=True)),
                    model_snapshot=route.model_snapshot, command=cfg.command, measured_unix_ns=now_ns,
                    valid_for_s=cfg.valid_for_s, layer_range=LayerRange(route.stages[0].layer_start,
                                                                         route.stages[-1].layer_end),
                    dtype=weights.boundary_dtype, shapes=_shapes(runs, work))
    contents = [run_measurement(r, verdict.calibration.route_key, on) for r in runs]
    if cfg.serving_window:
        return [*contents, calibration_record(verdict, on)]
    contents += [calibration_record(verdict, on), qualification_record(artifact, verdict, on)]
    return contents


def _put_records(state: FleetState, route: LiveRoute, contents: list[tuple[RecordContent, bytes]],
                 state_dir: Path, html_path: Path) -> list[Record]:
    try:
        with RegistryClient(state.entry("evidence_registry").grpc,
                            ClientOptions(channel=route.channel)) as client:
            return put_signed(client, contents, SIGNER, state_dir)
    except RegistryCallFailed as exc:
        raise QualifyError(f"the registry refused the gate's records: {exc} (report: {html_path})") from exc


def _predictions_at_measured_rows(route: LiveRoute, cfg: QualifyConfig, runs: list[RunOutcome],
                                  now_ns: int, weights: RouteWeights) -> tuple[list[PredictedStage], str]:
    """A plan made from profiles is re-predicted at each stage's measured rows per microbatch
    (median over runs) and the decode windows' measured mean past per row, on the plan's own
    records, its wire as the round trip the gate measures (`apps.qualify.predict_at`); a plan of
    declared figures keeps its own predictions (its target rows). A plan from profiles that
    cannot be re-predicted fails closed."""
    if not route.plan_route_key:
        return route.predicted, ""
    rows = []
    for p in route.predicted:
        seen = [s.rows_per_batch for r in runs for s in r.stages if s.stage_index == p.stage_index]
        rows.append(statistics.median(seen) if seen else 1.0)
    pasts = [s.past_per_row for r in runs for s in r.stages if s.past_per_row > 0]
    past = statistics.median(pasts) if pasts else 0.0
    try:
        records = fetch_profile_records(route.state.entry("evidence_registry").grpc,
                                        ClientOptions(channel=route.channel))
        wanted = set(route.evidence_ids)
        book = book_from_records(r for r in records if r.record_id in wanted)
        missing = wanted - set(book.record_ids)
        if missing:
            raise QualifyError(f"the plan's profile records {sorted(missing)} are no longer in the registry")
        names = sorted((s for s in route.state.services if s.kind == "stage_worker"),
                       key=lambda s: int(s.name.removeprefix("stage_worker_")))
        caps = [capabilities(s.grpc, route.channel) for s in names]
        inventory = inventory_from(caps, hosts_from_profiles(caps, records))
        plan = installed_plan(route.state.entry("planner").grpc, route.plan_hash, route.channel)
        placement = [(s.node, s.layer_range.layer_start, s.layer_range.layer_end_exclusive)
                     for s in sorted(plan.stages, key=lambda s: s.stage_index)]
        at = planner_at(describe_checkpoint(cfg.checkpoint), inventory, book, placement, now_ns, past,
                        weights.boundary_dtype)
        answers = answer_halves(book, [p.host for p in route.predicted])
        return predicted_at_rows(route.predicted, rows, at, answers, round(past)), ROWS_BASIS
    except (RegistryCallFailed, FornaxError, ValueError) as exc:
        raise QualifyError(f"cannot re-predict the installed plan at the measured rows: {exc}") from exc


def _shapes(runs: list[RunOutcome], work: Workload) -> str:
    rows = [s.rows_per_batch for r in runs for s in r.stages]
    lengths = [len(p) for p in work.prompts]
    return (f"{len(work.prompts)} prompts of {min(lengths)}-{max(lengths)} tokens, {work.decode_tokens} greedy tokens "
            f"each; measured decode window {min(rows, default=0):.3g}-{max(rows, default=0):.3g} rows per microbatch")


def _past(tokens: float) -> str:
    """Which context a stage's prediction was made at (0 stands for the plan's own decode context)."""
    if tokens <= 0:
        return "at the plan's decode context"
    return f"{tokens:.3g} tokens of past per row (measured mean)"
