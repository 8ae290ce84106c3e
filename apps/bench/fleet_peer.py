"""`fornax bench serve --fleet FILE --peer llama.cpp`: llama.cpp's `llama-server` after the fleet.

Once the fleet has been measured and brought down, `llama-server` runs on the whole box (every
usable CPU, one thread each) with the given GGUF, one slot per stream of the highest level, and is
driven at the same levels with the same prompt token ids the fleet got (`apps.bench.llama_peer`
starts and drives it; nothing of it is repeated here). Each level's figures sit beside the
fleet's, and `vs_llama_cpp_c<N>` is the fleet's tokens/s ÷ llama.cpp's at that level.

Greedy ids: while the fleet is up the bench asks its orchestrator for each level's greedy
continuations (untimed); after the fleet is down the peer is asked for the same, and
`greedy_agreement` compares them stream by stream, as the non-fleet bench does.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass

from apps.bench.llama_peer import LlamaPeerOptions
from apps.bench.serve import prompts


@dataclass(frozen=True)
class PeerRun:
    """What the peer is driven with: the fleet's own levels and prompts."""

    llama: LlamaPeerOptions
    vocab: int
    prompt_tokens: int
    max_tokens: int
    concurrency: tuple[int, ...]


def level_batches(run: PeerRun) -> dict[str, list[tuple[int, ...]]]:
    """Each level's prompt ids, exactly those the fleet bench sends at that level."""
    return {f"c{c}": prompts(run.vocab, c, run.prompt_tokens, seed=c) for c in run.concurrency}


def vs_llama_cpp(fleet_levels: dict[str, dict], peer_levels: dict[str, dict]) -> dict[str, float | None]:
    """`vs_llama_cpp_c<N>`: the fleet's output tokens/s ÷ llama.cpp's at each level both measured
    (None where the peer produced nothing to divide by)."""
    out: dict[str, float | None] = {}
    for level, ours in fleet_levels.items():
        theirs = peer_levels.get(level)
        if theirs is None:
            continue
        peer_tok_s = theirs["output_tokens_per_s"]
        out[f"vs_llama_cpp_{level}"] = ours["output_tokens_per_s"] / peer_tok_s if peer_tok_s > 0 else None
    return out


def greedy_vs_llama_cpp(fleet_ids: dict[str, list[tuple[int, ...]]],
                        peer_ids: dict[str, list[tuple[int, ...]]]) -> dict[str, dict]:
    """Per level, how far the fleet's greedy ids and the peer's agree (`greedy_agreement`)."""
    from apps.bench.llama_peer import greedy_agreement

    return {level: {"fornax_setup": "fleet route", **greedy_agreement(ids, peer_ids[level])}
            for level, ids in fleet_ids.items() if level in peer_ids}


async def _measure(base_url: str, run: PeerRun) -> tuple[dict[str, dict], dict[str, list[tuple[int, ...]]]]:
    from apps.bench import llama_peer

    await llama_peer.drive(base_url, prompts(run.vocab, 1, run.prompt_tokens, seed=99), 2)  # warm
    levels, ids = {}, {}
    for level, batch in level_batches(run).items():
        figures, _ = await llama_peer.drive(base_url, batch, run.max_tokens)
        levels[level] = figures.summary()
        ids[level] = await llama_peer.greedy_token_ids(base_url, batch, run.max_tokens)
        print(f"  llama.cpp {level}: {levels[level]['output_tokens_per_s']:.2f} tok/s", file=sys.stderr)
    return levels, ids


def run_peer(run: PeerRun, cpus: tuple[int, ...]) -> tuple[dict[str, dict], dict[str, list[tuple[int, ...]]]]:
    """The peer on `cpus` at every level: (figures per level, greedy ids per level)."""
    from apps.bench.llama_peer import LlamaServer

    with LlamaServer(run.llama, cpus) as peer:
        return asyncio.run(_measure(peer.base_url, run))


def peer_report(fleet_levels: dict[str, dict], peer_levels: dict[str, dict],
                fleet_ids: dict[str, list[tuple[int, ...]]], peer_ids: dict[str, list[tuple[int, ...]]],
                provenance: str) -> dict:
    """The report's peer part: figures per level, the ratios and the greedy agreement."""
    return {**vs_llama_cpp(fleet_levels, peer_levels), "llama_cpp": peer_levels,
            "greedy_vs_llama_cpp": greedy_vs_llama_cpp(fleet_ids, peer_ids),
            "peer_provenance": provenance}
