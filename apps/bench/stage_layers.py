"""`fornax bench stage`: per-layer prefill and decode latency, numpy vs max vs transformers.

All three run the same checkpoint weights in float32 activations on this host. Figures are
physical measurements and are labelled with host, builds, checkpoint and command. A backend
that cannot run is reported as unavailable with its reason; nothing is substituted.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from libs.model.bandwidth import decode_read_bytes, triad
from libs.model.config import DeepseekV2Config, load_config
from libs.model.errors import ModelError
from libs.model.executor import build_ragged_layout
from libs.model.kernels import LayerInputs, make_kernels
from libs.model.rope import rope_tables
from libs.model.weights import StageWeights, layer_read_sizes, load_stage_weights

DECODE_PAST = 128


@dataclass(frozen=True)
class Scenario:
    name: str
    sequences: int
    rows_per_sequence: int
    past_per_sequence: int


SCENARIOS = (
    Scenario("prefill S=128", 1, 128, 0),
    Scenario("prefill S=512", 1, 512, 0),
    Scenario("decode batch=1", 1, 1, DECODE_PAST),
    Scenario("decode batch=8", 8, 1, DECODE_PAST),
    Scenario("decode batch=32", 32, 1, DECODE_PAST),
)


@dataclass(frozen=True)
class BenchRow:
    scenario: str
    backend: str
    layer: int
    layer_kind: str
    median_ms: float
    min_ms: float
    # process CPU time (all threads) per call, median; on a shared host this moves less than wall
    median_cpu_ms: float = 0.0


@dataclass(frozen=True)
class BackendStatus:
    backend: str
    available: bool
    build: str
    detail: str


@dataclass(frozen=True)
class BenchReport:
    figure_class: str
    host: str
    source_revision: str
    command: str
    checkpoint: str
    checkpoint_config_sha256: str
    threads: str
    decode_past_tokens: int
    repeats: int
    backends: tuple[BackendStatus, ...]
    rows: tuple[BenchRow, ...]
    # speed-ups (other backend's ms / MAX ms; > 1: MAX faster) from the medians, mean over the
    # layers of each kind; None where a backend or scenario was not measured
    ratios: dict[str, float | None] = field(default_factory=dict)
    load_average: str = ""  # /proc/loadavg at the start and the end of the run
    weights_policy: str = "fp32"
    # STREAM-style triad of this host in the same run (physical), and per backend and decode
    # scenario the weight bytes a layer's step reads over its median time
    triad_bytes_per_s: float = 0.0
    triad_threads: int = 0
    weight_reads: tuple[WeightRead, ...] = ()


@dataclass(frozen=True)
class WeightRead:
    backend: str
    scenario: str
    layer: int
    layer_kind: str
    read_bytes: float   # dense part + the routed experts a batch of that many rows touches (expected)
    bytes_per_s: float


# (ratio key, scenario, layer kind) of the MAX vs transformers speed-ups the report carries
TRANSFORMERS_RATIOS = (
    ("max_vs_transformers_prefill512_dense", "prefill S=512", "dense"),
    ("max_vs_transformers_prefill512_moe", "prefill S=512", "moe"),
    ("max_vs_transformers_decode32_dense", "decode batch=32", "dense"),
    ("max_vs_transformers_decode32_moe", "decode batch=32", "moe"),
)


def mean_ms(rows: tuple[BenchRow, ...] | list[BenchRow], backend: str, scenario: str, kind: str) -> float | None:
    picked = [r.median_ms for r in rows if (r.backend, r.scenario, r.layer_kind) == (backend, scenario, kind)]
    return statistics.fmean(picked) if picked else None


def speedup_ratios(rows: tuple[BenchRow, ...] | list[BenchRow]) -> dict[str, float | None]:
    """The ratio keys of `fornax bench stage --json`: MAX vs transformers on the four target
    cells, and `max_vs_numpy_min`, the smallest numpy-ms / MAX-ms over every scenario and kind."""

    def ratio(other: str, scenario: str, kind: str) -> float | None:
        theirs, ours = mean_ms(rows, other, scenario, kind), mean_ms(rows, "max", scenario, kind)
        return None if theirs is None or not ours else round(theirs / ours, 3)

    ratios = {key: ratio("transformers", scenario, kind) for key, scenario, kind in TRANSFORMERS_RATIOS}
    cells = dict.fromkeys((r.scenario, r.layer_kind) for r in rows)
    vs_numpy = [v for v in (ratio("numpy", s, k) for s, k in cells) if v is not None]
    ratios["max_vs_numpy_min"] = min(vs_numpy) if vs_numpy else None
    return ratios


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


Runner = Callable[[Scenario, int], float]  # (scenario, layer) -> seconds for one call


def host_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.node()} {cpu} ({os.cpu_count()} logical cpus), {platform.system()} {platform.release()}"


def layer_inputs(cfg: DeepseekV2Config, scenario: Scenario, seed: int = 0) -> LayerInputs:
    rng = np.random.default_rng(seed)
    rows = scenario.sequences * scenario.rows_per_sequence
    past = scenario.sequences * scenario.past_per_sequence
    layout = build_ragged_layout(
        [scenario.past_per_sequence] * scenario.sequences, [scenario.rows_per_sequence] * scenario.sequences
    )
    cos, sin = rope_tables(cfg).cos_sin(layout.positions)
    return LayerInputs(
        hidden=rng.standard_normal((rows, cfg.hidden_size), dtype=np.float32),
        rope_cos=cos, rope_sin=sin,
        past_latent=rng.standard_normal((past, cfg.kv_lora_rank), dtype=np.float32),
        past_k_rope=rng.standard_normal((past, cfg.qk_rope_head_dim), dtype=np.float32),
        mask=layout.mask,
    )


def kernel_runner(kernels, cfg: DeepseekV2Config) -> Runner:
    cache: dict[str, LayerInputs] = {}

    def run(scenario: Scenario, layer: int) -> float:
        inputs = cache.setdefault(scenario.name, layer_inputs(cfg, scenario))
        start = time.perf_counter()
        kernels.decoder_layer(layer, inputs)
        return time.perf_counter() - start

    return run


def time_backend(runner: Runner, backend: str, cfg: DeepseekV2Config, layers: range, repeats: int) -> list[BenchRow]:
    rows = []
    for scenario in SCENARIOS:
        for layer in layers:
            runner(scenario, layer)  # warm-up (first-call allocation, lazy compile)
            samples, cpu = [], []
            for _ in range(repeats):
                cpu_start = time.process_time()
                samples.append(runner(scenario, layer))
                cpu.append(time.process_time() - cpu_start)
            kind = "moe" if cfg.is_moe_layer(layer) else "dense"
            rows.append(BenchRow(scenario.name, backend, layer, kind, 1e3 * statistics.median(samples),
                                 1e3 * min(samples), 1e3 * statistics.median(cpu)))
    return rows


def make_runner(backend: str, checkpoint: Path, cfg: DeepseekV2Config, weights: StageWeights) -> tuple[Runner, str]:
    if backend == "transformers":
        from libs.model.bench_transformers import transformers_runner

        return transformers_runner(checkpoint, cfg, weights)
    kernels = make_kernels(backend, cfg, weights, "cpu")
    return kernel_runner(kernels, cfg), kernels.build


def run_bench(checkpoint: Path, backends: list[str], layer_count: int, repeats: int,
              policy: str = "fp32") -> BenchReport:
    cfg = load_config(checkpoint)
    layer_count = min(layer_count, cfg.num_hidden_layers)
    load_at_start = load_average()
    measured_triad = triad() if policy != "fp32" else None
    statuses, rows, reads = [], [], []
    for entry in backends:
        # "max" runs the policy; "max:fp32" the same backend in another policy, side by side
        backend, _, entry_policy = entry.partition(":")
        weights = load_stage_weights(checkpoint, cfg, 0, layer_count, first=False, last=False,
                                     policy=entry_policy or policy, backend="max" if backend == "max" else "numpy")
        try:
            runner, build = make_runner(backend, checkpoint, cfg, weights)
        except (ModelError, ImportError) as exc:
            statuses.append(BackendStatus(entry, False, "", f"unavailable, not measured: {exc}"))
            continue
        statuses.append(BackendStatus(entry, True, build, "measured"))
        timed = time_backend(runner, entry, cfg, range(layer_count), repeats)
        rows.extend(timed)
        reads.extend(weight_reads(cfg, weights, timed))
        del runner, weights
    ratios = speedup_ratios(rows)
    if measured_triad is not None:
        ratios.update(triad_ratios(reads, measured_triad.bytes_per_s))
    ratios.update(policy_ratios(rows, policy))
    config_hash = hashlib.sha256((checkpoint / "config.json").read_bytes()).hexdigest()
    return BenchReport(
        figure_class="physical (wall-clock per decoder-layer call, float32 activations, this host)",
        host=host_description(),
        source_revision=source_revision(),
        command=" ".join(["fornax", *sys.argv[1:]]) if sys.argv else "fornax bench stage",
        checkpoint=str(checkpoint),
        checkpoint_config_sha256=config_hash,
        threads=_thread_note(),
        decode_past_tokens=DECODE_PAST,
        repeats=repeats,
        backends=tuple(statuses),
        rows=tuple(rows),
        ratios=ratios,
        load_average=f"{load_at_start} at start, {load_average()} at end",
        weights_policy=policy,
        triad_bytes_per_s=measured_triad.bytes_per_s if measured_triad else 0.0,
        triad_threads=measured_triad.threads if measured_triad else 0,
        weight_reads=tuple(reads),
    )


def weight_reads(cfg: DeepseekV2Config, weights: StageWeights, timed: list[BenchRow]) -> list[WeightRead]:
    out = []
    for row in timed:
        scenario = next(s for s in SCENARIOS if s.name == row.scenario)
        if scenario.rows_per_sequence != 1:
            continue  # decode only: prefill is bound by compute, not by reading weights
        dense, per_expert, experts = layer_read_sizes(weights.layer(row.layer))
        read = decode_read_bytes(dense, per_expert, experts, cfg.num_experts_per_tok, scenario.sequences)
        out.append(WeightRead(row.backend, row.scenario, row.layer, row.layer_kind, read, read / (row.median_ms / 1e3)))
    return out


def policy_ratios(rows: list[BenchRow], policy: str) -> dict[str, float | None]:
    """`<policy>_vs_fp32_<scenario>_<backend>`: a backend's fp32 ms over its policy ms (mean over
    layers; > 1: the policy is faster), where the run measured both ("max" and "max:fp32")."""
    ratios: dict[str, float | None] = {}
    for row in rows:
        backend = row.backend
        if ":" in backend:
            continue
        fp32 = [r.median_ms for r in rows if (r.backend, r.scenario) == (f"{backend}:fp32", row.scenario)]
        ours = [r.median_ms for r in rows if (r.backend, r.scenario) == (backend, row.scenario)]
        if fp32 and ours and policy != "fp32":
            key = f"{policy}_vs_fp32_{row.scenario.replace(' ', '_').replace('=', '')}_{backend}"
            ratios[key] = round(statistics.fmean(fp32) / statistics.fmean(ours), 3)
    return ratios


def triad_ratios(reads: list[WeightRead], triad_bytes_per_s: float) -> dict[str, float | None]:
    """`weight_read_vs_triad_decode<N>_<backend>`: mean over the layers of weight bytes read per
    second at decode batch N, against the triad in the same run."""
    ratios: dict[str, float | None] = {}
    for read in reads:
        batch = read.scenario.rsplit("=", 1)[-1]
        key = f"weight_read_vs_triad_decode{batch}_{read.backend}"
        same = [r.bytes_per_s for r in reads if (r.backend, r.scenario) == (read.backend, read.scenario)]
        ratios[key] = round(statistics.fmean(same) / triad_bytes_per_s, 3)
    return ratios


def source_revision() -> str:
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def _thread_note() -> str:
    keys = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    return ", ".join(f"{k}={os.environ.get(k, 'unset')}" for k in keys)


def format_bench(report: BenchReport) -> str:
    lines = [
        f"bench stage: {report.figure_class}",
        f"host: {report.host}; fornax revision {report.source_revision}",
        f"command: {report.command}",
        f"checkpoint: {report.checkpoint} (config sha256 {report.checkpoint_config_sha256[:16]})",
        f"threads: {report.threads}; repeats={report.repeats}; decode past={report.decode_past_tokens} tokens/seq",
        f"load average: {report.load_average}",
        f"weights: {report.weights_policy}",
    ]
    if report.triad_bytes_per_s:
        lines.append(f"triad (STREAM-style, {report.triad_threads} threads, this run): "
                     f"{report.triad_bytes_per_s / 1e9:.2f} GB/s")
    for status in report.backends:
        lines.append(f"backend {status.backend}: {status.build or '-'} {status.detail}")
    measured = [s.backend for s in report.backends if s.available]
    lines.append(f"{'scenario':<18}{'layer':>6} {'kind':<6}" + "".join(f"{b + ' ms (cpu)':>24}" for b in measured))
    keys = dict.fromkeys((r.scenario, r.layer, r.layer_kind) for r in report.rows)
    table = {(r.scenario, r.layer, r.backend): r for r in report.rows}
    for scenario, layer, kind in keys:
        cells = "".join(
            f"{table[(scenario, layer, b)].median_ms:>14.3f} ({table[(scenario, layer, b)].median_cpu_ms:>7.2f})"
            for b in measured)
        lines.append(f"{scenario:<18}{layer:>6} {kind:<6}{cells}")
    for r in report.weight_reads:
        lines.append(f"weight read {r.backend:<12} {r.scenario:<16} layer {r.layer} ({r.layer_kind}): "
                     f"{r.read_bytes / 1e6:8.2f} MB in {r.read_bytes / r.bytes_per_s * 1e3:7.3f} ms = "
                     f"{r.bytes_per_s / 1e9:6.2f} GB/s")
    lines.append("speed-ups (other ms / max ms, mean over layers of a kind): " + ", ".join(
        f"{key}={'-' if value is None else f'{value:.2f}'}" for key, value in report.ratios.items()))
    return "\n".join(lines)


def default_checkpoint() -> Path:
    from libs.model.checkpoint_gen import CheckpointRequest, write_checkpoint

    path = Path(os.environ.get("FORNAX_BENCH_CHECKPOINT", ".fornax/bench/small-seed0"))
    if not (path / "config.json").exists():
        print(f"bench: generating the small preset checkpoint at {path}", file=sys.stderr)
        write_checkpoint(CheckpointRequest("small", path, seed=0))
    return path


def run_bench_cli(args) -> int:
    checkpoint = args.checkpoint or default_checkpoint()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    report = run_bench(checkpoint, backends, args.layers, args.repeats, getattr(args, "weights", "fp32"))
    print(json.dumps(asdict(report), indent=2) if args.json else format_bench(report))
    return 0 if any(s.available for s in report.backends) else 1
