"""`fornax parity --served`: the running fleet's greedy tokens against the layer-streamed reference.

A fixed, seeded prompt set goes to the fleet's OpenAI endpoint as greedy completions (token-id
prompts, `ignore_eos`, `return_token_ids`), one after another, with the fleet's own API key and
CA (`<state dir>/fleet.json`). The reference (`libs.model.streamed_reference`) then runs each
prompt + served continuation teacher-forced, one decoder layer at a time, and every served token
is scored against the reference's argmax after the route's own prefix
(`libs.model.served_agreement`). The gate is MAX_BLOCK_TOP1_MIN.

The reference's weights are the route's own artifacts by default: the orchestrator names each
stage's manifest hash, the artifact is found in the state directory (the builder's store or a
stage worker's cache), verified in full, and its tensors decoded as stored. With `--checkpoint`
the checkpoint is encoded by `--weights` for `--backend` instead, as the builder would.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import ssl
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from apps.cli.gate_output import finish_gate
from libs.service.errors import FailedPrecondition, FornaxError, Unavailable

if TYPE_CHECKING:
    from libs.model.served_agreement import Margins

# Where a fleet's artifacts sit under its state directory: the builder's store and each stage
# worker's cache, on the control host or a netns host (`hosts/<name>/...`).
ARTIFACT_SEARCH_DEPTH = 6
DEFAULT_PROMPTS = 8
DEFAULT_PROMPT_TOKENS = 16
DEFAULT_MAX_TOKENS = 16
PROMPT_SEED = 26


class ServedParityError(FailedPrecondition):
    default_reason = "SERVED_PARITY"


class ServedApiError(Unavailable):
    default_reason = "SERVED_API_UNREACHABLE"


@dataclass(frozen=True)
class RouteStage:
    layer_start: int
    layer_end: int
    manifest_hash: str


@dataclass(frozen=True)
class Evidence:
    figure_class: str
    cpu_model: str
    command: str
    model_snapshot: str
    artifact_digests: dict[str, list[str]]  # manifest hash -> "path sha256:<hex>" of each file read


@dataclass(frozen=True)
class PromptFigure:
    prompt_tokens: int
    served_tokens: int
    agreement: float
    first_miss: int | None


@dataclass(frozen=True)
class ServedParityReport:
    api: str
    route: list[RouteStage]
    stage_weights: list[str]
    backend: str
    reference: str
    prompts: list[PromptFigure]
    positions: int
    top1_agreement: float
    top1_min: float
    reference_seconds: float
    reference_peak_rss_bytes: int
    reference_growth_bytes: int
    largest_layer_f32_bytes: int
    served_seconds: float
    evidence: Evidence
    margins: Margins | None = None  # the reference's own gaps, and each miss's rank and gap
    # Each stage's block-format activations as the route reports them ("" on a numpy stage)
    stage_max_activations: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.top1_agreement >= self.top1_min


def add_arguments(parity: argparse.ArgumentParser) -> None:
    group = parity.add_argument_group("--served: the running fleet's route against the layer-streamed reference")
    group.add_argument("--served", action="store_true",
                       help="score the running fleet's greedy tokens against the layer-streamed reference of its "
                            "own artifacts (or of --checkpoint encoded by --weights)")
    group.add_argument("--state-dir", default=".fornax", help="the fleet's state directory (fleet.json)")
    group.add_argument("--prompts", type=int, default=DEFAULT_PROMPTS, help="seeded random-id prompts")
    group.add_argument("--prompt-tokens", type=int, default=DEFAULT_PROMPT_TOKENS)
    group.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="served tokens per prompt")
    group.add_argument("--seed", type=int, default=PROMPT_SEED, help="the prompt set's seed")


def run(args: argparse.Namespace) -> int:
    from libs.model.parity import MAX_BLOCK_TOP1_MIN

    try:
        _check_sizes(args)
        report = measure(args, MAX_BLOCK_TOP1_MIN)
    except FornaxError as exc:
        print(f"parity: {exc}", file=sys.stderr)
        return 2
    return finish_gate(report, args.json, format_report)


def _check_sizes(args: argparse.Namespace) -> None:
    for name in ("prompts", "prompt_tokens", "max_tokens"):
        if getattr(args, name) < 1:
            raise ServedParityError(f"--{name.replace('_', '-')} must be at least 1", reason="SERVED_PARITY_ARGUMENT",
                                    field=name)


def measure(args: argparse.Namespace, top1_min: float) -> ServedParityReport:
    from libs.model.served_agreement import margins, overall_agreement, prompt_agreement, teacher_forced_sequence
    from libs.model.streamed_reference import streamed_logits
    from libs.service.fleet_state import read_fleet
    from libs.service.host import cpu_name

    state = read_fleet(args.state_dir)
    if state is None or not state.api:
        raise ServedParityError(f"no running fleet with an API in {Path(args.state_dir, 'fleet.json')}",
                                reason="FLEET_NOT_RUNNING")
    api = _Api(state.api.rstrip("/"), os.environ.get("FORNAX_API_KEY") or state.api_key, state.api_ssl_context())
    model = api.model()
    execution = (model.get("fornax") or {}).get("execution") or {}
    route = route_stages(state, args.state_dir)
    source, digests = _reference_source(args, route, execution.get("backend") or "numpy")
    vocab = int((model.get("fornax") or {}).get("vocab_size") or 0)
    prompt_set = seeded_prompts(vocab, args.prompts, args.prompt_tokens, args.seed)
    started = time.perf_counter()
    served = [api.greedy_ids(model["id"], prompt, args.max_tokens) for prompt in prompt_set]
    served_seconds = time.perf_counter() - started
    reference = streamed_logits(source, [teacher_forced_sequence(p, s) for p, s in zip(prompt_set, served,
                                                                                        strict=True)],
                                keep_logits=True, progress=lambda line: print(f"  reference {line}", file=sys.stderr))
    scores = [prompt_agreement(p, s, top1) for p, s, top1 in zip(prompt_set, served, reference.top1, strict=True)]
    agreement, positions = overall_agreement(scores)
    evidence = Evidence("physical", cpu_name(), _command(args), str((model.get("fornax") or {}).get("model_snapshot")),
                        digests)
    return ServedParityReport(
        api=api.base, route=route, stage_weights=list(execution.get("stage_weights") or []),
        backend=str(execution.get("backend")), reference=reference.reference,
        prompts=[PromptFigure(s.prompt_tokens, s.positions, s.agreement, s.first_miss) for s in scores],
        positions=positions, top1_agreement=agreement, top1_min=top1_min, reference_seconds=reference.seconds,
        reference_peak_rss_bytes=reference.peak_rss_bytes, reference_growth_bytes=reference.growth_bytes,
        largest_layer_f32_bytes=reference.largest_layer_f32_bytes, served_seconds=served_seconds,
        evidence=evidence, margins=margins(prompt_set, served, reference.logits or ()),
        stage_max_activations=[str(m) for m in execution.get("stage_max_activations") or []])


def seeded_prompts(vocab: int, count: int, length: int, seed: int) -> list[list[int]]:
    from apps.bench.serve import prompts

    if vocab < 4:
        raise ServedParityError(f"the served model reports vocab_size {vocab}", reason="SERVED_MODEL_INVALID")
    return [list(p) for p in prompts(vocab, count, length, seed)]


def route_stages(state, state_dir: str) -> list[RouteStage]:
    """The serving route's stages in layer order, from the orchestrator's plan status."""
    import grpc

    from fornax.orchestrator.v1 import orchestrator_pb2 as pb
    from fornax.orchestrator.v1 import orchestrator_pb2_grpc as pb_grpc
    from libs.security.cli_credentials import cli_channel
    from libs.service.channels import open_channel

    try:
        orchestrator = next(s for s in state.services if s.kind == "orchestrator")
        with open_channel(orchestrator.grpc, cli_channel(state_dir)) as channel:
            stub = pb_grpc.OrchestratorServiceStub(channel)
            status = stub.GetPlanStatus(pb.GetPlanStatusRequest(), timeout=10).current
    except StopIteration:
        raise ServedParityError("the fleet has no orchestrator", reason="FLEET_NOT_RUNNING") from None
    except grpc.RpcError as exc:
        raise ServedApiError(f"the orchestrator's plan status: {exc.code().name} {exc.details()}",
                             reason="SERVED_ROUTE_UNREACHABLE") from None
    if len(status.routes) > 1:
        raise ServedParityError(f"the fleet serves {len(status.routes)} replica routes; the check scores one "
                                "route's artifacts", reason="SERVED_ROUTE_AMBIGUOUS")
    stages = [RouteStage(s.layer_range.layer_start, s.layer_range.layer_end_exclusive, s.manifest_hash)
              for s in status.stages]
    if not stages or any(not s.manifest_hash for s in stages):
        raise ServedParityError("no route is serving (the plan status names no stage artifacts)",
                                reason="SERVED_ROUTE_NOT_SERVING")
    return sorted(stages, key=lambda s: s.layer_start)


def find_artifact(state_dir: Path, manifest_hash: str) -> Path | None:
    """The artifact `manifest_hash` anywhere under the state directory, at most a few levels down."""
    from libs.artifacts.manifest import artifact_dir_name

    name = artifact_dir_name(manifest_hash)
    for root, dirs, _files in os.walk(state_dir):
        if name in dirs:
            return Path(root, name)
        if len(Path(root).relative_to(state_dir).parts) >= ARTIFACT_SEARCH_DEPTH:
            dirs.clear()
    return None


def _reference_source(args: argparse.Namespace, route: list[RouteStage], served_backend: str):
    from libs.artifacts.verify import verify_artifact
    from libs.model.streamed_reference import artifact_source, checkpoint_source

    if args.checkpoint is not None:
        backend = args.backend or served_backend
        return checkpoint_source(args.checkpoint, args.weights, backend), {
            s.manifest_hash: ["(not read: the reference decodes --checkpoint)"] for s in route}
    dirs, digests = [], {}
    for stage in route:
        found = find_artifact(Path(args.state_dir), stage.manifest_hash)
        if found is None:
            raise ServedParityError(
                f"the artifact {stage.manifest_hash} of layers [{stage.layer_start}, {stage.layer_end}) is not under "
                f"{args.state_dir}; run this where the fleet's state directory is readable, or give --checkpoint DIR "
                "--weights POLICY", reason="SERVED_ARTIFACTS_NOT_FOUND")
        verified = verify_artifact(found, expected_manifest_hash=stage.manifest_hash)
        dirs.append(found)
        digests[stage.manifest_hash] = [f"{f.path} sha256:{f.sha256}" for f in verified.manifest.files]
    return artifact_source(dirs), digests


class _Api:
    def __init__(self, base: str, key: str | None, tls: ssl.SSLContext | None):
        self.base, self._key, self._tls = base, key, tls

    def _call(self, path: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(self.base + path, data=None if body is None else json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        if self._key:
            request.add_header("Authorization", f"Bearer {self._key}")
        try:
            with urllib.request.urlopen(request, timeout=3600, context=self._tls) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            error = json.loads(exc.read() or b"{}").get("error") or {}
            raise ServedApiError(f"{path}: HTTP {exc.code} {error.get('code')}: {error.get('message')}",
                                 reason="SERVED_API_ERROR") from None
        except (urllib.error.URLError, OSError) as exc:
            raise ServedApiError(f"{self.base}{path}: {exc}") from None

    def model(self) -> dict:
        models = self._call("/models").get("data") or []
        if not models:
            raise ServedParityError("the API serves no model yet (no route installed)",
                                    reason="SERVED_ROUTE_NOT_SERVING")
        return models[0]

    def greedy_ids(self, model: str, prompt: list[int], max_tokens: int) -> list[int]:
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "return_token_ids": True}
        choice = (self._call("/completions", body).get("choices") or [{}])[0]
        ids = choice.get("token_ids")
        if not isinstance(ids, list) or len(ids) != max_tokens:
            raise ServedParityError(f"the completion returned {'no' if ids is None else len(ids)} token ids for "
                                    f"max_tokens {max_tokens} (an orchestrator without return_token_ids?)",
                                    reason="SERVED_TOKEN_IDS_MISSING")
        return [int(t) for t in ids]


def _command(args: argparse.Namespace) -> str:
    argv = ["fornax", "parity", "--served", "--state-dir", str(args.state_dir), "--prompts", str(args.prompts),
            "--prompt-tokens", str(args.prompt_tokens), "--max-tokens", str(args.max_tokens), "--seed", str(args.seed)]
    if args.checkpoint is not None:
        argv += ["--checkpoint", str(args.checkpoint), "--weights", args.weights]
        argv += ["--backend", args.backend] if args.backend else []
    return shlex.join(argv)


def format_report(report: ServedParityReport) -> str:
    e = report.evidence
    lines = [
        f"parity --served api={report.api} backend={report.backend} stage weights={','.join(report.stage_weights)}"
        + (f" max activations={','.join(m or '-' for m in report.stage_max_activations)}"
           if any(report.stage_max_activations) else ""),
        "route: " + ", ".join(f"[{s.layer_start},{s.layer_end}) {s.manifest_hash}" for s in report.route),
        f"reference: {report.reference}",
        f"reference cost: {report.reference_seconds:.1f} s, peak RSS {report.reference_peak_rss_bytes / 2**20:.0f} MiB "
        f"({report.reference_growth_bytes / 2**20:.0f} MiB over its baseline; largest decoded layer "
        f"{report.largest_layer_f32_bytes / 2**20:.0f} MiB); served in {report.served_seconds:.1f} s",
    ]
    for index, p in enumerate(report.prompts):
        miss = "" if p.first_miss is None else f", first miss at token {p.first_miss}"
        lines.append(f"  prompt {index}: {p.prompt_tokens} tokens, {p.served_tokens} served, "
                     f"top-1 agreement {p.agreement:.3f}{miss}")
    lines += [
        f"top-1 agreement with the reference: {report.top1_agreement:.3f} over {report.positions} served tokens",
        *_margin_lines(report.margins),
        f"evidence: {e.figure_class}; CPU {e.cpu_model}; command `{e.command}`; model snapshot {e.model_snapshot}; "
        f"artifacts {', '.join(e.artifact_digests)}",
        f"{'PASS' if report.passed else 'FAIL'} (top-1 >= {report.top1_min})",
    ]
    return "\n".join(lines)


def _margin_lines(m: Margins | None) -> list[str]:
    if m is None:
        return []
    lines = [f"reference's own first-to-second logit gap: p10 {m.first_second_gap_p10:.3f}, median "
             f"{m.first_second_gap_p50:.3f}, p90 {m.first_second_gap_p90:.3f} (logit std {m.logit_std:.3f})"]
    lines += [f"  miss: prompt {x.prompt} token {x.position}: served the reference's choice #{x.served_rank + 1}, "
              f"{x.gap:.4f} logits behind its first" for x in m.misses]
    return lines
