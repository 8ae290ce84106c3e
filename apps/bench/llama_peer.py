"""llama.cpp's `llama-server` as a peer in `fornax bench serve --peer llama.cpp`.

The harness starts the given `llama-server` binary on loopback with the given GGUF, on the same
CPUs the 1-stage Fornax worker has, with one slot per stream of the highest concurrency level, and
streams OpenAI `/v1/completions` requests with the same prompt token ids Fornax gets (greedy,
`ignore_eos` so each request produces exactly the asked-for tokens, as Fornax and transformers do).
Figures are physical measurements of the binary on this host, like the other setups'.

Every request sets `cache_prompt: false`: llama-server otherwise keeps each slot's prompt and,
when the bench repeats a level with the same prompts, prefills only what differs (all but one
token), which Fornax and transformers do not get. A stream whose usage still reports cached
prompt tokens (`prompt_tokens_details.cached_tokens`) fails the run (`PEER_PROMPT_CACHE`).

Beside the timed streams, `greedy_token_ids` asks the native `/completion` endpoint for each
prompt's generated token ids (untimed), and `greedy_agreement` compares them with Fornax's: the
ratio compares like with like only when both engines produce the same greedy continuations.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from apps.bench.serve import RunFigures


class PeerError(Exception):
    """The peer could not be started or answered wrongly; `reason` is a stable code."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class LlamaPeerOptions:
    server: str
    gguf: str
    slots: int = 32
    context_per_slot: int = 128
    threads: int = 1
    startup_timeout_s: float = 300.0


def check_options(options: LlamaPeerOptions) -> None:
    """Fails before any measurement if the binary or the model file is not usable."""
    server = Path(options.server)
    if not (server.is_file() and os.access(server, os.X_OK)):
        raise PeerError("PEER_BINARY_MISSING", f"--llama-server {options.server}: not an executable file")
    if not Path(options.gguf).is_file():
        raise PeerError("PEER_MODEL_MISSING", f"--gguf {options.gguf}: no such file")
    with open(options.gguf, "rb") as handle:
        if handle.read(4) != b"GGUF":
            raise PeerError("PEER_MODEL_NOT_GGUF", f"--gguf {options.gguf}: not a GGUF file (bad magic)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LlamaServer:
    """A running `llama-server` child process; `base_url` is its OpenAI root."""

    def __init__(self, options: LlamaPeerOptions, cpus: tuple[int, ...] | None = None):
        check_options(options)
        self.options = options
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.TemporaryFile()
        command = [options.server, "-m", options.gguf, "--host", "127.0.0.1", "--port", str(self.port),
                   "-c", str(options.slots * options.context_per_slot), "-np", str(options.slots),
                   "-t", str(options.threads),
                   # The bench sends token ids to /v1/completions only. The checkpoint's chat template
                   # (tool calls with string arguments) is one llama-server's jinja tool-call parser
                   # generation rejects at start, so its built-in chatml stands in, unused.
                   "--no-jinja", "--chat-template", "chatml"]
        preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        self._proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=preexec)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.options.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise PeerError("PEER_EXITED", f"llama-server exited with {self._proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise PeerError("PEER_START_TIMEOUT", f"llama-server not healthy after {self.options.startup_timeout_s} s")

    def log_tail(self, limit: int = 2000) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-limit:]

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()

    def __enter__(self) -> LlamaServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


async def _stream_one(session: aiohttp.ClientSession, base_url: str, ids: tuple[int, ...],
                      max_tokens: int) -> tuple[int, float, list[float], str]:
    body = {"prompt": list(ids), "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "cache_prompt": False, "stream_options": {"include_usage": True}}
    started, stamps, text, usage_tokens = time.perf_counter(), [], [], None
    async with session.post(f"{base_url}/v1/completions", json=body) as response:
        if response.status != 200:
            raise PeerError("PEER_HTTP_ERROR", f"llama-server answered {response.status}: "
                                               f"{(await response.text())[:300]}")
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage_tokens = int(chunk["usage"].get("completion_tokens", 0))
                _refuse_cached_prompt(chunk["usage"])
            choices = chunk.get("choices") or []
            if choices:
                stamps.append(time.perf_counter())
                text.append(choices[0].get("text", ""))
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    count = usage_tokens if usage_tokens is not None else len(stamps)
    return count, (stamps[0] - started) if stamps else float("nan"), gaps, "".join(text)


def _refuse_cached_prompt(usage: dict) -> None:
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    if cached:
        raise PeerError("PEER_PROMPT_CACHE", f"llama-server reused {cached} cached prompt tokens of "
                                             f"{usage.get('prompt_tokens')} despite cache_prompt=false; "
                                             "its figures would not be comparable")


async def greedy_token_ids(base_url: str, batch: list[tuple[int, ...]],
                           max_tokens: int) -> list[tuple[int, ...]]:
    """Each prompt's greedy continuation as token ids (native `/completion`, `return_tokens`)."""
    async def one(session: aiohttp.ClientSession, ids: tuple[int, ...]) -> tuple[int, ...]:
        body = {"prompt": list(ids), "n_predict": max_tokens, "temperature": 0, "ignore_eos": True,
                "return_tokens": True, "cache_prompt": False}
        async with session.post(f"{base_url}/completion", json=body) as response:
            if response.status != 200:
                raise PeerError("PEER_HTTP_ERROR", f"llama-server /completion answered {response.status}: "
                                                   f"{(await response.text())[:300]}")
            tokens = (await response.json()).get("tokens")
        if not (isinstance(tokens, list) and all(isinstance(t, int) for t in tokens)):
            raise PeerError("PEER_NO_TOKEN_IDS", "llama-server /completion returned no token ids (return_tokens)")
        return tuple(tokens)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        return list(await asyncio.gather(*(one(session, ids) for ids in batch)))


def greedy_agreement(ours: list[tuple[int, ...]], theirs: list[tuple[int, ...]]) -> dict[str, int | float]:
    """How far two engines' greedy continuations of the same prompts agree, stream by stream.

    `identical_streams`: streams whose token ids are equal; `agreeing_prefix_tokens`: tokens before
    each stream's first difference, summed (a near-tie in the logits that float summation order
    breaks differently ends a stream's agreement there).
    """
    if len(ours) != len(theirs):
        raise ValueError(f"{len(ours)} streams against {len(theirs)}")
    prefix = 0
    for a, b in zip(ours, theirs, strict=True):
        same = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        prefix += same
    total = sum(max(len(a), len(b)) for a, b in zip(ours, theirs, strict=True))
    identical = sum(1 for a, b in zip(ours, theirs, strict=True) if a == b)
    return {"streams": len(ours), "identical_streams": identical, "tokens": total,
            "agreeing_prefix_tokens": prefix, "identical_fraction": identical / len(ours) if ours else float("nan")}


async def drive(base_url: str, batch: list[tuple[int, ...]], max_tokens: int) -> tuple[RunFigures, list[str]]:
    """Every prompt of `batch` at once; the figures and each greedy text."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        started = time.perf_counter()
        results = await asyncio.gather(*(_stream_one(session, base_url, ids, max_tokens) for ids in batch))
        wall = time.perf_counter() - started
    figures = RunFigures(sum(r[0] for r in results), wall, [r[1] for r in results],
                         [g for r in results for g in r[2]])
    return figures, [r[3] for r in results]
