"""`fornax artifacts build|verify|inspect`: the artifact builder's core, run locally.

    fornax artifacts build --checkpoint DIR --stages N --out DIR     (or --plan FILE)
    fornax artifacts verify DIR        a stage artifact, or a build dir with stage-<i> links
    fornax artifacts inspect DIR       a checkpoint, a stage artifact, or a build dir
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path

from libs.artifacts.manifest import MANIFEST_FILE
from libs.common.kinds import FLOAT_DTYPES, DType
from libs.service.progress import Progress


def register(commands, benches) -> None:
    parser = commands.add_parser("artifacts", help="build, verify and inspect per-stage model artifacts")
    sub = parser.add_subparsers(dest="artifacts_command", metavar="ACTION", required=True)

    build = sub.add_parser("build", help="cut a checkpoint into verified per-stage artifacts")
    build.add_argument("--checkpoint", required=True, type=Path,
                       help="a Hugging Face checkpoint directory, or a deepseek2 .gguf file (its tensors keep "
                            "their stored formats; --weights does not apply)")
    cut = build.add_mutually_exclusive_group(required=True)
    cut.add_argument("--stages", type=int, help="cut into N stages of near-equal layer counts")
    cut.add_argument("--plan", type=Path, help="a fornax.planner.v1.Plan as JSON")
    build.add_argument("--out", required=True, type=Path)
    build.add_argument("--boundary-dtype", choices=sorted(FLOAT_DTYPES), default="fp32",
                       help="dtype of activations crossing stage boundaries (default fp32)")
    build.add_argument("--weights", choices=("fp32", "bf16", "q8_0", "q4_k_m"), default="fp32",
                       help="weight policy: the format each tensor is stored and served in (default fp32)")
    build.add_argument("--for-backend", choices=("numpy", "max"), default="numpy",
                       help="the backend the stages run on: max holds only formats MAX runs in-graph, converting "
                            "the rest once here (recorded per tensor in the manifest)")
    build.add_argument("--source", default="", help="lineage: where the checkpoint came from")
    build.add_argument("--revision", default="", help="lineage: the source revision")
    build.add_argument("--chunk-bytes", type=int, default=8 * 1024 * 1024, help="streaming copy chunk")
    build.add_argument("--registry", default=None, help="evidence registry address: register the snapshot")
    build.add_argument("--json", action="store_true", help="print the result as JSON")
    build.add_argument("--quiet", action="store_true", help="no progress (a bar on a terminal, lines otherwise)")
    build.set_defaults(func=_build)

    verify = sub.add_parser("verify", help="re-hash an artifact (or every stage of a build); non-zero on mismatch")
    verify.add_argument("dir", type=Path)
    verify.add_argument("--manifest-hash", default="", help="expected sha256:<hex> (single artifact)")
    verify.add_argument("--plan-hash", default="", help="expected plan hash")
    verify.set_defaults(func=_verify)

    inspect = sub.add_parser("inspect", help="describe a checkpoint snapshot, a stage artifact or a build dir")
    inspect.add_argument("dir", type=Path)
    inspect.add_argument("--source", default="")
    inspect.add_argument("--revision", default="")
    inspect.add_argument("--registry", default=None, help="evidence registry address: register the snapshot")
    inspect.add_argument("--json", action="store_true")
    inspect.set_defaults(func=_inspect)


def _load_plan(args: argparse.Namespace, num_layers: int):
    from services.artifact_builder.convert import plan_from_json
    from services.artifact_builder.staging import even_layer_ranges, plan_from_ranges

    if args.plan is not None:
        return plan_from_json(args.plan.read_text())
    return plan_from_ranges(even_layer_ranges(num_layers, args.stages))


def _build(args: argparse.Namespace) -> int:
    from libs.service.errors import FornaxError
    from services.artifact_builder.build import BuildOptions
    from services.artifact_builder.snapshot import inspect_checkpoint

    try:
        inspection = inspect_checkpoint(args.checkpoint, args.source, args.revision)
    except FornaxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        plan = _load_plan(args, inspection.config.num_hidden_layers)
        options = BuildOptions(args.out, DType(args.boundary_dtype), args.chunk_bytes, weights_policy=args.weights,
                               stage_backends=(args.for_backend,) * len(plan.stages))
        started = time.perf_counter()
        result = _run_build(inspection, plan, options, show_progress=not args.quiet)
        seconds = time.perf_counter() - started
        record_id = _register(args.registry, inspection)
    except FornaxError as exc:
        print(f"\nerror: {exc}", file=sys.stderr)
        _print_problems(inspection.problems)
        return 1
    _print_build(result, inspection.snapshot, record_id, args.out, args.json,
                 BuildFigures("gguf" if inspection.source_format == "gguf" else args.weights, seconds,
                              peak_rss_bytes()))
    return 0


@dataclasses.dataclass(frozen=True)
class BuildFigures:
    """Physical figures of this build process (this host, this command)."""

    weights_policy: str
    seconds: float
    peak_rss_bytes: int


def peak_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _run_build(inspection, plan, options, show_progress: bool):
    from services.artifact_builder.build import BuildProgress, build_stage_artifacts

    result, bar = None, None
    try:
        for event in build_stage_artifacts(inspection, plan, options):
            if not isinstance(event, BuildProgress):
                result = event
                continue
            if show_progress:
                bar = bar or Progress("building artifacts", event.bytes_total, "MiB", scale=2**20)
                bar.update(event.bytes_done, f"stage {event.stage_index} tensors "
                                             f"{event.tensors_done}/{event.tensors_total}")
    finally:
        if bar is not None:
            bar.close()
    return result


def _register(address: str | None, inspection) -> str:
    if not address:
        return ""
    from libs.security.cli_credentials import cli_channel
    from services.artifact_builder.evidence import register_snapshot

    return register_snapshot(address, inspection.snapshot, cli_channel())


def _print_build(result, snapshot, record_id: str, out: Path, as_json: bool, figures: BuildFigures) -> None:
    if as_json:
        document = {
            "weights_policy": figures.weights_policy,
            "build": {"evidence_class": "physical", "seconds": round(figures.seconds, 3),
                      "peak_rss_bytes": figures.peak_rss_bytes, "host": platform.node(),
                      "cpu": platform.processor() or platform.machine()},
            "plan_id": result.plan_id,
            "plan_hash": result.plan_hash,
            "snapshot_id": snapshot.snapshot_id,
            "model_record_id": record_id,
            "stages": [_stage_document(s) for s in result.stages],
        }
        print(json.dumps(document, indent=2))
        return
    print(f"snapshot {snapshot.snapshot_id}")
    print(f"plan     {result.plan_id} {result.plan_hash}")
    if record_id:
        print(f"model record {record_id} (contract evidence)")
    for s in result.stages:
        print(f"  {out / f'stage-{s.stage_index}'}  layers [{s.layer_start}, {s.layer_end})  "
              f"{s.weight_bytes:,} B {figures.weights_policy}  {s.manifest_hash}")
    print(f"build    {figures.seconds:.1f} s, peak RSS {figures.peak_rss_bytes / 2**20:.0f} MiB "
          f"(physical: this process on {platform.node()})")


def _stage_document(stage) -> dict:
    """A built stage in `--json`: the manifest's names (`layer_end_exclusive`), as printed before."""
    document = {**dataclasses.asdict(stage), "artifact_dir": str(stage.artifact_dir)}
    return {("layer_end_exclusive" if key == "layer_end" else key): value for key, value in document.items()}


