"""The figures `fleet_reference.decide_references` decides on, from a fleet file before it runs.

The planner places the layers as `fornax plan --fleet FILE` would (the file's declared limits,
one route) and counts each stage's memory: weights in the formats the builder stores for the
host's backend, KV, activation buffers and the runtime's reserve (`services.planner`). A numpy
reference stage of the same layers holds its artifact's stored bytes, mapped, and no float32
copy of a packed weight: it decodes one weight for the product that uses it and drops it, so its
scratch is the largest such weight in float32. The MAX stage counts as the planner counts it
(its weights in the formats MAX runs; MAX binds the mapped pages and copies none of them).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from apps.fleet.fleet_reference import NO_REFERENCE, HostStageMemory, ReferenceDecision, decide_references
from apps.fleet.spec import FleetSpec
from libs.common.kinds import Backend

FLOAT32_BYTES = 4


def reference_decision(spec: FleetSpec, checkpoint: str | None, weights: str | None, *, serve_while_compiling: bool,
                       replica_routes: bool) -> ReferenceDecision:
    """Whether `fornax up --fleet` starts reference workers, and on which hosts, with the lines
    it prints; every case that cannot serve at once says why."""
    if not serve_while_compiling or not checkpoint or all(h.backend is Backend.NUMPY for h in spec.stage_hosts):
        return NO_REFERENCE
    if Path(checkpoint).suffix == ".gguf":
        return _without("a GGUF keeps its stored formats, and the switch is measured on float32 weights")
    if replica_routes:
        return _without("replica routes do not serve on reference workers")
    from libs.service.errors import FornaxError

    try:
        figures = host_figures(spec, checkpoint, weights)
    except FornaxError as exc:
        figures = f"the file's hosts cannot be planned ({exc.reason}: {exc.message})"
    if isinstance(figures, str):
        return _without(figures)
    return decide_references(figures)


def _without(why: str) -> ReferenceDecision:
    return ReferenceDecision(frozenset(), (f"MAX hosts serve only after their graphs compile: {why}",))


def host_figures(spec: FleetSpec, checkpoint: str, weights: str | None) -> tuple[HostStageMemory, ...] | str:
    """Each stage host's figures, or why there are none (the file's hosts cannot be planned)."""
    from apps.fleet.route_layout import plan_fleet_routes
    from libs.model.config import load_config

    result = plan_fleet_routes(spec, checkpoint, 1, weights)
    if not result.feasible or result.plan is None:
        return f"the planner finds no plan for the file's hosts ({result.infeasibility})"
    cfg = load_config(checkpoint)
    stages = result.plan.stages
    uncompiled = _uncompiled_graphs(checkpoint, [(s.layer_start, s.layer_end) for s in stages], weights)
    figures = []
    for index, stage in enumerate(stages):
        host = spec.host(stage.node)
        policy = host.weights or weights or "fp32"
        numpy_weights = _numpy_weight_bytes(cfg, policy, stage.layer_start, stage.layer_end)
        reference = (numpy_weights + _decode_scratch_bytes(cfg, policy, stage.layer_start, stage.layer_end)
                     + stage.kv_bytes + stage.activation_bytes + stage.reserve_bytes)
        figures.append(HostStageMemory(host.name, host.backend, host.memory_limit_bytes, stage.memory_bytes, reference,
                                       uncompiled[index] if host.backend is Backend.MAX else 0, host.cpu_cores))
    return tuple(figures)


def _numpy_weight_bytes(cfg, policy: str, start: int, end: int) -> int:
    from services.planner.policy_bytes import stage_bytes_by_format

    return sum(stage_bytes_by_format(cfg, policy, start, end, Backend.NUMPY.value).values())


def _decode_scratch_bytes(cfg, policy: str, start: int, end: int) -> int:
    """The largest weight a numpy stage decodes to float32 for one product (0 when all are fp32)."""
    from libs.model.layout import expected_tensors, tensors_for_layers
    from libs.weights.policy import choose

    shapes = {name: spec.shape for name, spec in expected_tensors(cfg).items()}
    names = tensors_for_layers(cfg, start, end, start == 0, end == cfg.num_hidden_layers)
    packed = [math.prod(shapes[n]) for n in names
              if choose(policy, n, shapes[n], cfg.num_hidden_layers, Backend.NUMPY.value).fmt.name != "fp32"]
    return FLOAT32_BYTES * max(packed, default=0)


def _uncompiled_graphs(checkpoint: str, ranges: list[tuple[int, int]], weights: str | None) -> list[int]:
    """Per stage, the MAX graph kinds it binds that the compile cache lacks (all of them when
    MAX is not installed here: nothing can say they are cached)."""
    from libs.model.compile_cache import stage_graphs
    from libs.model.config import load_config

    cfg = load_config(checkpoint)
    count = len(ranges)
    needs = [stage_graphs(cfg, a, b, i == 0, i == count - 1) for i, (a, b) in enumerate(ranges)]
    try:
        from libs.model.max_kernels import default_cache_dir, max_build
        from services.orchestrator.route.background_compile import BackgroundCompiler, CompileSettings

        settings = CompileSettings(checkpoint, default_cache_dir(os.environ), max_build(),
                                   weights_policy=weights or "fp32")
        compiler = BackgroundCompiler(settings, tuple(ranges))
    except ImportError:
        return [len(n) for n in needs]
    return [sum(1 for state in compiler.stage_graph_states(i).values() if state != "cached") for i in range(count)]
