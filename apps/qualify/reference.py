"""The single-process references the gate compares a fleet with.

Whole (`--reference whole`): transformers holds the float32 model.
- Greedy token ids from `generate`, which every stream must equal.
- Activation parity at every boundary and final logits: the plan's layer ranges run as stages
  in this process, each on its stage host's backend, against transformers
  (`libs.model.parity`, which also mixes prefill and decode rows in one ragged batch).

Streamed (`--reference streamed`): the layer-streamed reference (`libs.model.streamed_reference`),
which holds one decoded layer at a time, for models whose float32 copy does not fit.
- The fleet's own greedy tokens, scored teacher-forced: the share whose every token is the
  reference's top-1 after the route's own prefix (`libs.model.served_agreement`).
- The same staged run as the whole path (stages one at a time), against the streamed
  reference's hidden states after each stage's last layer, its final logits and routed experts.

Both keep the same rules (`RouteWeights.exact`): a route of float32-exact weights over fp32 hops
is gated on max |diff| at every boundary and no differing expert, and on exact token agreement.
A route that cannot be exact, because block formats sit on a MAX stage (whose graphs quantize
activations) or a hop rounds the hidden states (bf16, fp16), is gated on the final logits' top-1
>= MAX_BLOCK_TOP1_MIN, as `fornax parity` does; its boundaries and experts are stated, not gated,
and its served greedy tokens are scored teacher forced (agreement >= MAX_BLOCK_TOP1_MIN). The
staged run passes each boundary through its hop's dtype, as the route does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from apps.qualify.gate import BoundaryParity, Check
from libs.common.kinds import FLOAT_DTYPES, DType
from libs.model.config import DeepseekV2Config, load_config
from libs.model.parity import (
    MAX_BLOCK_TOP1_MIN,
    Captured,
    ParityRequest,
    SequencePlan,
    check_reference_supports,
    compare,
    plan_sequences,
    run_ours,
    run_reference,
    top1_agreement,
)

BLOCK_POLICIES = ("q8_0", "q4_k_m")
TOP1 = "top-1 disagreement"
_HOP_BYTES = {DType.BF16: 2, DType.FP16: 2, DType.FP32: 4}


class RouteRefused(ValueError):
    """A route qualify cannot compare with its reference; `reason` is a stable UPPER_SNAKE code."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class RouteWeights:
    """One weight policy over the route's stages, each stage's backend, and each hop's dtype."""

    policy: str
    backends: tuple[str, ...]
    hops: tuple[DType, ...] = ()  # hop i carries stage i's output to stage i+1; empty: fp32

    @property
    def max_blocks(self) -> bool:
        """Block formats on a MAX stage: not exact against float32, gated on top-1."""
        return "max" in self.backends and self.policy in BLOCK_POLICIES

    @property
    def rounding_hops(self) -> tuple[int, ...]:
        """The hops that round the hidden states (every dtype narrower than fp32)."""
        return tuple(i for i, d in enumerate(self.hops) if d is not DType.FP32)

    @property
    def exact(self) -> bool:
        """Float32-exact against the reference: max |diff| gates apply."""
        return not self.max_blocks and not self.rounding_hops

    def inexact_because(self) -> tuple[str, ...]:
        """Why the exact gates cannot apply (empty when they do)."""
        why = []
        if self.max_blocks:
            stages = [i for i, b in enumerate(self.backends) if b == "max"]
            why.append(f"{self.policy} on MAX stage{'s' if len(stages) > 1 else ''} "
                       f"{', '.join(map(str, stages))} (its graphs quantize activations)")
        if self.rounding_hops:
            why.append("hop " + ", ".join(f"{i}>{i + 1} carries {self.hops[i].value}" for i in self.rounding_hops)
                       + " (rounds the hidden states; the staged run applies the same rounding)")
        return tuple(why)

    def describe_gates(self) -> str:
        """Which parity gates apply, and why (the report's and the checks' statement)."""
        if self.exact:
            return ("exact gates: max |diff| at every boundary and on the final logits, no differing expert, "
                    "every served token equal to the reference's (fp32 weights and fp32 hops)")
        return (f"top-1 gates: final logits' top-1 agreement >= {MAX_BLOCK_TOP1_MIN:g} and served greedy tokens' "
                f"teacher-forced top-1 agreement >= {MAX_BLOCK_TOP1_MIN:g}; boundaries and experts stated, not "
                f"gated; exact agreement is impossible: {'; '.join(self.inexact_because())}")

    @property
    def reference_backend(self) -> str:
        """The backend whose encoding of `policy` the reference decodes (a MAX stage's, when any)."""
        return "max" if "max" in self.backends else "numpy"

    @property
    def boundary_dtype(self) -> DType:
        """The route's boundary dtype as one value: its widest hop, as `fornax plan --fleet` plans it."""
        return max(self.hops, key=lambda d: _HOP_BYTES[d], default=DType.FP32)

    @property
    def token_agreement_min(self) -> float:
        return 1.0 if self.exact else MAX_BLOCK_TOP1_MIN