def _verify(args: argparse.Namespace) -> int:
    from libs.artifacts.errors import ARTIFACT_ERRORS
    from libs.artifacts.verify import verify_artifact
    from services.artifact_builder.build import stage_links

    single = (args.dir / MANIFEST_FILE).exists() or not stage_links(args.dir)
    targets = [args.dir] if single else stage_links(args.dir)
    failures, plans, counts = 0, set(), set()
    for index, target in enumerate(targets):
        try:
            verified = verify_artifact(target, args.manifest_hash if single else "", args.plan_hash)
        except ARTIFACT_ERRORS as exc:
            print(f"FAIL {target}: {exc.reason}: {exc.message}")
            failures += 1
            continue
        manifest = verified.manifest
        if not single and manifest.stage_index != index:
            print(f"FAIL {target}: ARTIFACT_STAGE_MISMATCH: manifest says stage {manifest.stage_index}")
            failures += 1
            continue
        plans.add(manifest.plan.plan_hash)
        counts.add(manifest.stage_count)
        print(f"ok   {target}: stage {manifest.stage_index}/{manifest.stage_count} {verified.manifest_hash}")
    if not single and (len(plans) > 1 or counts != {len(targets)}):
        print(
            f"FAIL {args.dir}: ARTIFACT_PLAN_MISMATCH: stages disagree (plans {sorted(plans)}, counts {sorted(counts)})"
        )
        failures += 1
    return 1 if failures else 0


