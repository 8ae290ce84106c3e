"""`fornax bench serve --fleet FILE`: the served route of a netns fleet, measured from outside.

The fleet comes up exactly as `fornax up --fleet` brings it up (namespaces, cgroup quotas,
shaped links), and a client in the root namespace streams completions over HTTP at each
concurrency level. Per level it reports tokens/s, TTFT and ITL p50/p99; per hop the boundary
payload bytes per token (each stage's FNX2 counter) and the bytes per token on each host's link
(its veth counters: every flow on that link); per stage the compute, device-queue and exposed
wait (wall time the stage spent with no batch to run). Every figure is a physical measurement
of this host, tagged with the fleet file's sha256.

Each stream asks for exactly `max_tokens` (`ignore_eos`) and counts what the response's usage
says it generated. `--weights` builds every stage host whose `weights:` the file leaves unset in
that policy, as `fornax up --fleet --weights` does. Per host the bench reports its memory against
its `memory_limit` over the measured window (`apps.bench.host_memory`); with `--peer llama.cpp`,
llama.cpp's `llama-server` runs on the whole box after the fleet is down, on the same prompts
(`apps.bench.fleet_peer`).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from apps.bench.agreement import served_greedy_ids, top1_agreement
from apps.bench.host_memory import HostMemoryWatch, memory_cgroup_dirs
from apps.bench.pipeline_efficiency import StageWindow, pipeline_efficiency
from apps.bench.serve import RunFigures, prompts
from apps.fleet.backend_report import fetch_board
from apps.fleet.isolated import start_isolated_fleet
from apps.fleet.launcher import FleetOptions
from apps.fleet.netns import read_record, tear_down
from apps.fleet.route_wait import wait_for_route
from apps.fleet.spec import FleetSpec
from libs.model.config import load_config
from libs.service.fleet_state import FleetState

if TYPE_CHECKING:
    from apps.bench.llama_peer import LlamaPeerOptions

# Prometheus samples (histogram sums, counter totals) read from each stage worker.
STAGE_COUNTERS = {"fornax_stage_compute_seconds_sum": "compute_s", "fornax_stage_queue_seconds_sum": "queue_s",
                  "fornax_fnx2_boundary_bytes_total": "boundary_bytes"}


@dataclass(frozen=True)
class FleetBenchOptions:
    fleet_file: str
    spec: FleetSpec
    checkpoint: str
    prompt_tokens: int = 32
    max_tokens: int = 16
    concurrency: tuple[int, ...] = (1, 8, 32)
    install_timeout_s: float = 3600.0
    agreement_prompts: int = 4
    weights: str = "fp32"  # every stage host whose `weights:` the file leaves unset
    llama: LlamaPeerOptions | None = None  # --peer llama.cpp: run on the whole box after the fleet


class FleetBenchRefused(ValueError):
    """The options cannot run; `reason` is a stable code. Raised before anything starts."""

    def __init__(self, reason: str, message: str):
        super().__init__(f"{reason}: {message}")
        self.reason = reason


def check_options(options: FleetBenchOptions) -> None:
    """What `run_fleet_bench` refuses, before a fleet or a peer starts."""
    from libs.weights.policy import POLICIES

    if options.weights not in POLICIES:
        raise FleetBenchRefused("UNKNOWN_WEIGHT_POLICY", f"--weights {options.weights!r} is not one of "
                                                         f"{', '.join(POLICIES)}")
    if not Path(options.checkpoint, "config.json").is_file():
        raise FleetBenchRefused("FLEET_BENCH_NEEDS_CHECKPOINT_DIR",
                                f"--checkpoint {options.checkpoint!r} is not a checkpoint directory with a "
                                "config.json (a GGUF serves with `fornax up --fleet`; this bench's agreement "
                                "reference is transformers on the checkpoint)")


def host_weights(options: FleetBenchOptions) -> dict[str, dict[str, str]]:
    """Each stage host's weight policy and where it comes from, with `fornax up --fleet`'s
    precedence: the host's `weights:` in the file, else --weights."""
    return {h.name: {"policy": h.weights or options.weights,
                     "from": "the fleet file's weights:" if h.weights else f"--weights {options.weights}"}
            for h in options.spec.stage_hosts}