def route_weights(policies: Sequence[str], backends: Sequence[str], hops: Sequence[DType] = ()) -> RouteWeights:
    """Each stage's weight policy and backend, as one policy over the route (refused otherwise:
    the reference encodes the checkpoint one way), and the route's hop dtypes."""
    if len(set(policies)) != 1:
        raise RouteRefused(f"the route's stages hold weight policies {list(policies)}; qualify compares one "
                           "policy over the route with its reference", "MIXED_WEIGHT_POLICIES")
    return RouteWeights(policies[0], tuple(backends), tuple(hops))


def route_hops(fleet_hops: Sequence[DType], stages: int) -> tuple[DType, ...]:
    """The dtype of each of the route's hops, from the fleet file's (hop i from stage i to i+1).

    A route over fewer stages than the fleet file has takes the file's one dtype when every hop
    shares it; otherwise which hop is which is unknown, and the route is refused. A hop that
    cannot carry activations is refused too."""
    unsupported = sorted({d.value for d in fleet_hops if d not in FLOAT_DTYPES})
    if unsupported:
        raise RouteRefused(f"hops of {', '.join(unsupported)} carry no activations qualify can compare",
                           "HOP_DTYPE_UNSUPPORTED")
    if len(fleet_hops) == stages - 1:
        return tuple(fleet_hops)
    if len(set(fleet_hops)) == 1:
        return (fleet_hops[0],) * (stages - 1)
    if not fleet_hops:
        return (DType.FP32,) * (stages - 1)
    raise RouteRefused(f"the route has {stages} stages but the fleet file lists {len(fleet_hops)} hops of unlike "
                       f"dtypes ({', '.join(d.value for d in fleet_hops)})", "HOP_DTYPES_MISMATCH")


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


@dataclass(frozen=True)
class TokenAgreement:
    """The fleet's greedy tokens against the streamed reference, teacher forced."""

    agreement: float
    positions: int
    minimum: float
    first_misses: tuple[int | None, ...]  # per prompt, the continuation index of the first disputed token
    reference: str

    @property
    def passed(self) -> bool:
        return self.agreement >= self.minimum

    def describe(self) -> str:
        misses = [f"prompt {i} at token {m}" for i, m in enumerate(self.first_misses) if m is not None]
        return (f"served greedy tokens vs the layer-streamed reference (teacher forced): top-1 agreement "
                f"{self.agreement:.3f} over {self.positions} positions (minimum {self.minimum:g})"
                + (f"; first disputed: {', '.join(misses)}" if misses else "") + f"; {self.reference}")


def token_agreement(checkpoint: Path, weights: RouteWeights, prompts: Sequence[Sequence[int]],
                    served: Sequence[Sequence[int]]) -> TokenAgreement:
    from libs.model.served_agreement import overall_agreement, prompt_agreement, teacher_forced_sequence
    from libs.model.streamed_reference import checkpoint_source, streamed_logits

    source = checkpoint_source(checkpoint, weights.policy, weights.reference_backend)
    streamed = streamed_logits(source, [teacher_forced_sequence(p, s) for p, s in zip(prompts, served, strict=True)])
    scored = [prompt_agreement(p, s, top1) for p, s, top1 in zip(prompts, served, streamed.top1, strict=True)]
    share, positions = overall_agreement(scored)
    return TokenAgreement(share, positions, weights.token_agreement_min, tuple(p.first_miss for p in scored),
                          f"{streamed.reference}; {streamed.seconds:.1f} s, "
                          f"peak RSS {streamed.peak_rss_bytes / 2**20:.0f} MiB")


def with_token_agreement(checks: Sequence[Check], agreement: TokenAgreement | None) -> list[Check]:
    """The token_parity check, also gated on (and stating) the streamed reference's agreement."""
    if agreement is None:
        return list(checks)
    return [Check(c.name, c.passed and agreement.passed, f"{c.detail}; {agreement.describe()}")
            if c.name == "token_parity" else c for c in checks]


