"""`fornax bench serve`: the serving stack against transformers, side by side in one run.

Three setups on the same checkpoint: a 2-stage and a 1-stage pipeline of real stage-worker
processes (FNX2 hops, continuous batching through the orchestrator's serving core), and
Hugging Face transformers `generate`, batched. Each runs at concurrency 1, 8 and 32.
Every figure is a physical measurement on this host and says so.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import platform
import tempfile
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from apps.fleet.launcher import FleetOptions, Launcher, ServiceProcess
from libs.model.config import load_config
from libs.model.layout import even_layer_split
from libs.service.affinity import usable_cpus, worker_cpu_sets, worker_env
from libs.service.event_loop import EventLoopKind, describe
from libs.service.event_loop import run as run_on_loop
from libs.service.host import cpu_name
from libs.service.host_quota import quota_label
from libs.text.context import TextContext
from services.orchestrator.config import serving_defaults
from services.orchestrator.engine.domain import GenerationRequest, SamplingParams
from services.orchestrator.engine.model_card import served_model
from services.orchestrator.engine.serving import ServingEngine, build_engine
from services.orchestrator.route.direct_load import load_checkpoint_route
from services.orchestrator.route.route_pipeline import RoutePipeline
from services.orchestrator.route.stage_chain import Route

if TYPE_CHECKING:
    from apps.bench.llama_peer import LlamaPeerOptions

CONCURRENCY = (1, 8, 32)


@dataclass(frozen=True)
class BenchOptions:
    checkpoint: str
    prompt_tokens: int = 32
    max_tokens: int = 16
    backend: str = "numpy"
    concurrency: tuple[int, ...] = CONCURRENCY
    repeats: int = 2
    llama: LlamaPeerOptions | None = None  # --peer llama.cpp: measured beside the other setups
    loop: EventLoopKind = EventLoopKind.ASYNCIO  # the serving core's event loop (the harness's process)
    # --weights: a 1-stage route holding this policy's artifact, measured beside the float32 one
    weights: str = "fp32"


@dataclass(frozen=True)
class RunFigures:
    output_tokens: int
    wall_s: float
    ttft_s: list[float]
    itl_s: list[float]
    streams: tuple[tuple[int, ...], ...] = ()  # each request's generated token ids, where the setup gives them

    def summary(self) -> dict[str, float]:
        def pct(values: list[float], q: float) -> float:
            return float(np.percentile(values, q)) if values else float("nan")

        return {
            "output_tokens_per_s": self.output_tokens / self.wall_s,
            "ttft_p50_s": pct(self.ttft_s, 50), "ttft_p99_s": pct(self.ttft_s, 99),
            "itl_p50_s": pct(self.itl_s, 50), "itl_p99_s": pct(self.itl_s, 99),
            "output_tokens": self.output_tokens, "wall_s": self.wall_s,
        }


def prompts(vocab: int, count: int, length: int, seed: int = 0) -> list[tuple[int, ...]]:
    rng = np.random.default_rng(seed)
    return [tuple(int(t) for t in rng.integers(3, vocab, size=length)) for _ in range(count)]


async def _drive(engine: ServingEngine, prompt_ids: list[tuple[int, ...]], max_tokens: int) -> RunFigures:
    async def one(ids: tuple[int, ...]) -> tuple[int, float, list[float], tuple[int, ...]]:
        started = time.perf_counter()
        request = GenerationRequest(str(uuid.uuid4()), ids, max_tokens, SamplingParams(),
                                    ignore_eos=True)
        stamps: list[float] = []
        produced: list[int] = []
        async for output in engine.submit(request):
            if output.token_ids:
                stamps.append(time.perf_counter())
                produced.extend(output.token_ids)
        gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
        return len(produced), (stamps[0] - started) if stamps else float("nan"), gaps, tuple(produced)

    started = time.perf_counter()
    results = await asyncio.gather(*(one(ids) for ids in prompt_ids))
    wall = time.perf_counter() - started
    # Untimed: every stage releases the requests' KV before the next setup runs (transformers
    # blocks this loop, and a release still in flight then would outlive its time budget).
    await engine.wait_idle()
    return RunFigures(sum(r[0] for r in results), wall, [r[1] for r in results], [g for r in results for g in r[2]],
                      tuple(r[3] for r in results))


def _start_workers(cpu_sets: list[tuple[int, ...]], backend: str, state_dir: Path,
                   *read_roots: str) -> Launcher:
    # Loopback workers of this harness only, driven by its in-process clients: plaintext, explicitly.
    launcher = Launcher(FleetOptions(state_dir=state_dir, grace_period_s=5.0, insecure=True))
    group = [
        launcher.spawn(ServiceProcess(f"bench_worker_{i}", "stage_worker", "services.stage_worker",
                                      {**worker_env(cpus), "FORNAX_STAGE_INDEX": str(i), "FORNAX_BACKEND": backend,
                                       "FORNAX_READ_ROOTS": os.pathsep.join(str(Path(r).resolve())
                                                                            for r in read_roots)}))
        for i, cpus in enumerate(cpu_sets)
    ]
    launcher.wait_ready(group)
    return launcher


async def _engine(options: BenchOptions, workers: list[str], source: str | None = None) -> ServingEngine:
    """A route over `workers` loading `source` (the checkpoint, or a 1-stage policy artifact)."""
    cfg = load_config(options.checkpoint)
    plan = await asyncio.to_thread(load_checkpoint_route, workers, source or options.checkpoint,
                                   cfg.num_hidden_layers, backend=options.backend)
    route = Route(plan)
    await route.open()
    served = served_model(cfg, even_layer_split(cfg.num_hidden_layers, len(workers)), "bench")
    return build_engine(replace(serving_defaults(), max_live_requests=max(options.concurrency) * 2),
                        RoutePipeline(route, served), TextContext.from_checkpoint(options.checkpoint))


class _Transformers:
    """Batched greedy `generate`; TTFT is a one-token generate of the same batch."""

    def __init__(self, checkpoint: str):
        import torch
        from transformers import AutoModelForCausalLM

        self._torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()

    def run(self, prompt_ids: list[tuple[int, ...]], max_tokens: int) -> RunFigures:
        torch = self._torch
        ids = torch.tensor(prompt_ids, dtype=torch.long)
        mask = torch.ones_like(ids)
        with torch.inference_mode():
            started = time.perf_counter()
            self.model.generate(ids, attention_mask=mask, max_new_tokens=1, min_new_tokens=1, do_sample=False)
            ttft = time.perf_counter() - started
            started = time.perf_counter()
            out = self.model.generate(ids, attention_mask=mask, max_new_tokens=max_tokens,
                                      min_new_tokens=max_tokens, do_sample=False)
            wall = time.perf_counter() - started
        produced = int((out.shape[1] - ids.shape[1]) * ids.shape[0])
        itl = max(0.0, wall - ttft) / max(1, max_tokens - 1)
        return RunFigures(produced, wall, [ttft] * ids.shape[0], [itl])


async def _measure(options: BenchOptions, two: list[str], one: list[str],
                   llama_url: str | None = None, policy: PolicyStage | None = None) -> dict[str, dict]:
    """Every concurrency level runs the setups back to back, `repeats` times, best kept."""
    from apps.bench import llama_peer

    engines = {"pipeline_2_stage": await _engine(options, two), "pipeline_1_stage": await _engine(options, one)}
    if policy is not None:
        engines[f"pipeline_1_stage_{options.weights}"] = await _engine(options, [policy.worker], policy.artifact)
    hf = _Transformers(options.checkpoint)
    vocab = load_config(options.checkpoint).vocab_size
    peer = ["llama_cpp", "greedy_vs_llama_cpp"] if llama_url else []
    report: dict[str, dict] = {name: {} for name in (*engines, "transformers", *peer)}
    try:
        warm = prompts(vocab, 1, options.prompt_tokens, seed=99)
        for engine in engines.values():
            await _drive(engine, warm, 2)
        if llama_url:
            await llama_peer.drive(llama_url, warm, 2)
        for c in options.concurrency:
            batch = prompts(vocab, c, options.prompt_tokens, seed=c)
            best = await _best_of_repeats(options, engines, hf, batch, llama_url)
            for name, figures in best.items():
                report[name][f"c{c}"] = figures.summary()
            if llama_url:
                peer_ids = await llama_peer.greedy_token_ids(llama_url, batch, options.max_tokens)
                # the route in the GGUF's quantization when there is one: the same weights' streams
                ours = f"pipeline_1_stage_{options.weights}" if policy is not None else "pipeline_1_stage"
                report["greedy_vs_llama_cpp"][f"c{c}"] = {
                    "fornax_setup": ours, **llama_peer.greedy_agreement(list(best[ours].streams), peer_ids)}
    finally:
        for engine in engines.values():
            await engine.close()
    return report


async def _best_of_repeats(options: BenchOptions, engines: dict[str, ServingEngine], hf: _Transformers,
                           batch: list[tuple[int, ...]], llama_url: str | None) -> dict[str, RunFigures]:
    """One level's setups run back to back, `repeats` times; each setup's best run."""
    from apps.bench import llama_peer

    best: dict[str, RunFigures] = {}
    for _ in range(options.repeats):
        for name, engine in engines.items():
            _keep_best(best, name, await _drive(engine, batch, options.max_tokens))
        _keep_best(best, "transformers", hf.run(batch, options.max_tokens))
        if llama_url:
            _keep_best(best, "llama_cpp", (await llama_peer.drive(llama_url, batch, options.max_tokens))[0])
    return best


def _keep_best(best: dict[str, RunFigures], name: str, run: RunFigures) -> None:
    if name not in best or run.output_tokens / run.wall_s > best[name].output_tokens / best[name].wall_s:
        best[name] = run


@dataclass(frozen=True)
class PolicyStage:
    worker: str      # the worker that loads the policy's 1-stage artifact
    artifact: str    # that artifact's directory
    weight_bytes: int


def measure(options: BenchOptions) -> dict[str, dict]:
    cpus = usable_cpus()
    two_sets = worker_cpu_sets(2, cpus)
    with tempfile.TemporaryDirectory(prefix="fornax-bench-") as state:
        artifact = _policy_artifact(options, Path(state)) if options.weights != "fp32" else None
        roots = [options.checkpoint] + ([str(artifact[0])] if artifact else [])
        # Workers 0-1 form the 2-stage pipeline on disjoint CPU shares; worker 2 alone has them all
        # (and worker 3, which loads the policy's artifact, when --weights asks for one).
        shares = [*two_sets, cpus] + ([cpus] if artifact else [])
        launcher = _start_workers(shares, options.backend, Path(state), *roots)
        try:
            workers = [f"127.0.0.1:{s.ports['grpc']}" for s in launcher.started]
            policy = PolicyStage(workers[3], str(artifact[0]), artifact[1]) if artifact else None
            if options.llama is None:
                report = run_on_loop(_measure(options, workers[:2], workers[2:3], None, policy), options.loop)
            else:
                from apps.bench.llama_peer import LlamaServer

                # The peer gets what the 1-stage worker gets: every usable CPU, one thread each.
                with LlamaServer(options.llama, cpus) as peer:
                    report = run_on_loop(_measure(options, workers[:2], workers[2:3], peer.base_url, policy),
                                         options.loop)
            if policy is not None:
                report["resident"] = resident_report(launcher.started[3].process.pid, policy.weight_bytes)
            return report
        finally:
            launcher.stop_all()


def _policy_artifact(options: BenchOptions, state: Path) -> tuple[Path, int]:
    """A 1-stage artifact of the checkpoint in the policy, held as the bench's backend runs it."""
    from libs.common.kinds import DType
    from services.artifact_builder.build import BuildOptions, BuildResult, build_stage_artifacts
    from services.artifact_builder.snapshot import inspect_checkpoint
    from services.artifact_builder.staging import plan_from_ranges

    inspection = inspect_checkpoint(options.checkpoint, "bench", "")
    plan = plan_from_ranges(((0, inspection.config.num_hidden_layers),))
    build = BuildOptions(state / "artifacts", DType.FP32, weights_policy=options.weights,
                         stage_backends=(options.backend,))
    result = [e for e in build_stage_artifacts(inspection, plan, build) if isinstance(e, BuildResult)][0]
    return result.stages[0].artifact_dir, result.stages[0].weight_bytes


