"""Measured stage and link profiles, and route calibrations: the physical evidence placement rests on.

Pure values with one canonical JSON form each (the blob of a registry record). Every time here
is a physical measurement, repeated: a `Figure` keeps the median, the spread and the number of
runs, so a figure is never printed without its spread.

Registry conventions (the record's labels say what its blob is):
- a stage profile: type `measurement`, class `physical`, labels `profile=stage`, `host=<name>`,
  `backend=<backend>` (and `max_activations=<mode>` on a max profile); subject `stage-profile:<host>`;
- a link profile: type `measurement`, class `physical`, labels `profile=link`, `from_host`,
  `to_host`; subject `link-profile:<from>-><to>`;
- a route calibration: type `calibration`, class `physical`, labels `route_key=<key>`,
  `passed=true|false`; subject `calibration:<route key>`.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from libs.common.kinds import BLOCK_ACTIVATIONS
from libs.profiles.sustained_clock import SUSTAINED, WALL, describe_timing

STAGE_PROFILE_SCHEMA = "fornax.stage-profile/1"
LINK_PROFILE_SCHEMA = "fornax.link-profile/1"
CALIBRATION_SCHEMA = "fornax.calibration/1"
GATE, SERVING_WINDOW = "gate", "serving-window"  # what a calibration record is (`Calibration.purpose`)
CALIBRATION_PURPOSES = (GATE, SERVING_WINDOW)

# Layer kinds a stage profile measures. `embed` and `head` are the end stages' extra work.
LAYER_KINDS = ("dense", "moe", "embed", "head")
PREFILL_LENGTHS = (16, 128, 512)
DECODE_BATCHES = (1, 8, 32)
# Past tokens of every decode row the decode figures are measured at. A decode microbatch's
# attention reads rows x past, so on a host where attention dominates the cost of a step moves
# with the context as much as with the rows; predictions interpolate in both.
DECODE_CONTEXTS = (32, 128, 512)
# The block-format activations a MAX stage's weight products run in; the first is the default.
MAX_BACKEND = "max"
MAX_ACTIVATIONS = BLOCK_ACTIVATIONS
DEFAULT_MAX_ACTIVATIONS = MAX_ACTIVATIONS[0]
LINK_RTT_BYTES = 32 * 1024
LINK_THROUGHPUT_BYTES = 16 * 1024 * 1024

LABEL_PROFILE = "profile"
LABEL_HOST = "host"
LABEL_BACKEND = "backend"
LABEL_MAX_ACTIVATIONS = "max_activations"  # a max stage profile's `StageProfile.max_activations`
LABEL_FROM_HOST = "from_host"
LABEL_TO_HOST = "to_host"
LABEL_ROUTE_KEY = "route_key"
LABEL_PASSED = "passed"
LABEL_PURPOSE = "purpose"  # a calibration record's `Calibration.purpose`


class ProfileFormatError(ValueError):
    """A profile blob that is not what its schema says."""


@dataclass(frozen=True)
class Figure:
    """A repeated physical measurement: median, smallest and largest run, and the run count."""

    median: float
    low: float
    high: float
    runs: int
    unit: str

    @classmethod
    def of(cls, samples: Sequence[float], unit: str) -> Figure:
        if not samples:
            raise ProfileFormatError("a figure needs at least one run")
        return cls(float(statistics.median(samples)), float(min(samples)), float(max(samples)), len(samples), unit)

    @property
    def spread(self) -> float:
        """(high - low) / median: 0 for perfectly repeatable runs."""
        return (self.high - self.low) / self.median if self.median else 0.0

    def describe(self) -> str:
        return f"{self.median:.6g} {self.unit} (runs {self.runs}, spread {self.spread:.1%})"


@dataclass(frozen=True)
class HostFacts:
    """The host a profile was measured on, as its cgroup enforced it."""

    host: str
    cpu_model: str
    cpu_quota_cores: float  # 0: no quota
    cpuset: str
    memory_limit_bytes: int  # 0: no limit
    # Hosts (comma-separated) whose cpusets overlap this one's on the same box; empty: none known.
    cpu_shared_with: str = ""

    def describe(self) -> str:
        quota = f"{self.cpu_quota_cores:g} cores" if self.cpu_quota_cores else "no quota"
        memory = f"{self.memory_limit_bytes / 2**30:.1f} GiB" if self.memory_limit_bytes else "no limit"
        shared = f", SHARES a CPU with {self.cpu_shared_with}" if self.cpu_shared_with else ""
        return f"{self.host}: {self.cpu_model}, {quota}, cpuset {self.cpuset or '?'}{shared}, memory {memory}"


@dataclass(frozen=True)
class LayerKindProfile:
    """One layer kind on one host. Prefill: seconds per token at each prompt length S.
    Decode: seconds per microbatch (one token for each of `batch` rows) at each batch size."""

    kind: str  # one of LAYER_KINDS
    prefill_s_per_token: dict[int, Figure]
    decode_s_per_microbatch: dict[int, Figure]
    resident_bytes: int  # weights of one layer of this kind as the backend holds them
    kv_bytes_per_token: int  # 0 for embed and head
    # Decode seconds per microbatch at each measured past (context -> batch -> figure); the
    # profile's `context_tokens` entry equals `decode_s_per_microbatch`. Empty for embed and head
    # (no past) and in profiles that predate the context grid.
    decode_s_by_context: dict[int, dict[int, Figure]] = field(default_factory=dict)


@dataclass(frozen=True)
class ResidentSample:
    """The stage worker's resident memory at one point of its profile (`/proc/self/smaps`)."""

    point: str  # e.g. "after load of layers [0, 3)", "after steps of layers [0, 3)"
    rss_bytes: int  # every resident page of the process (the sum of its mappings' Rss)
    anon_bytes: int  # of which anonymous (heap, allocator arenas, copy-on-write copies)
    weight_file_bytes: int  # of which file pages of the weight files it maps (the plan counts them as weights)
    weight_copy_bytes: int  # weights it holds as arrays of its own (converted, not mapped): weights too
    kv_bytes: int  # bytes its KV stores held (the plan counts them as KV)

    @property
    def runtime_bytes(self) -> int:
        """What the process holds beyond its weights and KV: interpreter, gRPC, backend runtime and
        its libraries, compiled graphs, allocator slack and any copy a backend made of its own."""
        return max(0, self.rss_bytes - self.weight_file_bytes - self.weight_copy_bytes - self.kv_bytes)


