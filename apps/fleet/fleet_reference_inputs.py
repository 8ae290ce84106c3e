"""The figures `fleet_reference.decide_references` decides on, from a fleet file before it runs.

Memory (bounds, from the checkpoint's shapes and the workers' limits): the reference route and
the MAX route are planned apart, each on its own workers' figures, so either may give a host a
different range; each worker is counted at the widest range the host could hold (`host_figures`),
with its full KV limit, the planner's activation buffers and the runtime's reserve. A numpy
reference stage holds its artifact's stored bytes, mapped, and no float32 copy of a packed
weight: it decodes one weight for the product that uses it and drops it, so its scratch is the
largest such weight in float32. A MAX stage holds its weights in the formats MAX runs, as the
builder stores them for it (it binds the mapped pages rather than copying them). The control
host also holds the control services and, while the reference route serves, the background MAX
compiles (they run in the orchestrator's host, on its quota).

The compile wait (a prediction) counts the uncompiled graph kinds of the range the planner gives
the host on the file's declared figures (`fornax plan --fleet FILE`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from apps.fleet.fleet_reference import NO_REFERENCE, HostStageMemory, ReferenceDecision, decide_references
from apps.fleet.plan_inventory import RUNTIME_RESERVE_BYTES
from apps.fleet.spec import FleetSpec
from libs.common.kinds import Backend
from services.stage_worker.config import StageWorkerConfig

FLOAT32_BYTES = 4
# What a stage worker's KV may grow to unless configured (services.stage_worker.config).
WORKER_KV_LIMIT_BYTES = StageWorkerConfig.kv_limit_bytes
GIB = 2**30
# A reference worker stands in while graphs compile: its KV pool is capped (FORNAX_KV_LIMIT_BYTES)
# so that what it may hold is bounded, at the cost of fewer concurrent tokens meanwhile.
REFERENCE_KV_LIMIT_BYTES = GIB // 4
# Declared estimates (predictions) of the control host's own memory while it serves at once:
# registry, planner, builder and orchestrator (about 0.45 GiB resident together on `small`), and
# one background compile per MAX stage, each a process of its own (1.19 GB resident compiling
# small's dense_layer graph, 1.47 GB its moe_layer; physical readings on a 2-core AMD EPYC box).
CONTROL_SERVICES_BYTES = GIB // 2
COMPILE_JOB_BYTES = 3 * GIB // 2


# A deployment installs only a plan whose route `fornax qualify` passed (on its MAX hosts); the
# numpy reference route of the same hosts never was, so the planner would refuse it.
DEPLOYMENT_SERVES_ONLY_QUALIFIED = "deployment mode installs only a route `fornax qualify` passed, and the numpy " \
    "reference route is not one"


def reference_decision(spec: FleetSpec, checkpoint: str | None, weights: str | None, *, serve_while_compiling: bool,
                       replica_routes: bool, max_activations: str = "", deployment: bool = False) -> ReferenceDecision:
    """Whether `fornax up --fleet` starts reference workers, and on which hosts, with the lines
    it prints; every case that cannot serve at once says why."""
    if not serve_while_compiling or not checkpoint or all(h.backend is Backend.NUMPY for h in spec.stage_hosts):
        return NO_REFERENCE
    if deployment:
        return _without(DEPLOYMENT_SERVES_ONLY_QUALIFIED)
    if Path(checkpoint).suffix == ".gguf":
        return _without("a GGUF keeps its stored formats, and the switch is measured on float32 weights")
    if replica_routes:
        return _without("replica routes do not serve on reference workers")
    from libs.service.errors import FornaxError

    try:
        figures = host_figures(spec, checkpoint, weights, max_activations)
    except FornaxError as exc:
        figures = f"the file's hosts cannot be planned ({exc.reason}: {exc.message})"
    if isinstance(figures, str):
        return _without(figures)
    return decide_references(figures)


def _without(why: str) -> ReferenceDecision:
    return ReferenceDecision(frozenset(), (f"MAX hosts serve only after their graphs compile: {why}",))


def host_figures(spec: FleetSpec, checkpoint: str, weights: str | None,
                 max_activations: str = "") -> tuple[HostStageMemory, ...] | str:
    """Each stage host's figures, or why there are none (the file's hosts cannot be planned).

    The reference route and the MAX route are planned apart, each on its own workers' figures,
    so either may give a host a different range. The memory figures bound both: the most layers
    the host could hold (every layer but one per other stage host), at whichever end weighs
    more (the embeddings' or the head's), each worker with its full KV limit. The compile wait
    (a prediction) counts the graphs of the range the planner gives the host on declared figures.
    """
    from apps.fleet.route_layout import plan_fleet_routes
    from libs.model.config import load_config

    result = plan_fleet_routes(spec, checkpoint, 1, weights)
    if not result.feasible or result.plan is None:
        return f"the planner finds no plan for the file's hosts ({result.infeasibility})"
    cfg = load_config(checkpoint)
    planned = {stage.node: stage for stage in result.plan.stages}
    ranges = [(s.layer_start, s.layer_end) for s in result.plan.stages]
    modes = tuple(sorted({h.max_activations or max_activations or "int8"
                          for h in spec.stage_hosts if h.backend is Backend.MAX})) or ("int8",)
    uncompiled = dict(zip(planned, _uncompiled_graphs(checkpoint, ranges, weights, modes), strict=True))
    widest = _widest_ranges(cfg.num_hidden_layers, len(spec.stage_hosts))
    activations = max(stage.activation_bytes for stage in result.plan.stages)
    compiling = sum(1 for h in spec.stage_hosts if h.backend is Backend.MAX and uncompiled.get(h.name, 1))
    control = CONTROL_SERVICES_BYTES + compiling * COMPILE_JOB_BYTES
    figures = []
    for host in spec.stage_hosts:
        policy = host.weights or weights or "fp32"
        numpy_weights = max(_numpy_weight_bytes(cfg, policy, a, b) + _decode_scratch_bytes(cfg, policy, a, b)
                            for a, b in widest)
        if host.backend is Backend.NUMPY:  # its one process holds a second generation of its stage
            stage = numpy_weights + WORKER_KV_LIMIT_BYTES + activations + RUNTIME_RESERVE_BYTES[Backend.NUMPY]
            reference = numpy_weights + WORKER_KV_LIMIT_BYTES + activations
        else:  # two processes: the reference worker (its KV capped) and the host's own
            own_weights = max(_weight_bytes(cfg, policy, a, b, host.backend) for a, b in widest)
            stage = own_weights + WORKER_KV_LIMIT_BYTES + activations + RUNTIME_RESERVE_BYTES[host.backend]
            reference = numpy_weights + REFERENCE_KV_LIMIT_BYTES + activations + RUNTIME_RESERVE_BYTES[Backend.NUMPY]
        figures.append(HostStageMemory(
            host.name, host.backend, host.memory_limit_bytes, stage, reference,
            uncompiled.get(host.name, 0) if host.backend is Backend.MAX else 0, host.cpu_cores,
            control if host.name == spec.control_host else 0))
    return tuple(figures)


def _widest_ranges(layers: int, stage_hosts: int) -> list[tuple[int, int]]:
    """The largest ranges one of `stage_hosts` stages can hold: first (with the embeddings) or
    last (with the head), every other stage keeping one layer."""
    most = max(1, layers - (stage_hosts - 1))
    return [(0, most), (layers - most, layers)]


def _weight_bytes(cfg, policy: str, start: int, end: int, backend: Backend) -> int:
    from services.planner.policy_bytes import stage_bytes_by_format

    return sum(stage_bytes_by_format(cfg, policy, start, end, backend.value).values())


def _numpy_weight_bytes(cfg, policy: str, start: int, end: int) -> int:
    return _weight_bytes(cfg, policy, start, end, Backend.NUMPY)


def _decode_scratch_bytes(cfg, policy: str, start: int, end: int) -> int:
    """The largest weight a numpy stage decodes to float32 for one product (0 when all are fp32)."""
    from libs.model.layout import expected_tensors, tensors_for_layers
    from libs.weights.policy import choose

    shapes = {name: spec.shape for name, spec in expected_tensors(cfg).items()}
    names = tensors_for_layers(cfg, start, end, start == 0, end == cfg.num_hidden_layers)
    packed = [math.prod(shapes[n]) for n in names
              if choose(policy, n, shapes[n], cfg.num_hidden_layers, Backend.NUMPY.value).fmt.name != "fp32"]
    return FLOAT32_BYTES * max(packed, default=0)


def _uncompiled_graphs(checkpoint: str, ranges: list[tuple[int, int]], weights: str | None,
                       activations: tuple[str, ...] = ("int8",)) -> list[int]:
    """Per stage, the MAX graph kinds it binds that the compile cache lacks in any of the MAX
    stages' block-format `activations` (all of them when MAX is not installed here: nothing can
    say they are cached)."""
    from libs.model.compile_cache import stage_graphs
    from libs.model.config import load_config

    cfg = load_config(checkpoint)
    count = len(ranges)
    needs = [stage_graphs(cfg, a, b, i == 0, i == count - 1) for i, (a, b) in enumerate(ranges)]
    try:
        from libs.model.max_kernels import default_cache_dir, max_build
        from services.orchestrator.route.background_compile import BackgroundCompiler, CompileSettings

        settings = CompileSettings(checkpoint, default_cache_dir(os.environ), max_build(),
                                   weights_policy=weights or "fp32", activations=activations)
        compiler = BackgroundCompiler(settings, tuple(ranges))
    except ImportError:
        return [len(n) for n in needs]
    return [sum(1 for state in compiler.stage_graph_states(i).values() if state != "cached") for i in range(count)]
