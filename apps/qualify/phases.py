"""Per-stage phase times of a measured window, from two GetHealth phase-total snapshots.

A stage worker's GetHealth carries cumulative nanoseconds per data-plane phase since it
started (services/stage_worker/phase_totals.py). The difference over a window, divided by the
batches the stage executed in it, is that stage's time per microbatch in each phase.
"""

from __future__ import annotations

from dataclasses import dataclass

from apps.qualify.gate import StageTimes


@dataclass(frozen=True)
class PhaseSnapshot:
    """Cumulative totals of one stage at one instant (GetHealth.phase_totals + live counters)."""

    queue_ns: int
    compute_ns: int
    pack_ns: int
    transfer_ns: int
    unpack_ns: int
    batches: int
    rows: int = 0  # cumulative rows executed, when known; 0 otherwise


class WindowError(ValueError):
    """The window saw no batch, or a counter went backwards (the worker restarted in it)."""


def stage_times(before: PhaseSnapshot, after: PhaseSnapshot, window_s: float, *, stage_index: int, host: str,
                backend: str, layer_start: int, layer_end: int, rows: int, past_tokens: int = 0) -> StageTimes:
    """Seconds per microbatch in each phase over the window; `rows` is the decode rows sent in it,
    `past_tokens` the tokens of past those rows attended over, summed."""
    batches = after.batches - before.batches
    deltas = {
        "queue": after.queue_ns - before.queue_ns, "compute": after.compute_ns - before.compute_ns,
        "pack": after.pack_ns - before.pack_ns, "wire": after.transfer_ns - before.transfer_ns,
        "unpack": after.unpack_ns - before.unpack_ns,
    }
    if batches <= 0:
        raise WindowError(f"stage {stage_index} executed no batch in the measured window")
    if any(v < 0 for v in deltas.values()):
        raise WindowError(f"stage {stage_index}'s phase totals went backwards (a restart inside the window)")
    if window_s <= 0:
        raise WindowError(f"window must be > 0 s, got {window_s}")
    seconds = {k: v / 1e9 / batches for k, v in deltas.items()}
    explained = sum(seconds.values())
    seconds["exposed_wait"] = max(0.0, window_s / batches - explained)
    return StageTimes(stage_index, host, backend, layer_start, layer_end, batches, rows / batches, seconds,
                      past_tokens / rows if rows else 0.0)