@dataclass(frozen=True)
class RuntimeResident:
    """The stage worker's own resident memory, as its profile measured it (physical): the largest
    `runtime_bytes` over samples taken after each profiled range loaded and after its timed steps.
    The planner holds `reserve_bytes` back on the host in place of a declared reserve."""

    samples: tuple[ResidentSample, ...]
    method: str = ("VmRSS from /proc/self/smaps, less the file pages of mapped weight files and the weights held "
                   "as converted arrays, less the bytes of live KV stores; largest sample after load and after the "
                   "profiled steps")

    @property
    def reserve_bytes(self) -> int:
        return max((s.runtime_bytes for s in self.samples), default=0)


@dataclass(frozen=True)
class StageProfile:
    host: HostFacts
    worker: str  # the stage worker's fleet identity (spiffe://fornax/stage/<name>)
    backend: str
    backend_build: str
    device: str
    model_snapshot: str  # sha256:<hex> of the checkpoint
    dtype: str
    context_tokens: int
    concurrency: int
    kinds: tuple[LayerKindProfile, ...]
    command: str
    measured_unix_ns: int
    valid_for_s: int
    # Seconds per served decode microbatch beyond its layers' own time, per batch size: the
    # executor's step (KV gather and append, mask and positions, sampling on the head stage) and
    # the data plane's unpack and pack of the boundary tensor. Measured by timing whole served
    # steps and subtracting the layer, embed and head figures. Empty in profiles that predate it.
    step_s_per_microbatch: dict[int, Figure] = field(default_factory=dict)
    # The step overhead at each measured past (context -> batch -> figure); empty in profiles
    # that predate the context grid.
    step_s_by_context: dict[int, dict[int, Figure]] = field(default_factory=dict)
    # The weight policy of the weights timed (libs.weights.policy); "fp32" in profiles that
    # predate it, which timed float32 weights.
    weights_policy: str = "fp32"
    # The worker's own resident memory beyond weights and KV; None in profiles that predate it.
    runtime_resident: RuntimeResident | None = None
    # The block-format activations its MAX graphs were timed in (`MaxOptions.block_activations`):
    # "int8" or "float32" on a max profile ("" reads as "int8": what every MAX profile timed
    # before the mode was recorded), "" on a numpy profile (it has none).
    max_activations: str = ""
    # How its figures were timed (`libs.profiles.sustained_clock`): "sustained" on a host with a CPU
    # quota, "wall" without one and in profiles that predate it.
    timing: str = WALL
    schema: str = STAGE_PROFILE_SCHEMA

    def __post_init__(self) -> None:
        if self.backend == MAX_BACKEND and not self.max_activations:
            object.__setattr__(self, "max_activations", DEFAULT_MAX_ACTIVATIONS)
        if self.backend == MAX_BACKEND and self.max_activations not in MAX_ACTIVATIONS:
            raise ProfileFormatError(f"max_activations {self.max_activations!r} is none of {MAX_ACTIVATIONS}")
        if self.timing not in (WALL, SUSTAINED):
            raise ProfileFormatError(f"timing {self.timing!r} is neither {WALL!r} nor {SUSTAINED!r}")
        if self.backend != MAX_BACKEND and self.max_activations:
            raise ProfileFormatError(f"max_activations {self.max_activations!r} on a {self.backend} profile "
                                     "(only a max profile times block-format activations)")

    @property
    def timing_label(self) -> str:
        return describe_timing(self.timing, self.host.cpu_quota_cores)

    @property
    def activations_label(self) -> str:
        """"int8 activations" / "float32 activations" on a max profile; "" on a numpy one."""
        return f"{self.max_activations} activations" if self.max_activations else ""

    def kind(self, name: str) -> LayerKindProfile | None:
        return next((k for k in self.kinds if k.kind == name), None)

    def decode_grid(self, kind: LayerKindProfile) -> dict[int, dict[int, Figure]]:
        """context -> batch -> decode figure of `kind`; a profile without a context grid has one
        context, its `context_tokens`."""
        return kind.decode_s_by_context or {self.context_tokens: kind.decode_s_per_microbatch}

    def step_grid(self) -> dict[int, dict[int, Figure]]:
        """context -> batch -> step overhead figure (empty: no step overhead measured)."""
        if self.step_s_by_context:
            return self.step_s_by_context
        return {self.context_tokens: self.step_s_per_microbatch} if self.step_s_per_microbatch else {}

    @property
    def decode_contexts(self) -> tuple[int, ...]:
        """Every past the decode figures were measured at, ascending."""
        found = {c for k in self.kinds for c in k.decode_s_by_context} | set(self.step_s_by_context)
        return tuple(sorted(found or {self.context_tokens}))


