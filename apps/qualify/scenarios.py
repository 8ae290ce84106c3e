"""One qualification run's scenarios against a live fleet, each ending in `Check`s.

Every scenario streams greedy generations through the orchestrator and compares token ids with
the single-process reference, so a duplicated, lost or wrong token fails it. Times are taken
on this process's monotonic clock (physical).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from apps.qualify.gate import Check, StageTimes
from apps.qualify.phases import WindowError, stage_times
from apps.qualify.probes import Generated, Generator, StageHealth

FIRST_TOKEN_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class StageRef:
    index: int
    host: str
    backend: str
    layer_start: int
    layer_end: int


@dataclass(frozen=True)
class Workload:
    prompts: tuple[tuple[int, ...], ...]
    reference: tuple[tuple[int, ...], ...]  # greedy ids per prompt, at least `decode_tokens` long or ended
    decode_tokens: int
    # The prompt whose greedy continuation runs longest without an end-of-sequence token: a
    # stream that stops by itself before its budget cannot show the budget expiring.
    expiry_prompt: int = 0
    # What `reference` is, as the checks state it.
    reference_name: str = "the single-process transformers reference"


def reference_mismatch(got: Generated, expected: Sequence[int], complete: bool) -> str | None:
    """None when `got` is the reference (or, for a stream cut short, a prefix of it)."""
    ids, want = list(got.token_ids), list(expected)
    if complete and ids != want:
        return f"{got.request_id}: {len(ids)} tokens differ from the reference's {len(want)} ({_first_diff(ids, want)})"
    if not complete and ids[: len(want)] != want[: len(ids)]:
        return f"{got.request_id}: tokens are not a prefix of the reference ({_first_diff(ids, want)})"
    return None


def _first_diff(a: Sequence[int], b: Sequence[int]) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"first difference at token {i}: {x} != {y}"
    return f"lengths {len(a)} and {len(b)}"


async def _until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout_s:g} s: {what}")
        await asyncio.sleep(0.01)


def _expected(work: Workload, index: int, max_tokens: int) -> tuple[int, ...]:
    return work.reference[index][:max_tokens]


async def measured_decode(gen: Generator, work: Workload, run: int, stages: Sequence[StageRef],
                          health: Callable[[int], StageHealth]) -> tuple[list[Check], list[StageTimes]]:
    """Every prompt prefills together, then decodes together; phase totals are read once every
    stream has its first token and again when the first stream ends: a decode-only window."""
    counts = [0] * len(work.prompts)
    window_rows = [0]
    window_past = [0]  # tokens of past summed over the window's decode rows
    measuring = [False]

    def progress(i):
        def on(out: Generated) -> None:
            if measuring[0]:
                window_rows[0] += len(out.token_ids) - counts[i]
                # Output token n (n >= 1) came from a decode row fed token n - 1 at position
                # prompt + n - 1: that many tokens of past.
                window_past[0] += sum(len(work.prompts[i]) + n - 1 for n in range(counts[i], len(out.token_ids)))
            counts[i] = len(out.token_ids)
        return on

    tasks = [asyncio.create_task(gen.generate(f"qualify-r{run}-decode-{i}", p, work.decode_tokens,
                                              progress=progress(i)))
             for i, p in enumerate(work.prompts)]
    await _until(lambda: all(c >= 1 for c in counts) or any(t.done() for t in tasks), FIRST_TOKEN_TIMEOUT_S,
                 "every stream's first token")
    before = {s.index: (await asyncio.to_thread(health, s.index)).phases for s in stages}
    start = time.monotonic()
    measuring[0] = True
    await _until(lambda: any(t.done() for t in tasks) or min(counts) >= work.decode_tokens, FIRST_TOKEN_TIMEOUT_S,
                 "the first stream's end")
    measuring[0] = False
    after = {s.index: (await asyncio.to_thread(health, s.index)).phases for s in stages}
    window = time.monotonic() - start
    outs = await asyncio.gather(*tasks)
    checks = [_prefill_check(work, outs)]
    bad = [m for i, o in enumerate(outs)
           if (m := (f"{o.request_id}: ended {o.code} {o.error}" if o.code else
                     reference_mismatch(o, _expected(work, i, work.decode_tokens), complete=True)))]
    times = []
    try:
        for s in stages:
            times.append(stage_times(before[s.index], after[s.index], window, stage_index=s.index, host=s.host,
                                     backend=s.backend, layer_start=s.layer_start, layer_end=s.layer_end,
                                     rows=window_rows[0], past_tokens=window_past[0]))
    except WindowError as exc:
        bad.append(f"measured window: {exc}")
    checks.append(Check("token_parity", not bad, "; ".join(bad) or
                        f"{len(outs)} streams x {work.decode_tokens} greedy tokens equal {work.reference_name}; "
                        f"measured window {window * 1e3:.1f} ms, {window_rows[0]} decode rows"))
    return checks, times


def _prefill_check(work: Workload, outs: Sequence[Generated]) -> Check:
    """Every prompt prefilled together: each first token matches the reference."""
    prefill = [o.request_id for i, o in enumerate(outs)
               if o.code or not o.token_ids or not work.reference[i] or o.token_ids[0] != work.reference[i][0]]
    ttft = max((o.first_token_at or o.ended) - o.started for o in outs)
    return Check("prefill", not prefill,
                 f"{len(outs)} prompts of {min(map(len, work.prompts))}-{max(map(len, work.prompts))} tokens "
                 f"prefilled together; first tokens {'match' if not prefill else 'DIFFER from'} the reference; "
                 f"slowest time to first token {ttft * 1e3:.1f} ms (physical)")


async def changing_subset(gen: Generator, work: Workload, run: int) -> list[Check]:
    """Sequences join and leave the decode microbatches: a long stream, a short one that leaves
    early, one that joins after 4 tokens of the first, and one that joins after 8 and is
    cancelled after 3 tokens of its own."""
    n = len(work.prompts)
    long_tokens, short_tokens = work.decode_tokens, max(2, work.decode_tokens // 4)
    seen: dict[str, int] = {}

    def track(out: Generated) -> None:
        seen[out.request_id] = len(out.token_ids)

    first = f"qualify-r{run}-subset-long"
    cancelled_id = f"qualify-r{run}-subset-cancelled"
    a = asyncio.create_task(gen.generate(first, work.prompts[0], long_tokens, progress=track))
    b = asyncio.create_task(gen.generate(f"qualify-r{run}-subset-short", work.prompts[1 % n], short_tokens))
    await _until(lambda: seen.get(first, 0) >= 4 or a.done(), FIRST_TOKEN_TIMEOUT_S, "4 tokens of the long stream")
    c = asyncio.create_task(gen.generate(f"qualify-r{run}-subset-joins", work.prompts[2 % n], short_tokens * 2))
    await _until(lambda: seen.get(first, 0) >= 8 or a.done(), FIRST_TOKEN_TIMEOUT_S, "8 tokens of the long stream")
    d = asyncio.create_task(gen.generate(cancelled_id, work.prompts[3 % n], long_tokens, progress=track))
    await _until(lambda: seen.get(cancelled_id, 0) >= 3 or d.done(), FIRST_TOKEN_TIMEOUT_S,
                 "3 tokens of the stream to cancel")
    cancel_sent = time.monotonic()
    found = await gen.cancel(cancelled_id)
    outs = await asyncio.gather(a, b, c, d)
    bad = []
    for out, index, tokens in ((outs[0], 0, long_tokens), (outs[1], 1 % n, short_tokens),
                               (outs[2], 2 % n, short_tokens * 2)):
        problem = (f"{out.request_id}: ended {out.code} {out.error}" if out.code
                   else reference_mismatch(out, _expected(work, index, tokens), complete=True))
        if problem:
            bad.append(problem)
    checks = [Check("changing_subset_decode", not bad, "; ".join(bad) or
                    f"streams of {long_tokens}, {short_tokens} and {short_tokens * 2} tokens joining and leaving "
                    "the microbatches each equal the reference")]
    gone = outs[3]
    cancel_problems = []
    if not found:
        cancel_problems.append("the orchestrator did not find the stream to cancel")
    if gone.code != "CANCELLED":
        cancel_problems.append(f"the cancelled stream ended {gone.code or 'normally'}, not CANCELLED")
    if len(gone.token_ids) >= long_tokens:
        cancel_problems.append("the cancelled stream ran to its end")
    mismatch = reference_mismatch(gone, _expected(work, 3 % n, long_tokens), complete=False)
    if mismatch:
        cancel_problems.append(mismatch)
    checks.append(Check("cancellation", not cancel_problems, "; ".join(cancel_problems) or
                        f"cancelled after {len(gone.token_ids)} tokens, ended CANCELLED "
                        f"{(gone.ended - cancel_sent) * 1e3:.1f} ms after the Cancel (physical)"))
    return checks


async def expiry(gen: Generator, work: Workload, run: int, budget_s: float, tolerance_s: float,
                 clocks: str) -> Check:
    """A stream with a budget far shorter than its decode must end DEADLINE_EXCEEDED at the
    budget, measured on this process's clock, while the hosts' clocks are hours apart."""
    out = await gen.generate(f"qualify-r{run}-expiry", work.prompts[work.expiry_prompt], 1500, budget_s=budget_s)
    elapsed = out.ended - out.started
    problems = []
    if out.code is None and elapsed < budget_s:
        problems.append(f"ended normally (end of sequence) after {len(out.token_ids)} tokens in {elapsed:.3f} s, "
                        "before its budget: inconclusive (a shorter --expiry-budget-s tests it)")
    elif out.code != "DEADLINE_EXCEEDED":
        problems.append(f"ended {out.code or 'normally'} after {len(out.token_ids)} tokens, not DEADLINE_EXCEEDED")
    if abs(elapsed - budget_s) > tolerance_s:
        problems.append(f"ended {elapsed:.3f} s after submission, outside {budget_s:g} s +- {tolerance_s:g} s")
    mismatch = reference_mismatch(out, work.reference[work.expiry_prompt], complete=False)
    if mismatch:
        problems.append(mismatch)
    return Check("expiry_skewed_clocks", not problems, "; ".join(problems) or
                 f"budget {budget_s:g} s expired after {elapsed:.3f} s (tolerance +- {tolerance_s:g} s, physical) "
                 f"with {len(out.token_ids)} tokens; {clocks}")
