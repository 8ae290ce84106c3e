"""`fornax bench grammar`: per-token mask cost of the grammar engines that can constrain sampling.

Each engine compiles the same JSON schema against the checkpoint's tokenizer, then walks
seeded random paths through the grammar: at every step it computes the allowed-token mask
(the timed part), picks an allowed token uniformly and advances. The figures are physical
measurements of this host; an engine that is not installed is reported as absent, never
estimated.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from libs.service.host import cpu_name
from libs.text.tokenizer import ProjectTokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4},
        "kind": {"enum": ["a", "b", "c"]},
    },
    "required": ["name", "age", "tags", "kind"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class Vocab:
    tokenizer_json: str
    token_bytes: tuple[bytes, ...]
    special_ids: frozenset[int]
    eos_id: int
    vocab_size: int


class Walker:
    """One engine's matcher: allowed(vocab) -> bool mask, advance(token)."""

    allowed: Callable[[], np.ndarray]
    advance: Callable[[int], object]  # the engine's own return value is ignored


def _bits_to_bool(bits: np.ndarray, vocab_size: int) -> np.ndarray:
    return np.unpackbits(bits.view(np.uint8), bitorder="little")[:vocab_size].astype(bool)


def llguidance_walker(vocab: Vocab, schema: dict) -> Walker:
    import llguidance
    import llguidance.numpy as lln

    tok = llguidance.LLTokenizer(vocab.tokenizer_json, n_vocab=vocab.vocab_size, eos_token=vocab.eos_id)
    matcher = llguidance.LLMatcher(tok, llguidance.LLMatcher.grammar_from_json_schema(schema), log_level=0)
    mask = lln.allocate_token_bitmask(1, vocab.vocab_size)
    walker = Walker()

    def allowed() -> np.ndarray:
        lln.fill_next_token_bitmask(matcher, mask, 0)
        return _bits_to_bool(mask[0], vocab.vocab_size)

    walker.allowed, walker.advance = allowed, lambda t: matcher.consume_token(t)
    return walker


def outlines_walker(vocab: Vocab, schema: dict) -> Walker:
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    table: dict[bytes, list[int]] = {}
    for token_id, raw in enumerate(vocab.token_bytes):
        if token_id not in vocab.special_ids and raw:
            table.setdefault(raw, []).append(token_id)
    guide = Guide(Index(build_regex_from_schema(json.dumps(schema)), Vocabulary(vocab.eos_id, table)))
    walker = Walker()

    def allowed() -> np.ndarray:
        mask = np.zeros(vocab.vocab_size, dtype=bool)
        mask[np.asarray(guide.get_tokens(), dtype=np.int64)] = True
        return mask

    walker.allowed, walker.advance = allowed, lambda t: guide.advance(t)
    return walker


def xgrammar_walker(vocab: Vocab, schema: dict) -> Walker:
    import xgrammar as xgr

    info = xgr.TokenizerInfo(list(vocab.token_bytes), vocab_type=xgr.VocabType.RAW,
                             vocab_size=vocab.vocab_size, stop_token_ids=[vocab.eos_id])
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(schema))
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, vocab.vocab_size)
    walker = Walker()

    def allowed() -> np.ndarray:
        matcher.fill_next_token_bitmask(bitmask)
        return _bits_to_bool(bitmask[0].numpy(), vocab.vocab_size)

    walker.allowed, walker.advance = allowed, lambda t: matcher.accept_token(t)
    return walker


ENGINES: dict[str, Callable[[Vocab, dict], Walker]] = {
    "llguidance": llguidance_walker, "outlines-core": outlines_walker, "xgrammar": xgrammar_walker}


def measure(engine: str, vocab: Vocab, walks: int, max_steps: int) -> dict:
    started = time.perf_counter()
    try:
        make = ENGINES[engine]
        make(vocab, SCHEMA)
    except ImportError as exc:
        return {"installed": False, "reason": str(exc)}
    compile_s = time.perf_counter() - started
    mask_s: list[float] = []
    for seed in range(walks):
        rng, walker = np.random.default_rng(seed), make(vocab, SCHEMA)
        for _ in range(max_steps):
            t0 = time.perf_counter()
            allowed = walker.allowed()
            mask_s.append(time.perf_counter() - t0)
            choices = np.flatnonzero(allowed)
            token = int(rng.choice(choices))
            if token == vocab.eos_id:
                break
            walker.advance(token)
    return {"installed": True, "compile_s": compile_s, "masks": len(mask_s),
            "mask_us_p50": 1e6 * statistics.median(mask_s),
            "mask_us_p99": 1e6 * float(np.percentile(mask_s, 99)),
            "mask_us_mean": 1e6 * statistics.fmean(mask_s)}


def run(checkpoint: str, walks: int = 20, max_steps: int = 200, command: str = "") -> dict:
    root = Path(checkpoint)
    tokenizer = ProjectTokenizer.from_file(root / "tokenizer.json")
    config = json.loads((root / "config.json").read_text())
    eos = config["eos_token_id"]
    vocab = Vocab((root / "tokenizer.json").read_text(), tokenizer.token_bytes, tokenizer.special_ids,
                  eos[0] if isinstance(eos, list) else eos, config["vocab_size"])
    report: dict[str, Any] = {"evidence_class": "physical", "hardware": f"{cpu_name()} ({platform.machine()})",
              "command": command,
              "tokenizer_sha256": tokenizer.identity.sha256, "vocab_size": vocab.vocab_size,
              "tokenizer_tokens": tokenizer.vocab_size, "walks": walks, "max_steps": max_steps,
              "engines": {}}
    for engine in ENGINES:
        report["engines"][engine] = measure(engine, vocab, walks, max_steps)
    return report