def _inspect(args: argparse.Namespace) -> int:
    from services.artifact_builder.build import stage_links

    if (args.dir / MANIFEST_FILE).exists():
        return _describe_artifacts([args.dir], args.json)
    if stage_links(args.dir):
        return _describe_artifacts(stage_links(args.dir), args.json)
    return _inspect_checkpoint(args)


def _describe_artifacts(dirs: list[Path], as_json: bool) -> int:
    from libs.artifacts.manifest import decode_manifest, manifest_hash, manifest_to_dict

    documents = []
    for d in dirs:
        manifest = decode_manifest((d / MANIFEST_FILE).read_bytes())
        documents.append(
            {"dir": str(d), "manifest_hash": manifest_hash(manifest), "manifest": manifest_to_dict(manifest)}
        )
        if not as_json:
            b_in, b_out = manifest.boundary_input, manifest.boundary_output
            print(
                f"{d}: stage {manifest.stage_index}/{manifest.stage_count} layers "
                f"[{manifest.layers.layer_start}, {manifest.layers.layer_end}) "
                f"{len(manifest.tensors)} tensors {manifest.weight_bytes:,} B"
                f"{' tied-head-copy' if manifest.tied_copies else ''}\n"
                f"  in {b_in.kind}/{b_in.dtype}/{b_in.width}  out {b_out.kind}/{b_out.dtype}/{b_out.width}\n"
                f"  plan {manifest.plan.plan_id} {manifest.plan.plan_hash}\n"
                f"  snapshot {manifest.source.snapshot_id}\n"
                f"  manifest {documents[-1]['manifest_hash']} (not re-verified)"
            )
    if as_json:
        print(json.dumps(documents, indent=2))
    return 0


def _inspect_checkpoint(args: argparse.Namespace) -> int:
    from libs.service.errors import FornaxError
    from services.artifact_builder.snapshot import inspect_checkpoint

    try:
        inspection = inspect_checkpoint(args.dir, args.source, args.revision)
        record_id = _register(args.registry, inspection) if inspection.valid else ""
    except FornaxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    snap = inspection.snapshot
    if args.json:
        document = {**dataclasses.asdict(snap), "checkpoint_dir": str(snap.checkpoint_dir),
                    "valid": inspection.valid, "model_record_id": record_id,
                    "problems": [dataclasses.asdict(p) for p in inspection.problems]}
        print(json.dumps(document, indent=2))
    else:
        print(f"snapshot {snap.snapshot_id}  {'valid' if inspection.valid else 'INVALID'}")
        print(
            f"  {snap.num_layers} layers, {snap.tensor_count} tensors, "
            f"{snap.total_tensor_bytes:,} B {snap.weight_dtype}, tied embeddings: {snap.tied_embeddings}"
        )
        for label, value in (("config", snap.config_sha256), ("tokenizer", snap.tokenizer_sha256),
                             ("chat template", snap.chat_template_sha256), ("index", snap.weight_index_sha256 or "-")):
            print(f"  {label:13} {value}")
        for shard in snap.shards:
            print(f"  shard {shard.path} {shard.size_bytes:,} B {shard.sha256}")
        if record_id:
            print(f"  model record {record_id} (contract evidence)")
        _print_problems(inspection.problems)
    return 0 if inspection.valid else 1


def _print_problems(problems) -> None:
    for p in problems[:50]:
        print(f"  {p.problem:11} {p.name}  expected {p.expected or '-'}  found {p.found or '-'}", file=sys.stderr)
    if len(problems) > 50:
        print(f"  ... {len(problems) - 50} more", file=sys.stderr)
