"""`fornax parity --checkpoint FILE.gguf`: the backend's stages against numpy stages over the
file's own weights (`libs.model.stored_parity`), each side from its own build of the file.

The builds go to a temporary directory and are removed after the run; the figure is physical
(this host's CPU, this command, the file's snapshot).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
from pathlib import Path

from apps.cli.gate_output import finish_gate

REFERENCE_BACKEND = "numpy"


def refusal(args: argparse.Namespace) -> str | None:
    """What `fornax parity` cannot do with a GGUF, or None."""
    if args.weights != "fp32":
        return "a GGUF keeps the formats it stores: drop --weights (its own weights are the reference)"
    if args.against_source or args.kv_dtype != "fp32":
        return "a GGUF has no unquantized source to score against, and its parity runs float32 KV: " \
               "drop --against-source and --kv-dtype"
    return None


def run(args: argparse.Namespace) -> int:
    from libs.model.max_kernels import configure_max_process, default_cache_dir
    from libs.model.stored_parity import (
        Evidence,
        StoredParityRequest,
        format_stored_report,
        run_stored_parity,
    )
    from libs.service.errors import FornaxError
    from libs.service.host import cpu_name
    from services.artifact_builder.snapshot import inspect_checkpoint

    problem = refusal(args)
    if problem:
        print(f"parity: {problem}", file=sys.stderr)
        return 2
    # this command is its process's entry point: MAX graphs compile into the shared cache
    configure_max_process(os.environ, default_cache_dir(os.environ))
    try:
        inspection = inspect_checkpoint(args.checkpoint)
        with tempfile.TemporaryDirectory(prefix="fornax-gguf-parity-") as tmp:
            dirs = {backend: _build(inspection, args.stages, backend, Path(tmp, backend))
                    for backend in dict.fromkeys((args.backend, REFERENCE_BACKEND))}
            evidence = Evidence("physical", cpu_name(), _command(args), inspection.snapshot.snapshot_id)
            report = run_stored_parity(StoredParityRequest(
                checkpoint=args.checkpoint, backend=args.backend, stage_dirs=dirs[args.backend],
                reference_dirs=dirs[REFERENCE_BACKEND], conversions=_conversions(dirs[args.backend]),
                evidence=evidence, device=args.device, decode_steps=args.decode_steps,
                max_activations=args.max_activations))
    except FornaxError as exc:
        print(f"parity: {exc}", file=sys.stderr)
        return 2
    return finish_gate(report, args.json, format_stored_report)


def _command(args: argparse.Namespace) -> str:
    """The command that reproduces this run (the options that shape it)."""
    return shlex.join(["fornax", "parity", "--checkpoint", str(args.checkpoint), "--backend", args.backend,
                       "--stages", str(args.stages), "--device", args.device,
                       "--decode-steps", str(args.decode_steps), "--max-activations", args.max_activations])


def _build(inspection, stages: int, backend: str, out: Path) -> tuple[Path, ...]:
    """The file cut into `stages` even stages, built for `backend`; the stage directories."""
    from libs.common.kinds import DType
    from services.artifact_builder.build import BuildOptions, BuildResult, build_stage_artifacts
    from services.artifact_builder.staging import even_layer_ranges, plan_from_ranges

    plan = plan_from_ranges(even_layer_ranges(inspection.config.num_hidden_layers, stages))
    options = BuildOptions(out, DType.FP32, stage_backends=(backend,) * stages)
    result = [event for event in build_stage_artifacts(inspection, plan, options) if isinstance(event, BuildResult)]
    return tuple(stage.artifact_dir for stage in result[-1].stages)


def _conversions(stage_dirs: tuple[Path, ...]) -> tuple[str, ...]:
    from libs.artifacts.conversions import conversion_summary
    from libs.artifacts.manifest import MANIFEST_FILE, decode_manifest

    return tuple(f"stage {i}: {line}" for i, d in enumerate(stage_dirs)
                 for line in conversion_summary(decode_manifest((d / MANIFEST_FILE).read_bytes())))
