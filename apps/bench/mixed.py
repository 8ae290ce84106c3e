"""`fornax bench serve --mixed`: inter-token latency of running streams while long prompts
keep arriving, with and without chunked prefill under a per-step token budget.

32 streams decode; in the mixed runs 512-token prompts arrive back to back (two in flight,
each asking for one token, so the decode population stays at 32). ITL p99 is taken over
the decode streams' token gaps once all of them decode. Each scheduler setting runs
"plain" (no arrivals) and "mixed" side by side in one process, on the serving core over an
in-process 1-stage pipeline of the chosen backend (no FNX2 hop: the comparison is about
scheduling). Every figure is a physical measurement of this host and says so.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from libs.common.kinds import Backend
from libs.text.context import TextContext
from services.orchestrator.config import serving_defaults
from services.orchestrator.engine.domain import GenerationRequest, SamplingParams, SchedulerConfig
from services.orchestrator.engine.serving import ServingEngine, build_engine
from services.orchestrator.route.inprocess_pipeline import InProcessPipeline, InProcessRouteConfig


@dataclass(frozen=True)
class MixedOptions:
    checkpoint: str
    backend: str = "numpy"
    streams: int = 32
    stream_prompt_tokens: int = 32
    decode_tokens: int = 48
    arrival_prompt_tokens: int = 512
    arrivals_in_flight: int = 2
    # 32 decode rows plus a 16-token chunk: on the numpy backend a chunk of this size costs
    # about one decode step, which bounds the mixed ITL near twice the plain one.
    tokens_per_step: int = 48
    min_prefill_chunk_tokens: int = 16
    inflight_microbatches: int = 2


def _prompt(vocab: int, length: int, rng: np.random.Generator) -> tuple[int, ...]:
    return tuple(int(t) for t in rng.integers(3, vocab, size=length))


async def _decode_stream(engine: ServingEngine, ids: tuple[int, ...], max_tokens: int,
                         decoding: asyncio.Event, counter: list[int], total: int) -> list[float]:
    """Token timestamps of one stream; sets `decoding` once every stream has a token."""
    request = GenerationRequest(str(uuid.uuid4()), ids, max_tokens, SamplingParams(),
                                ignore_eos=True)
    stamps: list[float] = []
    async for output in engine.submit(request):
        if output.token_ids:
            stamps.append(time.perf_counter())
            if len(stamps) == 1:
                counter[0] += 1
                if counter[0] == total:
                    decoding.set()
    return stamps


async def _arrivals(engine: ServingEngine, prompts: list[tuple[int, ...]], in_flight: int,
                    stop: asyncio.Event) -> int:
    """Keeps `in_flight` long prompts arriving until `stop`; returns how many were served."""
    served = 0

    async def one(ids: tuple[int, ...]) -> None:
        nonlocal served
        async for _ in engine.submit(GenerationRequest(str(uuid.uuid4()), ids, 1,
                                                       SamplingParams())):
            pass
        served += 1

    async def lane(offset: int) -> None:
        index = offset
        while not stop.is_set():
            await one(prompts[index % len(prompts)])
            index += in_flight

    await asyncio.gather(*(lane(i) for i in range(in_flight)))
    return served


async def _one_run(options: MixedOptions, scheduler: SchedulerConfig, mixed: bool) -> dict:
    route = InProcessRouteConfig(Path(options.checkpoint), 1, Backend(options.backend))
    pipeline = InProcessPipeline.from_checkpoint(route)
    text = TextContext.from_checkpoint(options.checkpoint)
    engine = build_engine(replace(serving_defaults(), scheduler=scheduler, max_live_requests=options.streams * 4),
                          pipeline, text)
    rng = np.random.default_rng(0)
    vocab = pipeline.served.vocab_size
    decoding, stop, counter = asyncio.Event(), asyncio.Event(), [0]
    streams = [asyncio.create_task(_decode_stream(
        engine, _prompt(vocab, options.stream_prompt_tokens, rng), options.decode_tokens,
        decoding, counter, options.streams)) for _ in range(options.streams)]
    await decoding.wait()
    window_start = time.perf_counter()
    long_prompts = [_prompt(vocab, options.arrival_prompt_tokens, rng) for _ in range(4)]
    arrivals = (asyncio.create_task(_arrivals(engine, long_prompts, options.arrivals_in_flight, stop))
                if mixed else None)
    stamps = await asyncio.gather(*streams)
    stop.set()
    served = await arrivals if arrivals is not None else 0
    await engine.close()
    gaps = [b - a for s in stamps for a, b in zip(s, s[1:], strict=False) if a >= window_start]
    return {"itl_p99_s": float(np.percentile(gaps, 99)), "itl_p50_s": float(np.percentile(gaps, 50)),
            "gaps": len(gaps), "long_prompts_served": served}


def scheduler_configs(options: MixedOptions) -> dict[str, SchedulerConfig]:
    return {
        "chunked": SchedulerConfig(inflight_microbatches=options.inflight_microbatches,
                                   max_tokens_per_step=options.tokens_per_step,
                                   min_prefill_chunk_tokens=options.min_prefill_chunk_tokens),
        "unchunked": SchedulerConfig(inflight_microbatches=options.inflight_microbatches),
    }


def measure_mixed(options: MixedOptions) -> dict:
    """Both settings, plain then mixed, side by side; keys as `fornax bench serve --mixed`."""
    report: dict = {}
    for name, scheduler in scheduler_configs(options).items():
        plain = asyncio.run(_one_run(options, scheduler, mixed=False))
        mixed = asyncio.run(_one_run(options, scheduler, mixed=True))
        prefix = "" if name == "chunked" else "unchunked_"
        report[f"{prefix}itl_p99_plain_s"] = plain["itl_p99_s"]
        report[f"{prefix}itl_p99_mixed_s"] = mixed["itl_p99_s"]
        report[f"{prefix}itl_p99_mixed_vs_plain"] = mixed["itl_p99_s"] / plain["itl_p99_s"]
        report[f"{name}_runs"] = {"plain": plain, "mixed": mixed}
    report["setup"] = {
        "streams": options.streams, "stream_prompt_tokens": options.stream_prompt_tokens,
        "decode_tokens": options.decode_tokens,
        "arrival_prompt_tokens": options.arrival_prompt_tokens,
        "arrivals_in_flight": options.arrivals_in_flight,
        "tokens_per_step": options.tokens_per_step,
        "min_prefill_chunk_tokens": options.min_prefill_chunk_tokens,
        "inflight_microbatches": options.inflight_microbatches,
        "pipeline": f"in-process, 1 stage, {options.backend} backend (no FNX2 hop)",
        "unchunked": "prompts prefilled in chunks of up to 2048 rows (the default), no step budget",
    }
    return report
