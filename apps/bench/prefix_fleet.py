"""`fornax bench prefix --fleet FILE`: the prefix bench's workloads through a netns fleet.

The fleet comes up as `fornax up --fleet` brings it up (namespaces, cgroup quotas, shaped
links), and a client in the root namespace streams `/v1/completions` (prompts as token ids,
greedy, `ignore_eos`) over the orchestrator's HTTPS front, taking each request's time to first
token and `usage.prompt_tokens_details.cached_tokens` from the stream. One fleet serves both
settings under its prefix policy: with reuse on, every request of a run sends the run's own
`cache_salt`; with it off, every request sends a fresh one, so no request can match a block any
other published. A chat turn appends the reply as a client sees it: its text, tokenized with the
checkpoint's tokenizer. Every figure is a physical measurement of this host, one run.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from apps.bench.prefix import PrefixBenchOptions, Turn, agent, chat, report
from apps.fleet.isolated import start_isolated_fleet
from apps.fleet.launcher import FleetOptions
from apps.fleet.netns import tear_down
from apps.fleet.route_wait import wait_for_route
from apps.fleet.spec import FleetSpec
from libs.model.config import load_config
from libs.text.context import TextContext


@dataclass(frozen=True)
class PrefixFleetOptions:
    fleet_file: str
    spec: FleetSpec
    bench: PrefixBenchOptions
    install_timeout_s: float = 3600.0


async def _ask(session: aiohttp.ClientSession, api: str, ids: tuple[int, ...], max_tokens: int, cache_salt: str,
               encode) -> Turn:  # noqa: ANN001
    body = {"model": "fornax", "prompt": list(ids), "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "cache_salt": cache_salt, "stream_options": {"include_usage": True}}
    started, first, text = time.perf_counter(), None, []
    usage: dict = {}
    async with session.post(f"{api}/completions", json=body) as response:
        response.raise_for_status()
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices") or ():
                if first is None:
                    first = time.perf_counter()
                text.append(choice.get("text") or "")
            usage = event.get("usage") or usage
    if not usage:
        raise RuntimeError("the stream ended without usage")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return Turn((first or float("nan")) - started, int(usage["prompt_tokens"]), int(cached),
                tuple(encode("".join(text))))


Runs = dict[str, dict[str, list[Turn]]]


async def _measure(options: PrefixFleetOptions, api: str, tls: ssl.SSLContext | None) -> Runs:
    bench = options.bench
    vocab = load_config(bench.checkpoint).vocab_size
    encode = TextContext.from_checkpoint(bench.checkpoint).tokenizer.encode
    connector = aiohttp.TCPConnector(ssl=tls if tls is not None else True)
    runs: Runs = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600), connector=connector) as session:
        await _ask(session, api, (5, 6, 7), 2, f"warm-{uuid.uuid4()}", encode)
        for setting in ("off", "tenant"):
            run_salt = f"bench-prefix-{uuid.uuid4()}"

            def ask(ids: tuple[int, ...], reuse: bool = setting == "tenant", salt: str = run_salt):
                return _ask(session, api, ids, bench.max_tokens, salt if reuse else f"fresh-{uuid.uuid4()}", encode)

            runs[setting] = {"chat": await chat(ask, bench, vocab), "agent": await agent(ask, bench, vocab)}
            print(f"  {setting}: chat turn TTFTs {[round(t.ttft_s, 3) for t in runs[setting]['chat']]}",
                  file=sys.stderr)
    return runs


def run_prefix_fleet(options: PrefixFleetOptions, command: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="fornax-prefix-fleet-") as scratch:
        state_dir = Path(scratch) / ".fornax"
        fleet = FleetOptions(state_dir=state_dir, checkpoint=options.bench.checkpoint, startup_timeout_s=600)
        state, launcher = start_isolated_fleet(fleet, options.spec)
        try:
            wait_for_route(state, options.install_timeout_s, lambda m: print(f"  {m}", file=sys.stderr))
            if state.api is None:
                raise RuntimeError("the fleet publishes no HTTP API")
            runs = asyncio.run(_measure(options, state.api, state.api_ssl_context()))
        finally:
            launcher.stop_all()
            tear_down(state_dir)
    hosts = ", ".join(f"{h.name} {h.backend.value} {h.cpu_cores} cores" for h in options.spec.hosts)
    backends = ",".join(sorted({h.backend.value for h in options.spec.hosts}))
    out = report(runs, command, backends, route=f"netns fleet {options.fleet_file} "
                 f"(sha256:{options.spec.file_sha256}; {hosts}), over its HTTPS front")
    out["reuse_off_means"] = "a fresh cache_salt per request on the same fleet"
    return out
