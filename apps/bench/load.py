"""`fornax bench load`: many small streaming requests against a running fleet.

It counts what a user would count as lost (a non-200 answer, an error event, a dropped
connection, a stream without a final chunk) and the end-to-end latency of each request.
The figures are physical measurements of this host, of one run, and say so.
"""

from __future__ import annotations

import asyncio
import json
import platform
import random
import ssl
import time
from collections import Counter
from dataclasses import dataclass

import aiohttp
import numpy as np

from libs.service.affinity import usable_cpus
from libs.service.host import cpu_name

LONG_REQUESTS = 200_000


@dataclass(frozen=True)
class LoadOptions:
    api: str  # base URL ending in /v1
    api_key: str | None = None
    requests: int = 1000
    concurrency: int = 64
    prompt_tokens: int = 8
    max_tokens: int = 8
    vocab: int = 256
    timeout_s: float = 120.0
    model: str = "fornax"
    # CA bundle that verifies an https API (the fleet CA); None: the system trust store.
    ca_file: str | None = None


@dataclass(frozen=True)
class Outcome:
    ok: bool
    latency_s: float
    failure: str = ""  # an HTTP status, an error code or "connection_lost"


def summarize(outcomes: list[Outcome], wall_s: float) -> dict:
    """Pure: the report's figures from the per-request outcomes."""
    latencies = [o.latency_s for o in outcomes if o.ok]

    def pct(q: float) -> float | None:
        return float(np.percentile(latencies, q)) if latencies else None

    return {
        "requests": len(outcomes),
        "completed": len(latencies),
        "lost": sum(1 for o in outcomes if not o.ok),
        "lost_by_cause": dict(sorted(Counter(o.failure for o in outcomes if not o.ok).items())),
        "p50_s": pct(50), "p99_s": pct(99), "max_s": max(latencies) if latencies else None,
        "wall_s": wall_s,
        "requests_per_s": len(latencies) / wall_s if wall_s > 0 else None,
    }


async def _one(session: aiohttp.ClientSession, options: LoadOptions, prompt: list[int]) -> Outcome:
    body = {"model": options.model, "prompt": prompt, "max_tokens": options.max_tokens,
            "temperature": 0, "stream": True}
    started = time.monotonic()
    try:
        async with session.post(f"{options.api}/completions", json=body) as response:
            if response.status != 200:
                return Outcome(False, time.monotonic() - started, f"http_{response.status}")
            finished = False
            async for line in response.content:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    return Outcome(False, time.monotonic() - started, event["error"]["code"])
                finished = finished or any(c.get("finish_reason") for c in event.get("choices", ()))
            if not finished:
                return Outcome(False, time.monotonic() - started, "no_final_chunk")
            return Outcome(True, time.monotonic() - started)
    except (TimeoutError, aiohttp.ClientError):
        return Outcome(False, time.monotonic() - started, "connection_lost")


async def run_load(options: LoadOptions, progress=None) -> tuple[list[Outcome], float]:
    rng = random.Random(0)
    headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
    tls = ssl.create_default_context(cafile=options.ca_file) if options.api.startswith("https://") else None
    connector = aiohttp.TCPConnector(limit=options.concurrency, ssl=tls if tls is not None else True)
    timeout = aiohttp.ClientTimeout(total=options.timeout_s)
    next_index = iter(range(options.requests))
    outcomes: list[Outcome] = []

    async def worker(session: aiohttp.ClientSession) -> None:
        for index in next_index:
            prompt = [rng.randrange(1, options.vocab) for _ in range(options.prompt_tokens)]
            outcomes.append(await _one(session, options, prompt))
            if progress is not None and (index + 1) % 10_000 == 0:
                progress(index + 1)

    started = time.monotonic()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:
        await asyncio.gather(*(worker(session) for _ in range(options.concurrency)))
    return outcomes, time.monotonic() - started


def report(options: LoadOptions, outcomes: list[Outcome], wall_s: float, command: str) -> dict:
    return {
        **summarize(outcomes, wall_s),
        "concurrency": options.concurrency,
        "prompt_tokens": options.prompt_tokens,
        "max_tokens": options.max_tokens,
        "provenance": {
            "evidence_class": "physical",
            "label": "measured on this host against a running fleet, one run; not a prediction",
            "hardware": f"{cpu_name() or platform.machine()}, {len(usable_cpus())} usable CPUs",
            "command": command,
        },
    }
