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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from libs.fleet.launcher import FleetOptions, Launcher, ServiceProcess
from libs.gateway.loading import even_ranges, load_checkpoint_route
from libs.gateway.route import Route
from libs.model.config import load_config
from libs.text.context import TextContext
from services.orchestrator.domain import GenerationRequest, SamplingParams
from services.orchestrator.model_card import served_model
from services.orchestrator.route_pipeline import RoutePipeline
from services.orchestrator.serving import ServingConfig, ServingEngine

CONCURRENCY = (1, 8, 32)


@dataclass(frozen=True)
class BenchOptions:
    checkpoint: str
    prompt_tokens: int = 32
    max_tokens: int = 16
    backend: str = "numpy"
    concurrency: tuple[int, ...] = CONCURRENCY


@dataclass(frozen=True)
class RunFigures:
    output_tokens: int
    wall_s: float
    ttft_s: list[float]
    itl_s: list[float]

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
    async def one(ids: tuple[int, ...]) -> tuple[int, float, list[float]]:
        started = time.perf_counter()
        request = GenerationRequest(str(uuid.uuid4()), ids, max_tokens, SamplingParams())
        stamps, count = [], 0
        async for output in engine.submit(request):
            if output.token_ids:
                stamps.append(time.perf_counter())
                count += len(output.token_ids)
        gaps = [b - a for a, b in zip(stamps, stamps[1:])]
        return count, (stamps[0] - started) if stamps else float("nan"), gaps

    started = time.perf_counter()
    results = await asyncio.gather(*(one(ids) for ids in prompt_ids))
    wall = time.perf_counter() - started
    return RunFigures(sum(r[0] for r in results), wall, [r[1] for r in results], [g for r in results for g in r[2]])


def _start_workers(count: int, backend: str, state_dir: Path) -> Launcher:
    launcher = Launcher(FleetOptions(state_dir=state_dir, grace_period_s=5.0))
    group = [
        launcher.spawn(ServiceProcess(f"bench_stage_{i}", "stage_worker", "services.stage_worker",
                                      {"FORNAX_STAGE_INDEX": str(i), "FORNAX_BACKEND": backend}))
        for i in range(count)
    ]
    launcher.wait_ready(group)
    return launcher


async def _pipeline_runs(options: BenchOptions, stages: int, workers: list[str]) -> dict[str, dict]:
    cfg = load_config(options.checkpoint)
    plan = load_checkpoint_route(workers, options.checkpoint, cfg.num_hidden_layers, backend=options.backend)
    route = Route(plan)
    await route.open()
    served = served_model(cfg, even_ranges(cfg.num_hidden_layers, stages), "bench")
    engine = ServingEngine(RoutePipeline(route, served), served, TextContext.from_checkpoint(options.checkpoint),
                           ServingConfig(max_live_requests=max(options.concurrency) * 2))
    figures = {}
    try:
        for c in options.concurrency:
            batch = prompts(cfg.vocab_size, c, options.prompt_tokens, seed=c)
            figures[f"c{c}"] = (await _drive(engine, batch, options.max_tokens)).summary()
    finally:
        await engine.close()
    return figures


def pipeline_figures(options: BenchOptions, stages: int) -> dict[str, dict]:
    with tempfile.TemporaryDirectory(prefix="fornax-bench-") as state:
        launcher = _start_workers(stages, options.backend, Path(state))
        try:
            workers = [f"127.0.0.1:{s.ports['grpc']}" for s in launcher.started]
            return asyncio.run(_pipeline_runs(options, stages, workers))
        finally:
            launcher.stop_all()


def transformers_figures(options: BenchOptions) -> dict[str, dict]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(options.checkpoint, torch_dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    figures = {}
    with torch.inference_mode():
        for c in options.concurrency:
            ids = torch.tensor(prompts(vocab, c, options.prompt_tokens, seed=c), dtype=torch.long)
            mask = torch.ones_like(ids)
            started = time.perf_counter()
            model.generate(ids, attention_mask=mask, max_new_tokens=1, min_new_tokens=1, do_sample=False)
            ttft = time.perf_counter() - started
            started = time.perf_counter()
            out = model.generate(ids, attention_mask=mask, max_new_tokens=options.max_tokens,
                                 min_new_tokens=options.max_tokens, do_sample=False)
            wall = time.perf_counter() - started
            produced = int((out.shape[1] - ids.shape[1]) * c)
            itl = max(0.0, wall - ttft) / max(1, options.max_tokens - 1)
            figures[f"c{c}"] = RunFigures(produced, wall, [ttft] * c, [itl]).summary()
    return figures


def provenance(options: BenchOptions, command: str) -> dict[str, str]:
    from importlib import metadata

    config = Path(options.checkpoint, "config.json").read_bytes()
    return {
        "evidence_class": "physical",
        "label": "measurements on this host, one run, side by side; not predictions",
        "hardware": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "backend": options.backend,
        "backend_build": f"{options.backend} {metadata.version('max' if options.backend == 'max' else 'numpy')}",
        "transformers_build": f"transformers {metadata.version('transformers')}, torch {metadata.version('torch')}",
        "model_snapshot": "sha256:" + hashlib.sha256(config).hexdigest(),
        "command": command,
    }


def run(options: BenchOptions, command: str) -> dict:
    two = pipeline_figures(options, 2)
    one = pipeline_figures(options, 1)
    hf = transformers_figures(options)
    ratios = {}
    for c in options.concurrency:
        key = f"c{c}"
        ratios[f"two_vs_one_stage_{key}"] = two[key]["output_tokens_per_s"] / one[key]["output_tokens_per_s"]
        ratios[f"pipeline_vs_transformers_{key}"] = two[key]["output_tokens_per_s"] / hf[key]["output_tokens_per_s"]
    return {**ratios, "pipeline_2_stage": two, "pipeline_1_stage": one, "transformers": hf,
            "setup": {"prompt_tokens": options.prompt_tokens, "max_tokens": options.max_tokens},
            "provenance": provenance(options, command)}