@dataclass(frozen=True)
class LinkProfile:
    """Real FNX2 frames over the real link from one host's stage worker to another's."""

    from_host: str
    to_host: str
    rtt_32kib_s: Figure  # round trip of a 32 KiB frame and its answer
    throughput_bytes_per_s: Figure  # of 16 MiB moved in frames
    transport: str  # e.g. "fnx2+tls"
    command: str
    measured_unix_ns: int
    valid_for_s: int
    schema: str = LINK_PROFILE_SCHEMA

    def seconds_for(self, frame_bytes: int) -> float:
        """One-way time of a frame: half the small round trip plus its serialisation."""
        return self.rtt_32kib_s.median / 2 + frame_bytes / self.throughput_bytes_per_s.median


@dataclass(frozen=True)
class StageCalibration:
    """Predicted against measured seconds per decode microbatch on one stage of a route."""

    stage_index: int
    host: str
    layer_start: int
    layer_end: int
    predicted_s: float
    measured_s: Figure
    rows: float = 0.0  # rows per microbatch the prediction was evaluated at (0: the plan's target rows)
    # Tokens of past per decode row it was evaluated at: the measured mean (0: the plan's decode context).
    past_tokens: float = 0.0
    # Term by term (compute, pack, wire, unpack): the prediction, and the measurement over the runs
    # (physical). Empty in calibrations that predate them. The planner scales a host's profile by
    # measured / predicted compute, and a link's by wire (`services.planner.route_feedback`).
    predicted_terms: dict[str, float] = field(default_factory=dict)
    measured_terms: dict[str, Figure] = field(default_factory=dict)

    @property
    def relative_error(self) -> float:
        measured = self.measured_s.median
        return abs(measured - self.predicted_s) / measured if measured else 0.0