def resident_report(pid: int, weight_bytes: int) -> dict[str, object]:
    """The policy worker's resident memory against its artifact's bytes plus its KV reserve
    (`resident_vs_artifact`; the target is <= 1.15)."""
    from services.stage_worker.config import StageWorkerConfig

    kv_reserve = StageWorkerConfig.kv_limit_bytes
    rss = _rss_bytes(pid)
    return {"rss_bytes": rss, "artifact_bytes": weight_bytes, "kv_reserve_bytes": kv_reserve,
            "resident_vs_artifact": rss / (weight_bytes + kv_reserve),
            "figure": "physical: VmRSS of the policy's stage worker after the run, this host"}


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def provenance(options: BenchOptions, command: str) -> dict[str, str]:
    from importlib import metadata

    config = Path(options.checkpoint, "config.json").read_bytes()
    return {
        "evidence_class": "physical",
        "label": "measurements on this host, one run, side by side; not predictions",
        "hardware": f"{cpu_name() or platform.machine()}, {len(usable_cpus())} usable CPUs",
        "backend": options.backend,
        "weights": options.weights,
        "backend_build": f"{options.backend} {metadata.version('max' if options.backend == 'max' else 'numpy')}",
        "transformers_build": f"transformers {metadata.version('transformers')}, torch {metadata.version('torch')}",
        "model_snapshot": "sha256:" + hashlib.sha256(config).hexdigest(),
        "quota": quota_label(),
        "serving_event_loop": describe(options.loop),
        "command": command,
        **({"peer_llama_cpp": peer_provenance(options.llama)} if options.llama else {}),
    }