def boundary_parity(checkpoint: Path, ranges: Sequence[tuple[int, int]], backends: Sequence[str],
                    tolerance: float, decode_steps: int = 8, policy: str = "fp32",
                    hops: Sequence[DType] = ()) -> tuple[list[BoundaryParity], str, str]:
    """Max |ours - reference| after each stage and on the final logits, the staged build, the
    reference's description, against the whole model in transformers. Expert-routing mismatches
    count as a failed boundary on an exact route. `hops`: each hop's dtype (empty: fp32)."""
    weights = RouteWeights(policy, tuple(backends), tuple(hops))
    cfg, plans, ours, build = _staged_run(checkpoint, ranges, weights, tolerance, decode_steps)
    ref, reference = run_reference(checkpoint, cfg, plans, policy, weights.reference_backend)
    return _figures(ours, ref, ranges, tolerance, weights), build, reference


def streamed_boundary_parity(checkpoint: Path, ranges: Sequence[tuple[int, int]], backends: Sequence[str],
                             tolerance: float, decode_steps: int = 8, policy: str = "fp32",
                             hops: Sequence[DType] = ()) -> tuple[list[BoundaryParity], str, str]:
    """`boundary_parity` against the layer-streamed reference: the stages one at a time, then the
    reference one layer at a time, keeping the hidden states after each stage's last layer."""
    from libs.model.streamed_reference import checkpoint_source, streamed_logits

    weights = RouteWeights(policy, tuple(backends), tuple(hops))
    cfg, plans, ours, build = _staged_run(checkpoint, ranges, weights, tolerance, decode_steps)
    source = checkpoint_source(checkpoint, policy, weights.reference_backend)
    streamed = streamed_logits(source, [p.tokens.tolist() for p in plans], keep_logits=True,
                               hidden_after=[end - 1 for _, end in ranges], expert_ids=True)
    assert streamed.logits is not None  # keep_logits
    ref = _captured(plans, streamed.logits, streamed.hidden_after, streamed.expert_ids)
    reference = (f"{streamed.reference}; {streamed.seconds:.1f} s, peak RSS "
                 f"{streamed.peak_rss_bytes / 2**20:.0f} MiB")
    return _figures(ours, ref, ranges, tolerance, weights), build, reference


def _staged_run(checkpoint: Path, ranges: Sequence[tuple[int, int]], weights: RouteWeights, tolerance: float,
                decode_steps: int) -> tuple[DeepseekV2Config, list[SequencePlan], Captured, str]:
    """The plan's ranges as stages in this process, one at a time, over the parity scenario."""
    cfg = load_config(checkpoint)
    check_reference_supports(cfg)
    plans = plan_sequences(cfg, decode_steps, seed=0)
    request = ParityRequest(checkpoint, len(ranges), weights.backends[0], decode_steps=decode_steps,
                            tolerance=tolerance, stage_backends=weights.backends, weights=weights.policy,
                            hop_dtypes=tuple(d.value for d in weights.hops))
    ours, build = run_ours(request, cfg, list(ranges), plans)
    return cfg, plans, ours, build


def _captured(plans: Sequence[SequencePlan], logits, hidden_after, expert_ids) -> Captured:
    """The streamed reference's per-sequence rows in the shape the whole reference captures."""
    def by_plan(rows) -> dict[str, list]:
        return {p.request_id: [r] for p, r in zip(plans, rows, strict=True)}

    return Captured({layer: by_plan(rows) for layer, rows in hidden_after.items()}, by_plan(logits),
                    {layer: by_plan(rows) for layer, rows in expert_ids.items()})


def _figures(ours: Captured, ref: Captured, ranges: Sequence[tuple[int, int]], tolerance: float,
             weights: RouteWeights) -> list[BoundaryParity]:
    diffs, experts = compare(ours, ref, list(ranges), tolerance)
    # Routed experts per MoE layer: the count of rows (of e.rows) whose expert set differs.
    routed = [BoundaryParity(f"layer {e.layer} experts: rows differing", float(e.mismatched_rows), 0.0,
                             gated=weights.exact) for e in experts]
    if not weights.exact:
        # Quantized activations (MAX block formats) or a rounding hop: the boundaries and experts
        # are stated, not gated, and the final logits are gated on top-1, as `fornax parity` does.
        inner = [BoundaryParity(d.label, d.max_abs_diff, tolerance, gated=False)
                 for d in diffs if d.label != "final logits"]
        top1 = top1_agreement(ours.logits, ref.logits)
        return [*inner, *routed, BoundaryParity("final logits", 1.0 - top1, 1.0 - MAX_BLOCK_TOP1_MIN, TOP1)]
    return [BoundaryParity(d.label, d.max_abs_diff, tolerance) for d in diffs] + routed
