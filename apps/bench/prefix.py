"""`fornax bench prefix`: time to first token with prompt-prefix reuse off and on.

Two stage-worker processes serve the checkpoint as a 2-stage route; the serving core drives it
in this process (`--fleet FILE`: a netns fleet instead, `apps/bench/prefix_fleet.py`). Two
workloads, each run with the prefix cache off and then on (the stages' cache starts empty for
each: the workloads use disjoint token ids from separate seeds):
- chat: a conversation whose prompt is every earlier turn (prompt + reply) plus a new user
  message, `turns` turns growing to about `turns * turn_tokens` tokens;
- agent: `agent_calls` calls that each send one long shared system prompt plus a short call.

Every figure is a physical measurement of this host, one run; the ratios compare runs of the
same run. Greedy output is compared token for token between the two settings.
"""

from __future__ import annotations

import asyncio
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from apps.bench.serve import _start_workers
from libs.model.config import load_config
from libs.model.layout import even_layer_split
from libs.service.affinity import usable_cpus, worker_cpu_sets
from libs.service.host import cpu_name
from libs.text.context import TextContext
from services.orchestrator.config import serving_defaults
from services.orchestrator.engine.domain import GenerationRequest, SamplingParams
from services.orchestrator.engine.model_card import served_model
from services.orchestrator.engine.prefix_salt import PrefixPolicy, prefix_salt
from services.orchestrator.engine.serving import ServingEngine, build_engine
from services.orchestrator.route.direct_load import load_checkpoint_route
from services.orchestrator.route.route_pipeline import RoutePipeline
from services.orchestrator.route.stage_chain import Route


@dataclass(frozen=True)
class PrefixBenchOptions:
    checkpoint: str
    backend: str = "numpy"
    turns: int = 10
    turn_tokens: int = 200
    agent_system_tokens: int = 1500
    agent_call_tokens: int = 24
    agent_calls: int = 32
    max_tokens: int = 8


@dataclass(frozen=True)
class Turn:
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    output: tuple[int, ...]


async def _one(engine: ServingEngine, ids: tuple[int, ...], max_tokens: int, salt: bytes | None) -> Turn:
    request = GenerationRequest(str(uuid.uuid4()), ids, max_tokens, SamplingParams(temperature=0.0),
                                ignore_eos=True, prefix_salt=salt)
    started = time.perf_counter()
    first: float | None = None
    produced: list[int] = []
    cached = 0
    async for output in engine.submit(request):
        if output.token_ids and first is None:
            first = time.perf_counter()
        produced.extend(output.token_ids)
        cached = output.cached_tokens
    await engine.wait_idle()  # untimed: every stage has released the request's KV
    return Turn((first or float("nan")) - started, len(ids), cached, tuple(produced))


def _tokens(rng: np.random.Generator, vocab: int, count: int) -> tuple[int, ...]:
    return tuple(int(t) for t in rng.integers(3, vocab, size=count))


# One timed request: prompt ids in, its Turn out (the output as the next turn appends it).
Ask = Callable[[tuple[int, ...]], Awaitable[Turn]]


async def chat(ask: Ask, options: PrefixBenchOptions, vocab: int) -> list[Turn]:
    rng = np.random.default_rng(1)
    context: tuple[int, ...] = ()
    turns = []
    for _ in range(options.turns):
        prompt = context + _tokens(rng, vocab, options.turn_tokens)
        turn = await ask(prompt)
        turns.append(turn)
        context = prompt + turn.output
    return turns


async def agent(ask: Ask, options: PrefixBenchOptions, vocab: int) -> list[Turn]:
    rng = np.random.default_rng(2)
    system = _tokens(rng, vocab, options.agent_system_tokens)
    return [await ask(system + _tokens(rng, vocab, options.agent_call_tokens)) for _ in range(options.agent_calls)]


