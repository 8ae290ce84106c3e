"""The single-process references the gate compares a fleet with.

- Greedy token ids from transformers (float32, CPU), for what the fleet streams.
- Activation parity at every boundary and final logits: the plan's layer ranges run as stages
  in this process, each on its stage host's backend, against transformers
  (`libs.model.parity`, which also mixes prefill and decode rows in one ragged batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from apps.qualify.gate import BoundaryParity
from libs.model.config import load_config
from libs.model.parity import (
    ParityRequest,
    check_reference_supports,
    compare,
    plan_sequences,
    run_ours,
    run_reference,
)


def greedy_reference(checkpoint: Path, prompts: Sequence[Sequence[int]], new_tokens: int) -> list[list[int]]:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(checkpoint), dtype=torch.float32, attn_implementation="eager").eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            generated = model.generate(torch.tensor([list(ids)]), max_new_tokens=new_tokens, do_sample=False)
            out.append(generated[0, len(ids):].tolist())
    return out


def boundary_parity(checkpoint: Path, ranges: Sequence[tuple[int, int]], backends: Sequence[str],
                    tolerance: float, decode_steps: int = 8) -> tuple[list[BoundaryParity], str, str]:
    """Max |ours - reference| after each stage and on the final logits, the staged build, the
    reference's description. Expert-routing mismatches count as a failed boundary."""
    cfg = load_config(checkpoint)
    check_reference_supports(cfg)
    plans = plan_sequences(cfg, decode_steps, seed=0)
    request = ParityRequest(checkpoint, len(ranges), backends[0], decode_steps=decode_steps, tolerance=tolerance,
                            stage_backends=tuple(backends))
    ours, build = run_ours(request, cfg, list(ranges), plans)
    ref, reference = run_reference(checkpoint, cfg, plans)
    diffs, experts = compare(ours, ref, list(ranges), tolerance)
    out = [BoundaryParity(d.label, d.max_abs_diff, tolerance) for d in diffs]
    # Routed experts per MoE layer: the count of rows (of e.rows) whose expert set differs; none may.
    out += [BoundaryParity(f"layer {e.layer} experts: rows differing", float(e.mismatched_rows), 0.0)
            for e in experts]
    return out, build, reference
