"""`fornax bench serve --fleet FILE --compare-routes [--kill-at SECONDS]`: one route over every
stage host against two equal replica routes, planned and served in one run.

The planner weighs every layout of the file's stage hosts at each measured concurrency (its
declared figures: predictions); the single route and the best-predicted pair of equal routes are
then served one after the other, each as `fornax up --fleet FILE --routes ...` serves it (its
own namespaces, cgroup quotas and shaped links, torn down before the next), and measured from
outside over HTTPS at each level. With `--kill-at`, the two-route fleet then runs one more
level-32 window in which the last stage worker of its first route is killed (SIGKILL) that many
seconds in: lost requests, 5xx answers and the largest inter-token gap a stream across the kill
saw. The arithmetic is `apps.bench.layout_compare`'s.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from apps.bench import layout_compare as lc
from apps.bench.fleet_serve import _drive
from apps.bench.serve import prompts
from apps.fleet.isolated import start_isolated_fleet
from apps.fleet.launcher import FleetOptions
from apps.fleet.netns import tear_down
from apps.fleet.route_layout import LAYOUT_CONCURRENCY, plan_fleet_routes
from apps.fleet.route_wait import wait_for_route
from apps.fleet.spec import FleetSpec
from libs.model.config import load_config
from libs.service.fleet_state import FleetState

KILL_LEVEL = 32
KILL_TOKENS_FACTOR = 4  # the kill window's streams ask for this many times --max-tokens, to outlast the kill
ROUTES_SERVING_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class LayoutBenchOptions:
    fleet_file: str
    spec: FleetSpec
    checkpoint: str
    prompt_tokens: int = 32
    max_tokens: int = 16
    concurrency: tuple[int, ...] = (1, 8, 32, 64)
    kill_at_s: float | None = None
    install_timeout_s: float = 3600.0


def check_options(options: LayoutBenchOptions) -> None:
    """Refusals before anything is planned or started (ValueError "REASON: why")."""
    hosts = len(options.spec.stage_hosts)
    if hosts < 2 or hosts % 2:
        raise ValueError(f"STAGE_HOSTS_NOT_EVEN: --compare-routes needs an even number of stage hosts (two equal "
                         f"routes), {options.fleet_file} has {hosts}")
    if not options.concurrency or min(options.concurrency) < 1:
        raise ValueError("BAD_CONCURRENCY: --concurrency takes levels >= 1")
    if not any(c >= 2 for c in options.concurrency):
        raise ValueError("CONCURRENCY_BELOW_ROUTES: --compare-routes needs a level >= 2 (two routes share it)")
    if options.kill_at_s is not None and not options.kill_at_s > 0:
        raise ValueError(f"BAD_KILL_AT: --kill-at takes seconds > 0, got {options.kill_at_s}")
    if options.max_tokens < 2:
        raise ValueError("BAD_MAX_TOKENS: --max-tokens must be >= 2 (ITL needs two tokens)")


def plan(options: LayoutBenchOptions) -> tuple[lc.LayoutPick, lc.LayoutPick, dict[str, dict[str, float]], dict]:
    """The two layouts (as predicted at the serving concurrency), each one's prediction per
    level, and what `--routes auto` would serve."""
    hosts = len(options.spec.stage_hosts)

    def candidates(concurrency: int):
        result = plan_fleet_routes(options.spec, options.checkpoint, None, None, concurrency)
        if not result.feasible or result.route_choice is None:
            raise lc.LayoutPickError(f"no layout fits the fleet: {result.infeasibility}",
                                     result.infeasibility_reason or "ROUTES_INFEASIBLE")
        return result.route_choice

    choice = candidates(LAYOUT_CONCURRENCY)
    single, pair = lc.pick_single(choice.candidates, hosts), lc.pick_equal_pair(choice.candidates, hosts)
    predicted: dict[str, dict[str, float]] = {}
    for c in (c for c in options.concurrency if c >= 2):
        at_level = candidates(c).candidates
        predicted[f"c{c}"] = {lc.SINGLE: lc.pick_single(at_level, hosts).predicted_tok_s,
                              lc.REPLICAS: _same_layout(at_level, pair)}
    auto = choice.candidates[choice.chosen]
    return single, pair, predicted, {"layout": auto.layout, "predicted_tok_s": auto.tokens_per_s,
                                     "rule": choice.rule, "concurrency": LAYOUT_CONCURRENCY}


def _same_layout(candidates, pick: lc.LayoutPick) -> float:
    """The prediction of `pick`'s host groups among another level's candidates."""
    for c in candidates:
        if c.feasible and c.hosts == pick.hosts:
            return c.tokens_per_s
    return float("nan")


def run_layout_bench(options: LayoutBenchOptions, command: str, say: Callable[[str], None]) -> dict:
    single, pair, predicted, auto = plan(options)
    chosen = lc.planner_choice(single, pair)
    say(f"planner: {single.description} predicted {single.predicted_tok_s:.1f} tok/s; {pair.description} "
        f"predicted {pair.predicted_tok_s:.1f} tok/s at c{LAYOUT_CONCURRENCY} (predictions); chosen {chosen}")
    stage_hosts = [h.name for h in options.spec.stage_hosts]
    measured: dict[str, dict] = {}
    kill = None
    for pick in (single, pair):
        say(f"serving {pick.description}")
        kill_now = options.kill_at_s if pick.name == lc.REPLICAS else None
        measured[pick.name], fault = _serve(options, lc.groups_of(pick, stage_hosts), kill_now, say)
        kill = fault if fault is not None else kill
    comparison = lc.compare({level: lc.LevelComparison({n: measured[n][level]["output_tokens_per_s"]
                                                        for n in measured}, figures)
                             for level, figures in predicted.items()}, chosen)
    report = {**comparison, "chosen": chosen, "planner_auto_choice": auto,
              "layouts": {pick.name: {"description": pick.description, "hosts": [list(g) for g in pick.hosts],
                                      "predicted_tok_s": {f"c{LAYOUT_CONCURRENCY}": pick.predicted_tok_s,
                                                          **{lv: p[pick.name] for lv, p in predicted.items()}},
                                      "measured": measured[pick.name]}
                          for pick in (single, pair)},
              "provenance": _provenance(options, command)}
    if kill is not None:
        report["kill"] = kill
    return report


def _serve(options: LayoutBenchOptions, groups: tuple[tuple[int, ...], ...], kill_at_s: float | None,
           say: Callable[[str], None]) -> tuple[dict, dict | None]:
    with tempfile.TemporaryDirectory(prefix="fornax-layout-bench-") as scratch:
        state_dir = Path(scratch) / ".fornax"
        fleet = FleetOptions(state_dir=state_dir, checkpoint=options.checkpoint, startup_timeout_s=600,
                             route_groups=groups)
        state, launcher = start_isolated_fleet(fleet, options.spec)
        try:
            wait_for_route(state, options.install_timeout_s, lambda m: say(f"  {m}"))
            _wait_routes_serving(state, state_dir, max(1, len(groups)))
            levels = asyncio.run(_measure(options, state, say))
            fault = None
            if kill_at_s is not None:
                victim = f"stage_worker_{groups[0][-1]}"
                fault = asyncio.run(_kill_window(options, state, victim, kill_at_s))
                say(f"  kill: {json.dumps(fault)}")
        finally:
            launcher.stop_all()
            tear_down(state_dir)
    return levels, fault


def _wait_routes_serving(state: FleetState, state_dir: Path, routes: int) -> None:
    """/health answers once a route serves; the comparison wants every route serving."""
    from apps.fleet.route_status import route_report
    from libs.security.cli_credentials import cli_channel

    deadline = time.monotonic() + ROUTES_SERVING_TIMEOUT_S
    while time.monotonic() < deadline:
        report = route_report(state, cli_channel(state_dir))
        if report is not None:
            serving = sum(1 for r in report.replicas if r.startswith("SERVING")) if report.replicas \
                else int(report.state == "SERVING")
            if serving >= routes:
                return
        time.sleep(1.0)
    raise TimeoutError(f"{routes} routes were not all serving within {ROUTES_SERVING_TIMEOUT_S:.0f} s")


async def _measure(options: LayoutBenchOptions, state: FleetState, say: Callable[[str], None]) -> dict:
    vocab = load_config(options.checkpoint).vocab_size
    api, tls = state.api or "", state.api_ssl_context()
    await _drive(api, prompts(vocab, max(options.concurrency), options.prompt_tokens, seed=99), 2, tls)  # warm
    report = {}
    for c in options.concurrency:
        figures = await _drive(api, prompts(vocab, c, options.prompt_tokens, seed=c), options.max_tokens, tls)
        report[f"c{c}"] = figures.summary()
        say(f"  c{c}: {report[f'c{c}']['output_tokens_per_s']:.1f} tok/s")
    return report


async def _kill_window(options: LayoutBenchOptions, state: FleetState, victim: str, kill_at_s: float) -> dict:
    vocab = load_config(options.checkpoint).vocab_size
    api, tls = state.api or "", state.api_ssl_context()
    batch = prompts(vocab, KILL_LEVEL, options.prompt_tokens, seed=1000)
    tokens = options.max_tokens * KILL_TOKENS_FACTOR
    connector = aiohttp.TCPConnector(ssl=tls if tls is not None else True)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600), connector=connector) as session:
        started = time.perf_counter()
        tasks = [asyncio.create_task(_outcome(session, api, ids, tokens, started)) for ids in batch]
        await asyncio.sleep(kill_at_s)
        os.kill(state.entry(victim).pid, signal.SIGKILL)
        killed_at = time.perf_counter() - started
        outcomes = await asyncio.gather(*tasks)
    return {**lc.kill_report(outcomes, killed_at), "killed": victim, "killed_at_s": killed_at,
            "concurrency": KILL_LEVEL, "max_tokens": tokens}


async def _outcome(session: aiohttp.ClientSession, api: str, ids: tuple[int, ...], max_tokens: int,
                   started: float) -> lc.StreamOutcome:
    body = {"model": "fornax", "prompt": list(ids), "max_tokens": max_tokens, "temperature": 0, "stream": True}
    stamps: list[float] = []
    status, finished, error = 0, False, ""
    try:
        async with session.post(f"{api}/completions", json=body) as response:
            status = response.status
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    error = str(event["error"])
                for choice in event.get("choices", ()):
                    stamps.append(time.perf_counter() - started)
                    finished = finished or bool(choice.get("finish_reason"))
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    return lc.StreamOutcome(status, finished, tuple(stamps), error)


def _provenance(options: LayoutBenchOptions, command: str) -> dict:
    from apps.bench.fleet_serve import _snapshot
    from libs.service.host import cpu_name

    return {
        "evidence_class": "physical (measured) and prediction (planned), each labelled",
        "measured": "tokens/s, TTFT and ITL: measurements on this host of netns fleets (real namespaces, cgroup "
                    "quotas, tbf-shaped links), the layouts served one after the other in this run, one window "
                    "per level after a warm-up",
        "predicted": "predicted_tok_s and planner_auto_choice: the planner's cost model on the fleet file's "
                     "declared figures; not measurements",
        "fleet_file": options.fleet_file,
        "fleet_file_sha256": options.spec.file_sha256,
        "hosts": {h.name: {"backend": h.backend.value, "cpu_cores": h.cpu_cores,
                           "link_bits_per_s": h.link.rate_bits_per_s} for h in options.spec.hosts},
        "hardware": cpu_name(),
        "model_snapshot": _snapshot(options.checkpoint),
        "setup": {"prompt_tokens": options.prompt_tokens, "max_tokens": options.max_tokens,
                  "kill": f"level {KILL_LEVEL}, {KILL_TOKENS_FACTOR}x max_tokens per stream, SIGKILL of the last "
                          "stage worker of the first route; lost = no finish_reason, an error or a non-200 "
                          "answer; the gap is over streams with tokens before and after the kill"},
        "command": command,
    }


def print_report(report: dict, out=sys.stdout) -> None:
    prov = report["provenance"]
    print(f"# fleet {prov['fleet_file']} sha256:{prov['fleet_file_sha256']}; {prov['hardware']}; "
          f"model {prov['model_snapshot']}", file=out)
    print(f"{'layout':<40}{'conc':>5}{'tok/s':>10}{'predicted':>11}{'TTFT p50':>10}{'ITL p50':>10}", file=out)
    for layout in report["layouts"].values():
        for level, f in layout["measured"].items():
            predicted = layout["predicted_tok_s"].get(level, float("nan"))
            print(f"{layout['description']:<40}{level[1:]:>5}{f['output_tokens_per_s']:>10.1f}{predicted:>11.1f}"
                  f"{f['ttft_p50_s']:>10.3f}{f['itl_p50_s']:>10.3f}", file=out)
    print(f"chosen {report['chosen']} (prediction); planner_picked_faster {report['planner_picked_faster']} "
          f"(physical vs prediction)", file=out)
    for key in sorted(k for k in report if k.startswith("chosen_vs_best_")):
        print(f"{key} = {report[key]:.3f} (physical)", file=out)
    if "kill" in report:
        print(f"kill: {json.dumps(report['kill'])} (physical)", file=out)