async def _stream_one(session: aiohttp.ClientSession, api: str, ids: tuple[int, ...],
                      max_tokens: int) -> tuple[int, float, list[float]]:
    # As llama.cpp's peer is driven: exactly max_tokens each, counted from the usage chunk.
    body = {"model": "fornax", "prompt": list(ids), "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    started, stamps, usage_tokens = time.perf_counter(), [], None
    async with session.post(f"{api}/completions", json=body) as response:
        response.raise_for_status()
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage_tokens = int(chunk["usage"].get("completion_tokens", 0))
            if chunk.get("choices"):
                stamps.append(time.perf_counter())
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    count = usage_tokens if usage_tokens is not None else len(stamps)
    return count, (stamps[0] - started) if stamps else float("nan"), gaps


async def _drive(api: str, batch: list[tuple[int, ...]], max_tokens: int,
                 tls: ssl.SSLContext | None = None) -> RunFigures:
    timeout = aiohttp.ClientTimeout(total=3600)
    connector = aiohttp.TCPConnector(ssl=tls if tls is not None else True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        started = time.perf_counter()
        results = await asyncio.gather(*(_stream_one(session, api, ids, max_tokens) for ids in batch))
        wall = time.perf_counter() - started
    return RunFigures(sum(r[0] for r in results), wall, [r[1] for r in results], [g for r in results for g in r[2]])


async def _stage_counters(state: FleetState) -> dict[str, dict[str, Any]]:
    """Per route stage ("stage-0", ...: the label every stage worker puts on its data-plane
    metrics), the summed counters of STAGE_COUNTERS and the worker serving it."""
    out: dict[str, dict[str, Any]] = {}  # per stage: counters, and the worker's name
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        for service in (s for s in state.services if s.kind == "stage_worker"):
            async with session.get(f"http://{service.metrics}/metrics") as response:
                text = await response.text()
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    name, stage = STAGE_COUNTERS.get(sample.name), sample.labels.get("stage")
                    if name and stage:
                        values = out.setdefault(stage, {**dict.fromkeys(STAGE_COUNTERS.values(), 0.0),
                                                        "worker": service.name})
                        values[name] += sample.value
    return out


def _stage_occupancy(state: FleetState, state_dir: Path) -> dict[str, tuple[int, int, int]]:
    """Per stage worker (by name), its cumulative (busy, credit wait, input wait) ns from GetHealth."""
    from fornax.stage_worker.v1 import stage_worker_pb2 as pb
    from fornax.stage_worker.v1 import stage_worker_pb2_grpc as pb_grpc
    from libs.security.cli_credentials import cli_channel
    from libs.service.channels import open_channel

    out = {}
    for service in (s for s in state.services if s.kind == "stage_worker"):
        with open_channel(service.grpc, cli_channel(state_dir)) as channel:
            t = pb_grpc.StageWorkerServiceStub(channel).GetHealth(pb.GetHealthRequest(), timeout=30).phase_totals
        out[service.name] = (t.busy_ns, t.credit_wait_ns, t.input_wait_ns)
    return out


def _link_counters(links: list[str]) -> dict[str, tuple[int, int]]:
    """(bytes out of the host, bytes into it) per root-side veth."""
    def read(link: str, name: str) -> int:
        return int(Path(f"/sys/class/net/{link}/statistics/{name}").read_text())

    return {link: (read(link, "rx_bytes"), read(link, "tx_bytes")) for link in links}


def _level_report(figures: RunFigures, stages_before, stages_after,
                  links_before, links_after, host_links: dict[str, str],
                  occupancy_before: dict[str, tuple[int, int, int]] | None = None,
                  occupancy_after: dict[str, tuple[int, int, int]] | None = None) -> dict:
    tokens = max(1, figures.output_tokens)
    stage_names = sorted(stages_after, key=lambda name: int(name.rsplit("-", 1)[1]))
    stages, windows = {}, {}
    for name in stage_names:
        delta = {k: stages_after[name][k] - stages_before.get(name, {}).get(k, 0.0) for k in STAGE_COUNTERS.values()}
        worker = stages_after[name]["worker"]
        if occupancy_before is not None and occupancy_after is not None and worker in occupancy_after:
            before = occupancy_before.get(worker, (0, 0, 0))
            busy, credit, idle = (max(0, a - b) / 1e9 for a, b in zip(occupancy_after[worker], before, strict=True))
            windows[name] = StageWindow(busy, credit, idle)
        stages[name] = {"worker": worker, "compute_s": delta["compute_s"],
                        "compute_fraction": delta["compute_s"] / figures.wall_s,
                        **({"busy_s": windows[name].busy_s, **windows[name].fractions()} if name in windows else {}),
                        "device_queue_s": delta["queue_s"],
                        "exposed_wait_s": max(0.0, figures.wall_s - delta["compute_s"]),
                        "exposed_wait_fraction": max(0.0, 1 - delta["compute_s"] / figures.wall_s),
                        "boundary_bytes": delta["boundary_bytes"]}
    hops = {f"hop_{i}": {"from": stage_names[i], "to": stage_names[i + 1],
                         "boundary_payload_bytes_per_token": stages[stage_names[i]]["boundary_bytes"] / tokens}
            for i in range(len(stage_names) - 1)}
    links = {host: {"bytes_out_per_token": (links_after[link][0] - links_before[link][0]) / tokens,
                    "bytes_in_per_token": (links_after[link][1] - links_before[link][1]) / tokens}
             for host, link in host_links.items()}
    pipeline = pipeline_efficiency(figures.output_tokens, figures.wall_s, windows) \
        if windows and figures.output_tokens > 0 else None
    return {**figures.summary(), "stages": stages, "hops": hops, "host_links": links, "pipeline": pipeline}


async def _measure(options: FleetBenchOptions, state: FleetState, host_links: dict[str, str],
                   state_dir: Path) -> dict:
    vocab = load_config(options.checkpoint).vocab_size  # the harness's own copy, for prompt ids only
    api = state.api
    if api is None:
        raise RuntimeError("the fleet publishes no HTTP API")
    tls = state.api_ssl_context()  # https with the fleet CA on a netns fleet
    await _drive(api, prompts(vocab, 1, options.prompt_tokens, seed=99), 2, tls)  # warm
    report = {}
    for c in options.concurrency:
        batch = prompts(vocab, c, options.prompt_tokens, seed=c)
        stages_before, links_before = await _stage_counters(state), _link_counters(list(host_links.values()))
        occupancy_before = await asyncio.to_thread(_stage_occupancy, state, state_dir)
        figures = await _drive(api, batch, options.max_tokens, tls)
        occupancy_after = await asyncio.to_thread(_stage_occupancy, state, state_dir)
        stages_after, links_after = await _stage_counters(state), _link_counters(list(host_links.values()))
        report[f"c{c}"] = _level_report(figures, stages_before, stages_after, links_before, links_after,
                                        host_links, occupancy_before, occupancy_after)
        print(f"  c{c}: {json.dumps({k: report[f'c{c}'][k] for k in ('output_tokens_per_s', 'pipeline')})}",
              file=sys.stderr)
    return report


def run_fleet_bench(options: FleetBenchOptions, command: str) -> dict:
    check_options(options)
    with tempfile.TemporaryDirectory(prefix="fornax-fleet-bench-") as scratch:
        state_dir = Path(scratch) / ".fornax"
        fleet = FleetOptions(state_dir=state_dir, checkpoint=options.checkpoint, startup_timeout_s=600,
                             weights=options.weights)
        state, launcher = start_isolated_fleet(fleet, options.spec)
        try:
            wait_for_route(state, options.install_timeout_s, lambda m: print(f"  {m}", file=sys.stderr))
            record = read_record(state_dir)
            if record is None:
                raise RuntimeError(f"the fleet in {state_dir} left no host record")
            host_links = {host.name: link for host, link in zip(options.spec.hosts, record.links[1:], strict=False)}
            board = fetch_board(state) or {}  # what the route serves: each stage's weight policy
            watch = _memory_watch(options, state, record.cgroup_dirs)
            watch.start()
            levels = asyncio.run(_measure(options, state, host_links, state_dir))
            fleet_ids = _fleet_greedy_ids(options, state, state_dir) if options.llama else {}
            agreement = _agreement(options, state, state_dir)
            memory = watch.finish()
        finally:
            launcher.stop_all()
            tear_down(state_dir)
    peer = _peer(options, levels, fleet_ids) if options.llama else {}
    provenance = {**_provenance(options, command), "served_stage_weights": board.get("stage_weights")}
    return fleet_report(levels, agreement, memory, peer, provenance)


def fleet_report(levels: dict[str, dict], agreement: dict, memory: dict[str, dict], peer: dict,
                 provenance: dict) -> dict:
    """The report from what was measured: the levels and their pipeline efficiencies, each host's
    memory and its `peak_rss_vs_limit`, the peer's part (`fleet_peer.peer_report`) when it ran."""
    efficiency = {f"pipeline_efficiency_{level}": figures["pipeline"]["pipeline_efficiency"]
                  for level, figures in levels.items() if figures.get("pipeline")}
    return {**efficiency, "levels": levels, "agreement": agreement, "hosts_memory": memory,
            "peak_rss_vs_limit": {host: m["peak_rss_vs_limit"] for host, m in memory.items()},
            **peer, "provenance": provenance}


def _memory_watch(options: FleetBenchOptions, state: FleetState, cgroup_dirs: tuple[str, ...]) -> HostMemoryWatch:
    """Every host against its limit; stage host i runs `stage_worker_i` (apps.fleet.netns_compose)."""
    pids = {s.name: s.pid for s in state.services if s.kind == "stage_worker"}
    workers = {h.name: pids[f"stage_worker_{i}"] for i, h in enumerate(options.spec.stage_hosts)
               if f"stage_worker_{i}" in pids}
    hosts = [h.name for h in options.spec.hosts]
    return HostMemoryWatch({h.name: h.memory_limit_bytes for h in options.spec.hosts},
                           memory_cgroup_dirs(cgroup_dirs, hosts), workers)


def _fleet_greedy_ids(options: FleetBenchOptions, state: FleetState,
                      state_dir: Path) -> dict[str, list[tuple[int, ...]]]:
    """Each level's greedy ids from the fleet (untimed), to compare with the peer's."""
    from libs.security.cli_credentials import cli_channel

    vocab = load_config(options.checkpoint).vocab_size
    return {f"c{c}": served_greedy_ids(state.entry("orchestrator").grpc,
                                       prompts(vocab, c, options.prompt_tokens, seed=c), options.max_tokens,
                                       cli_channel(state_dir))
            for c in options.concurrency}


def _peer(options: FleetBenchOptions, levels: dict[str, dict], fleet_ids: dict[str, list[tuple[int, ...]]]) -> dict:
    """llama.cpp on the whole box, the fleet gone: its figures, the ratios and the greedy agreement."""
    from apps.bench.fleet_peer import PeerRun, peer_report, run_peer
    from apps.bench.llama_peer import PeerError
    from apps.bench.serve import peer_provenance
    from libs.service.affinity import usable_cpus

    assert options.llama is not None
    cpus = usable_cpus()
    run = PeerRun(options.llama, load_config(options.checkpoint).vocab_size, options.prompt_tokens,
                  options.max_tokens, options.concurrency)
    print(f"  llama.cpp on the whole box: {len(cpus)} CPUs, {options.llama.threads} threads", file=sys.stderr)
    provenance = f"{peer_provenance(options.llama)}; on the whole box: CPUs {list(cpus)}, after the fleet was down"
    try:
        peer_levels, peer_ids = run_peer(run, cpus)
    except PeerError as exc:  # the fleet's figures, measured already, are kept and the failure stated
        return {"llama_cpp": None, "peer_error": {"reason": exc.reason, "message": str(exc)},
                "peer_provenance": provenance}
    return peer_report(levels, peer_levels, fleet_ids, peer_ids, provenance)


def _agreement(options: FleetBenchOptions, state: FleetState, state_dir: Path) -> dict:
    """Teacher-forced top-1 agreement with transformers fp32, at this fleet's hop dtypes; skipped
    with the reason when the float32 reference would not fit the memory this box has left."""
    from libs.security.cli_credentials import cli_channel
    from libs.service.host import host_facts
    from services.planner.model import describe_checkpoint

    hops = [d.value for d in options.spec.hop_dtypes]
    refusal = reference_refusal(describe_checkpoint(options.checkpoint, "fp32").total_weight_bytes,
                                host_facts().memory_available_bytes)
    if refusal:
        return {"top1_agreement": None, "reason": refusal, "hop_boundary_dtypes": hops}
    vocab = load_config(options.checkpoint).vocab_size
    batch = [list(p) for p in prompts(vocab, options.agreement_prompts, 8, seed=7)]
    figure = top1_agreement(options.checkpoint, state.entry("orchestrator").grpc, batch, options.max_tokens,
                            cli_channel(state_dir))
    return {**figure, "hop_boundary_dtypes": hops}


# transformers holds the float32 weights plus its own working memory; keep room beside them.
REFERENCE_HEADROOM = 1.25


def reference_refusal(fp32_weight_bytes: int, available_bytes: int) -> str | None:
    """Why the transformers float32 reference cannot run here (None: it fits)."""
    needed = int(fp32_weight_bytes * REFERENCE_HEADROOM)
    if needed <= available_bytes:
        return None
    return (f"REFERENCE_DOES_NOT_FIT: transformers float32 needs about {needed / 2**30:.1f} GiB "
            f"({fp32_weight_bytes / 2**30:.1f} GiB of weights x {REFERENCE_HEADROOM}), this box has "
            f"{available_bytes / 2**30:.1f} GiB available with the fleet up; use `fornax parity` (layer by layer)")


def _provenance(options: FleetBenchOptions, command: str) -> dict:
    from libs.service.host import backend_build, cpu_name

    return {
        "evidence_class": "physical",
        "label": "measurements on this host of a netns fleet (real namespaces, cgroup quotas, tbf-shaped links); "
                 "not predictions",
        "fleet_file": options.fleet_file,
        "fleet_file_sha256": options.spec.file_sha256,
        "hosts": {h.name: {"backend": h.backend.value, "backend_build": backend_build(h.backend.value),
                           "cpu_cores": h.cpu_cores, "memory_limit_bytes": h.memory_limit_bytes,
                           "link_bits_per_s": h.link.rate_bits_per_s, "clock_offset_s": h.clock_offset_s}
                  for h in options.spec.hosts},
        "weights": host_weights(options),
        "hardware": cpu_name(),
        "model_snapshot": _snapshot(options.checkpoint),
        "setup": {"prompt_tokens": options.prompt_tokens, "max_tokens": options.max_tokens,
                  "streams": "greedy, ignore_eos (exactly max_tokens each), output tokens from the usage chunk",
                  "compute_fraction": "the stage's compute seconds ÷ the level's wall seconds",
                  "host_memory": "apps/bench/host_memory.py: the host cgroup's peak (v1 reset when the first "
                                 "level starts) and the stage worker's sampled RssAnon, each ÷ memory_limit; "
                                 "the window runs from the first level to the end of the agreement run",
                  "host_links": "root-side veth counters: every flow on the host's link (FNX2, gRPC, HTTP)",
                  "hops": "boundary tensor payload bytes from each stage's FNX2 counter",
                  "exposed_wait": "level wall time minus the stage's compute time",
                  "stage_fractions": "each stage's own wall time over the level: busy (a batch being worked "
                                     "on), credit wait (idle with a batch at the next hop), input wait "
                                     "(idle, nothing to do); from GetHealth",
                  "pipeline_efficiency": "pipeline tokens/s ÷ the slowest stage's tokens/s alone, where alone "
                                         "= output tokens ÷ that stage's busy seconds on the same microbatches "
                                         "(apps/bench/pipeline_efficiency.py)"},
        "command": command,
    }


def _snapshot(checkpoint: str) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(Path(checkpoint, "config.json").read_bytes()).hexdigest()