def _file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def peer_provenance(llama: LlamaPeerOptions) -> str:
    return (f"llama-server {llama.server} ({_file_sha256(llama.server)}), GGUF {llama.gguf} "
            f"({_file_sha256(llama.gguf)}), {llama.threads} threads, {llama.slots} slots, "
            f"same prompt token ids, greedy, ignore_eos")


def run(options: BenchOptions, command: str) -> dict:
    report = measure(options)
    two, one, hf = report["pipeline_2_stage"], report["pipeline_1_stage"], report["transformers"]
    ratios = {}
    for c in options.concurrency:
        key = f"c{c}"
        ratios[f"two_vs_one_stage_{key}"] = two[key]["output_tokens_per_s"] / one[key]["output_tokens_per_s"]
        ratios[f"pipeline_vs_transformers_{key}"] = two[key]["output_tokens_per_s"] / hf[key]["output_tokens_per_s"]
        ratios[f"one_stage_vs_transformers_{key}"] = one[key]["output_tokens_per_s"] / hf[key]["output_tokens_per_s"]
        policy = report.get(f"pipeline_1_stage_{options.weights}")
        if policy is not None:
            ratios[f"vs_fp32_{key}"] = policy[key]["output_tokens_per_s"] / one[key]["output_tokens_per_s"]
        if "llama_cpp" in report:
            peer = report["llama_cpp"][key]["output_tokens_per_s"]
            ours = (policy or one)[key]["output_tokens_per_s"]
            ratios[f"vs_llama_cpp_{key}"] = ours / peer
    return {**ratios, **report,
            "setup": {"prompt_tokens": options.prompt_tokens, "max_tokens": options.max_tokens,
                      "repeats": options.repeats, "figure": "best of the repeats, setups interleaved"},
            "provenance": provenance(options, command)}