@dataclass(frozen=True)
class Calibration:
    """A route's qualification verdict: its plan's predictions checked against measurement."""

    route_key: str
    plan_hash: str
    evidence_ids: tuple[str, ...]  # the profile records the plan's terms came from
    stages: tuple[StageCalibration, ...]
    predicted_bottleneck_s: float
    measured_bottleneck_s: Figure
    tolerance: float  # the largest bottleneck prediction error that passes
    runs: int
    failures: tuple[str, ...] = ()  # "run 2: cancellation: ..." per failed check
    command: str = ""
    measured_unix_ns: int = 0
    valid_for_s: int = 0
    # Which rows per microbatch the predictions were evaluated at: "measured rows" (each stage's
    # measured mean, from the plan's own profile records) or "" (the plan's target rows).
    rows_basis: str = ""
    # GATE: `fornax qualify`'s verdict on the route. SERVING_WINDOW: the decode window `fornax
    # profile` serves on the plan its fresh profiles give, to measure what a microbatch costs a
    # host beyond its layers while the route runs (data plane, control services); not a verdict.
    purpose: str = GATE
    schema: str = CALIBRATION_SCHEMA

    @property
    def bottleneck_prediction_error(self) -> float:
        m = self.measured_bottleneck_s.median
        return abs(m - self.predicted_bottleneck_s) / m if m else float("inf")

    @property
    def passed(self) -> bool:
        return not self.failures and self.bottleneck_prediction_error <= self.tolerance


@dataclass(frozen=True)
class RouteStage:
    host: str
    backend: str
    layer_start: int
    layer_end: int


def route_key(model_snapshot: str, stages: Iterable[RouteStage]) -> str:
    """Names a placement: the model, and each stage's host, backend and layer range in order."""
    hops = ">".join(f"{s.host}:{s.backend}[{s.layer_start}:{s.layer_end}]" for s in stages)
    return f"{model_snapshot}|{hops}"


# --- canonical JSON ---------------------------------------------------------------------------

