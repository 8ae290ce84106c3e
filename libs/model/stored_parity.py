"""Top-1 agreement of a backend's stages with numpy stages over the same file's own weights.

For a GGUF, whose tensors have no unquantized source to compare with: the stages under test
load the artifacts built for their backend (a MAX stage holds each tensor in its stored format
where MAX runs it in-graph, and the recorded build-time conversion where it does not); the
reference stages load the artifacts built for numpy, which hold every tensor exactly as the file
stores it and decode it to float32 in the layer code. Both run the parity scenario
(`libs.model.parity`: ragged prefill, teacher-forced decodes, a late prefill). MAX's block
products quantize activations, and a converted tensor is not the stored one, so the gate is
top-1 agreement of the final logits, not a tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from libs.model.config import load_config
from libs.model.parity import (
    MAX_BLOCK_TOP1_MIN,
    ParityRequest,
    plan_sequences,
    run_ours,
    split_layers,
    top1_agreement,
)

REFERENCE_BACKEND = "numpy"


@dataclass(frozen=True)
class Evidence:
    """Where a physical figure came from: the CPU, the command and the checkpoint snapshot."""

    figure_class: str  # "physical"
    cpu_model: str
    command: str
    snapshot_id: str


@dataclass(frozen=True)
class StoredParityReport:
    checkpoint: str
    backend: str
    backend_build: str
    reference: str
    stage_ranges: tuple[tuple[int, int], ...]
    positions: int
    top1_vs_reference: float
    top1_min: float
    conversions: tuple[str, ...]  # "tensor: why" for every tensor the tested stages hold converted
    evidence: Evidence

    @property
    def passed(self) -> bool:
        return self.top1_vs_reference >= self.top1_min


@dataclass(frozen=True)
class StoredParityRequest:
    checkpoint: Path                 # the file both builds came from
    backend: str                     # the backend under test
    stage_dirs: tuple[Path, ...]     # its stages' artifacts, built for `backend`
    reference_dirs: tuple[Path, ...]  # the same split, built for numpy (the file's own formats)
    conversions: tuple[str, ...]
    evidence: Evidence
    device: str = "cpu"
    decode_steps: int = 8
    seed: int = 0
    max_activations: str = "int8"  # `ParityRequest.max_activations`


def run_stored_parity(request: StoredParityRequest) -> StoredParityReport:
    if len(request.stage_dirs) != len(request.reference_dirs):
        raise ValueError(f"{len(request.stage_dirs)} stages under test, {len(request.reference_dirs)} references")
    cfg = load_config(request.stage_dirs[0])
    ranges = split_layers(cfg.num_hidden_layers, len(request.stage_dirs))
    plans = plan_sequences(cfg, request.decode_steps, request.seed)
    tested = ParityRequest(checkpoint_dir=request.checkpoint, stages=len(ranges), backend=request.backend,
                           device=request.device, decode_steps=request.decode_steps, seed=request.seed,
                           stage_dirs=request.stage_dirs, max_activations=request.max_activations)
    ours, build = run_ours(tested, cfg, ranges, plans)
    reference = replace(tested, backend=REFERENCE_BACKEND, stage_dirs=request.reference_dirs)
    ref, ref_build = run_ours(reference, cfg, ranges, plans)
    return StoredParityReport(
        checkpoint=str(request.checkpoint), backend=request.backend, backend_build=build,
        reference=f"{ref_build} stages over the same file's tensors as stored, decoded to float32",
        stage_ranges=tuple(ranges), positions=sum(p.tokens.size for p in plans),
        top1_vs_reference=top1_agreement(ours.logits, ref.logits), top1_min=MAX_BLOCK_TOP1_MIN,
        conversions=request.conversions, evidence=request.evidence)


def format_stored_report(report: StoredParityReport) -> str:
    e = report.evidence
    lines = [
        f"parity checkpoint={report.checkpoint} backend={report.backend} ({report.backend_build}) "
        f"stages={len(report.stage_ranges)} weights=as stored",
        f"reference: {report.reference}",
        f"held converted on the {report.backend} stages ({len(report.conversions)} kinds, each counted):"
        + "".join(f"\n  {c}" for c in report.conversions),
        f"top-1 agreement with the reference: {report.top1_vs_reference:.3f} over {report.positions} "
        "teacher-forced positions",
        f"evidence: {e.figure_class}; CPU {e.cpu_model}; command `{e.command}`; snapshot {e.snapshot_id}",
        f"{'PASS' if report.passed else 'FAIL'} (top-1 >= {report.top1_min})",
    ]
    return "\n".join(lines)