async def _engine(options: PrefixBenchOptions, workers: list[str], policy: PrefixPolicy) -> ServingEngine:
    cfg = load_config(options.checkpoint)
    plan = await asyncio.to_thread(load_checkpoint_route, workers, options.checkpoint, cfg.num_hidden_layers,
                                   backend=options.backend)
    route = Route(plan)
    await route.open()
    served = served_model(cfg, even_layer_split(cfg.num_hidden_layers, len(workers)), "bench")
    return build_engine(replace(serving_defaults(), prefix_cache=policy),
                        RoutePipeline(route, served), TextContext.from_checkpoint(options.checkpoint))


async def _measure(options: PrefixBenchOptions, workers: list[str]) -> dict[str, dict[str, list[Turn]]]:
    cfg = load_config(options.checkpoint)
    text = TextContext.from_checkpoint(options.checkpoint)
    runs: dict[str, dict[str, list[Turn]]] = {}
    for policy in (PrefixPolicy.OFF, PrefixPolicy.TENANT):
        # A fresh load per setting: the stages' caches start empty for both.
        engine = await _engine(options, workers, policy)
        salt = prefix_salt(policy, "bench", text.identity.tokenizer_sha256, "bench")
        def ask(ids: tuple[int, ...], engine: ServingEngine = engine, salt: bytes | None = salt) -> Awaitable[Turn]:
            return _one(engine, ids, options.max_tokens, salt)

        try:
            runs[policy.value] = {"chat": await chat(ask, options, cfg.vocab_size),
                                  "agent": await agent(ask, options, cfg.vocab_size)}
        finally:
            await engine.close()
    return runs


def _turns(turns: list[Turn]) -> list[dict[str, float | int]]:
    return [{"ttft_s": t.ttft_s, "prompt_tokens": t.prompt_tokens, "cached_tokens": t.cached_tokens}
            for t in turns]


def _hit_rate(turns: list[Turn]) -> float:
    return sum(t.cached_tokens for t in turns) / max(1, sum(t.prompt_tokens for t in turns))


def report(runs: dict[str, dict[str, list[Turn]]], command: str, backend: str, route: str = "") -> dict:
    off, on = runs["off"], runs["tenant"]
    same = all(a.output == b.output for kind in ("chat", "agent") for a, b in zip(off[kind], on[kind], strict=True))
    agent_off = statistics.fmean(t.ttft_s for t in off["agent"])
    agent_on = statistics.fmean(t.ttft_s for t in on["agent"])
    return {
        "evidence_class": "physical",
        "label": "measurements on this host, one run; ratios of runs of the same run, not predictions",
        "hardware": f"{cpu_name() or platform.machine()}, {len(usable_cpus())} usable CPUs",
        "backend": backend,
        "route": route or "2 stage-worker processes on loopback, serving core in the bench's process",
        "command": command,
        "chat": {"off": _turns(off["chat"]), "on": _turns(on["chat"]), "hit_rate_on": _hit_rate(on["chat"])},
        "agent": {"off_mean_ttft_s": agent_off, "on_mean_ttft_s": agent_on, "hit_rate_on": _hit_rate(on["agent"]),
                  "calls": len(on["agent"])},
        "greedy_outputs_identical": same,
        "cached_turn10_vs_turn1_ttft": on["chat"][-1].ttft_s / on["chat"][0].ttft_s,
        "uncached_vs_cached_turn10_ttft": off["chat"][-1].ttft_s / on["chat"][-1].ttft_s,
        "uncached_vs_cached_agent_ttft": agent_off / agent_on,
    }


def run(options: PrefixBenchOptions, command: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="fornax-bench-prefix-") as state:
        launcher = _start_workers(worker_cpu_sets(2, usable_cpus()), options.backend, Path(state),
                                  options.checkpoint)
        try:
            workers = [f"127.0.0.1:{s.ports['grpc']}" for s in launcher.started]
            runs = asyncio.run(_measure(options, workers))
        finally:
            launcher.stop_all()
    return report(runs, command, options.backend)