def to_json(value: StageProfile | LinkProfile | Calibration) -> bytes:
    return json.dumps(_plain(asdict(value)), sort_keys=True, separators=(",", ":")).encode()


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _load(blob: bytes, schema: str) -> dict[str, Any]:
    try:
        data = json.loads(blob)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProfileFormatError(f"not JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("schema") != schema:
        got = data.get("schema") if isinstance(data, dict) else data
        raise ProfileFormatError(f"expected schema {schema!r}, got {got!r}")
    return data


def _figure(data: Any) -> Figure:
    try:
        return Figure(float(data["median"]), float(data["low"]), float(data["high"]), int(data["runs"]),
                      str(data["unit"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileFormatError(f"bad figure {data!r}: {exc}") from exc


def _figures(data: Any) -> dict[int, Figure]:
    if not isinstance(data, dict):
        raise ProfileFormatError(f"expected a table of figures, got {data!r}")
    return {int(k): _figure(v) for k, v in data.items()}


def _grid(data: Any) -> dict[int, dict[int, Figure]]:
    if not isinstance(data, dict):
        raise ProfileFormatError(f"expected a table of figure tables, got {data!r}")
    return {int(k): _figures(v) for k, v in data.items()}


def _runtime_resident(data: Any) -> RuntimeResident | None:
    if data is None:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("samples"), list) or not data["samples"]:
        raise ProfileFormatError(f"bad runtime_resident {data!r}")
    samples = tuple(ResidentSample(str(s["point"]), int(s["rss_bytes"]), int(s["anon_bytes"]),
                                   int(s["weight_file_bytes"]), int(s["weight_copy_bytes"]), int(s["kv_bytes"]))
                    for s in data["samples"])
    return RuntimeResident(samples, str(data["method"]))


def stage_profile_from_json(blob: bytes) -> StageProfile:
    """Parses a stage profile; one without the context grid (an older record) reads with empty
    grids, its decode figures standing at its `context_tokens`; a max profile without
    `max_activations` (it predates the mode) reads as int8, the mode it was timed in."""
    data = _load(blob, STAGE_PROFILE_SCHEMA)
    try:
        kinds = tuple(
            LayerKindProfile(str(k["kind"]), _figures(k["prefill_s_per_token"]), _figures(k["decode_s_per_microbatch"]),
                             int(k["resident_bytes"]), int(k["kv_bytes_per_token"]),
                             _grid(k.get("decode_s_by_context", {})))
            for k in data["kinds"])
        return StageProfile(
            host=HostFacts(**data["host"]), worker=str(data["worker"]), backend=str(data["backend"]),
            backend_build=str(data["backend_build"]), device=str(data["device"]),
            model_snapshot=str(data["model_snapshot"]), dtype=str(data["dtype"]),
            context_tokens=int(data["context_tokens"]), concurrency=int(data["concurrency"]), kinds=kinds,
            command=str(data["command"]), measured_unix_ns=int(data["measured_unix_ns"]),
            valid_for_s=int(data["valid_for_s"]), step_s_per_microbatch=_figures(data.get("step_s_per_microbatch", {})),
            step_s_by_context=_grid(data.get("step_s_by_context", {})),
            weights_policy=str(data.get("weights_policy", "fp32")),
            runtime_resident=_runtime_resident(data.get("runtime_resident")),
            max_activations=str(data.get("max_activations", "")), timing=str(data.get("timing", WALL)))
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileFormatError(f"bad stage profile: {exc}") from exc


def link_profile_from_json(blob: bytes) -> LinkProfile:
    data = _load(blob, LINK_PROFILE_SCHEMA)
    try:
        return LinkProfile(
            from_host=str(data["from_host"]), to_host=str(data["to_host"]), rtt_32kib_s=_figure(data["rtt_32kib_s"]),
            throughput_bytes_per_s=_figure(data["throughput_bytes_per_s"]), transport=str(data["transport"]),
            command=str(data["command"]), measured_unix_ns=int(data["measured_unix_ns"]),
            valid_for_s=int(data["valid_for_s"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileFormatError(f"bad link profile: {exc}") from exc


def calibration_from_json(blob: bytes) -> Calibration:
    data = _load(blob, CALIBRATION_SCHEMA)
    try:
        stages = tuple(
            StageCalibration(int(s["stage_index"]), str(s["host"]), int(s["layer_start"]), int(s["layer_end"]),
                             float(s["predicted_s"]), _figure(s["measured_s"]), float(s.get("rows", 0.0)),
                             float(s.get("past_tokens", 0.0)),
                             {str(k): float(v) for k, v in s.get("predicted_terms", {}).items()},
                             {str(k): _figure(v) for k, v in s.get("measured_terms", {}).items()})
            for s in data["stages"])
        calibration = Calibration(
            route_key=str(data["route_key"]), plan_hash=str(data["plan_hash"]),
            evidence_ids=tuple(str(x) for x in data["evidence_ids"]), stages=stages,
            predicted_bottleneck_s=float(data["predicted_bottleneck_s"]),
            measured_bottleneck_s=_figure(data["measured_bottleneck_s"]), tolerance=float(data["tolerance"]),
            runs=int(data["runs"]), failures=tuple(str(x) for x in data["failures"]), command=str(data["command"]),
            measured_unix_ns=int(data["measured_unix_ns"]), valid_for_s=int(data["valid_for_s"]),
            rows_basis=str(data.get("rows_basis", "")), purpose=str(data.get("purpose", GATE)))
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfileFormatError(f"bad calibration: {exc}") from exc
    if calibration.purpose not in CALIBRATION_PURPOSES:
        raise ProfileFormatError(f"bad calibration: purpose {calibration.purpose!r} is none of {CALIBRATION_PURPOSES}")
    return calibration

