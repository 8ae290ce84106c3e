"""A fleet file's hosts as the planner's inventory, before any of them runs (`fornax plan --fleet`).

Pure: a `FleetSpec` in, the planner's `Inventory` (one node per stage host, a link each way
between every two of them) and the figures it rests on out, each figure with its evidence class:

- contract: what the fleet file declares and `fornax up --fleet` enforces (the memory limit
  of the host's cgroup; the link rate its `tc tbf` shapes both ways; a declared link delay,
  which its relay adds to every inbound byte);
- declared estimate (a prediction): what nothing measured yet, i.e. FLOP/s and memory
  bandwidth per core of quota, the runtime's own resident memory held back from each host
  (interpreter, gRPC, backend runtime and libraries: 512 MiB), the constants the planner's
  inventory of running workers uses too, and the base latency of a hop on one box.

A stage's memory in the plan is its weights, KV for `context_tokens x concurrency`, its
activation buffers (`services.planner.costs`) and the reserve; all four must fit the host's
memory limit. Stored stage and link profiles replace the declared time and weight figures of
the hosts and hops they measured (`services.planner.measured`), and a usable stage profile's
measured runtime reserve (physical: the worker's resident memory beyond its weights and KV,
`libs.profiles.schema.RuntimeResident`) replaces the declared reserve of its host
(`services.planner.reserve`; `fleet_reserves` says which for the figures table). The KV the plan
counts is the KV pool each stage is given: the route installs every stage with its plan's
`kv_bytes` as its KV limit (`services.orchestrator.route.install.stage_kv_limit`).
"""

from __future__ import annotations

from dataclasses import dataclass

from apps.fleet.spec import FleetSpec, HostSpec
from libs.common.kinds import FLOAT_DTYPES, Backend, DType
from libs.profiles.schema import DEFAULT_MAX_ACTIVATIONS
from libs.service.errors import InvalidArgument
from libs.weights.policy import POLICIES, runnable_formats
from services.planner.inventory import Inventory, Link, Node, Target
from services.planner.inventory_facts import (
    CPU_BANDWIDTH_BYTES_PER_S,
    CPU_FLOPS_PER_CORE,
    DECLARED_LINK_LATENCY_NS,
    RUNTIME_RESERVE_BYTES,
)
from services.planner.profiles import ProfileBook
from services.planner.reserve import ReserveChoice, choose_reserve
from services.stage_worker.operations import SUPPORTED_OPERATIONS

# Policies from the smallest weights to the largest.
_POLICY_SIZE_ORDER = ("q4_k_m", "q8_0", "bf16", "fp32")
_DTYPE_BYTES = {DType.BF16: 2, DType.FP16: 2, DType.FP32: 4}

CONTRACT = "contract"
DECLARED = "declared estimate"
PHYSICAL = "physical"


class FleetPlanError(InvalidArgument):
    default_reason = "FLEET_NOT_PLANNABLE"


@dataclass(frozen=True)
class InventoryFigure:
    """One number the inventory rests on, and what kind of number it is."""

    subject: str  # a host name, or "a->b" for a hop
    quantity: str  # memory, reserve, compute, memory_bandwidth, link_rate, link_latency
    value: float
    unit: str
    evidence: str  # CONTRACT, DECLARED or PHYSICAL (a measured reserve)
    source: str

    @property
    def is_prediction(self) -> bool:
        return self.evidence == DECLARED


@dataclass(frozen=True)
class FleetInventory:
    inventory: Inventory
    figures: tuple[InventoryFigure, ...]


@dataclass(frozen=True)
class FleetWeights:
    """The weight policy the planner counts bytes in, and where it comes from."""

    policy: str
    mixed: bool  # hosts hold different policies: planned at the largest, as `fornax up` does
    source: str


def host_activations(host: HostSpec, default: str) -> str:
    """A max host's block-format activations: its `max_activations:`, else `default` (the fleet's
    --max-activations), else int8, the worker's default; "" on a numpy host."""
    if host.backend is not Backend.MAX:
        return ""
    return host.max_activations or default or DEFAULT_MAX_ACTIVATIONS


def _node(host: HostSpec, max_activations: str) -> Node:
    if host.device != "cpu":
        raise FleetPlanError(f"host {host.name} runs on {host.device}: fornax plan --fleet declares per-core CPU "
                             "figures only", field=f"hosts.{host.name}.device")
    return Node(
        name=host.name, backend=host.backend, memory_bytes=host.memory_limit_bytes,
        compute_flops=CPU_FLOPS_PER_CORE * host.cpu_cores,
        memory_bandwidth_bytes_per_s=CPU_BANDWIDTH_BYTES_PER_S * host.cpu_cores,
        dtypes=FLOAT_DTYPES, operations=SUPPORTED_OPERATIONS, reserve_bytes=RUNTIME_RESERVE_BYTES[host.backend],
        host=host.name, weight_formats=tuple(sorted(runnable_formats(host.backend.value))),
        max_activations=host_activations(host, max_activations),
    )


def _host_figures(host: HostSpec, node: Node) -> list[InventoryFigure]:
    quota = f"{host.cpu_cores:g} core(s) of quota"
    name = host.name
    return [
        InventoryFigure(name, "memory", node.memory_bytes, "bytes", CONTRACT, "the fleet file's memory_limit (cgroup)"),
        InventoryFigure(name, "reserve", node.reserve_bytes, "bytes", DECLARED,
                        f"the {host.backend} runtime's own resident memory"),
        InventoryFigure(name, "compute", node.compute_flops, "FLOP/s", DECLARED,
                        f"{CPU_FLOPS_PER_CORE:.3g} FLOP/s per core x {quota}"),
        InventoryFigure(name, "memory_bandwidth", node.memory_bandwidth_bytes_per_s, "bytes/s", DECLARED,
                        f"{CPU_BANDWIDTH_BYTES_PER_S:.3g} bytes/s per core x {quota}"),
    ]


def _link(a: HostSpec, b: HostSpec) -> tuple[Link, list[InventoryFigure]]:
    """a -> b leaves through a's shaped link and enters through b's (and b's delaying relay)."""
    rate = min(a.link.rate_bits_per_s, b.link.rate_bits_per_s) / 8
    latency = DECLARED_LINK_LATENCY_NS + b.link.delay_ns
    hop = f"{a.name}->{b.name}"
    figures = [
        InventoryFigure(hop, "link_rate", rate, "bytes/s", CONTRACT, "the slower of the two hosts' link.rate (tc tbf)"),
        InventoryFigure(hop, "link_latency", DECLARED_LINK_LATENCY_NS, "ns", DECLARED, "a hop on one box"),
    ]
    if b.link.delay_ns:
        figures.append(InventoryFigure(hop, "link_latency", b.link.delay_ns, "ns", CONTRACT,
                                       f"{b.name}'s link.delay (its relay holds every inbound byte)"))
    return Link(a.name, b.name, rate, latency), figures


def inventory_from_fleet(spec: FleetSpec, max_activations: str = "") -> FleetInventory:
    """One node per stage host (named as the host) and a link each way between every two;
    `max_activations` (--max-activations) is the mode of every max host the file leaves unset."""
    hosts = spec.stage_hosts
    nodes = tuple(_node(h, max_activations) for h in hosts)
    figures = [f for h, n in zip(hosts, nodes, strict=True) for f in _host_figures(h, n)]
    links = []
    for a in hosts:
        for b in hosts:
            if a.name != b.name:
                link, hop = _link(a, b)
                links.append(link)
                figures += hop
    return FleetInventory(Inventory(nodes=nodes, links=tuple(links)), tuple(figures))


def fleet_weights(spec: FleetSpec, override: str | None) -> FleetWeights:
    """`override` (--weights) plans every stage host in one policy; else each host's `weights:`
    (fp32 where unset), the largest of them when they differ, so every host's memory suffices.
    fp32 counts 4 bytes a weight, as stages hold it, whatever the checkpoint stores."""
    hosts = spec.stage_hosts
    declared = ", ".join(f"{h.name} {h.weights}" for h in hosts if h.weights)
    if override is not None:
        if override not in POLICIES:
            raise FleetPlanError(f"unknown weight policy {override!r}", field="weights")
        note = f"; overrides the fleet file's {declared}" if declared and any(
            h.weights != override for h in hosts) else ""
        return FleetWeights(override, False, f"--weights {override}{note}")
    policies = {h.weights or "fp32" for h in hosts}
    largest = max(policies, key=_POLICY_SIZE_ORDER.index)
    if len(policies) > 1:
        return FleetWeights(largest, True, f"the fleet file's hosts hold {', '.join(sorted(policies))}: "
                                           f"planned at the largest, {largest}, on every host")
    where = f"the fleet file's hosts' weights: ({declared})" if declared else "fp32 (no host declares weights:)"
    return FleetWeights(largest, False, where)


def fleet_target(spec: FleetSpec, *, context_tokens: int, concurrency: int, stages: int | None,
                 mode: str) -> Target:
    """Every stage host takes part unless `stages` says fewer; hops are planned at the widest
    dtype the file gives them."""
    count = stages or len(spec.stage_hosts)
    boundary = max(spec.hop_dtypes, key=_DTYPE_BYTES.__getitem__) if spec.hop_dtypes else DType.BF16
    return Target(context_tokens=context_tokens, concurrency=concurrency, min_stages=count, max_stages=count,
                  boundary_dtype=boundary, mode=mode)


def _shown(value: float, unit: str) -> str:
    scaled = {"bytes": (2**30, "GiB"), "FLOP/s": (1e9, "GFLOP/s"), "bytes/s": (1e9, "GB/s"), "ns": (1e3, "us")}
    divisor, shown = scaled.get(unit, (1, unit))
    return f"{value / divisor:.3f} {shown}"


def fleet_reserves(built: FleetInventory, book: ProfileBook, model_snapshot: str, weights_policy: str,
                   now_ns: int) -> dict[str, ReserveChoice]:
    """Per stage host, the reserve the planner holds back: its usable stage profile's measured
    runtime reserve (physical), else the declared one (and why)."""
    return {n.name: choose_reserve(n, n.host or n.name, book, model_snapshot, weights_policy, now_ns)
            for n in built.inventory.nodes}


def with_reserves(figures: tuple[InventoryFigure, ...],
                  reserves: dict[str, ReserveChoice]) -> tuple[InventoryFigure, ...]:
    """The figures with each measured reserve in place of the declared one (physical, its record)."""
    out = []
    for f in figures:
        choice = reserves.get(f.subject)
        if f.quantity == "reserve" and choice is not None and choice.measured:
            f = InventoryFigure(f.subject, "reserve", choice.reserve_bytes, "bytes", PHYSICAL,
                                f"{choice.detail}; replaces the declared {f.value / 2**20:.0f} MiB")
        out.append(f)
    return tuple(out)


def figure_lines(figures: tuple[InventoryFigure, ...], measured: dict[str, str]) -> list[str]:
    """One line per figure with its evidence class; `measured` maps a host or "a->b" hop to the
    stored profile record that measured it (the planner uses it where it matches the model,
    backend and weight policy, and says so in each stage's terms)."""
    lines = ["inventory from the fleet file (contract: a limit the fleet file declares and `fornax up --fleet` "
             "enforces; declared estimate: a prediction, not a measurement; physical: measured by a stored "
             "profile):"]
    for f in figures:
        kind = "declared estimate (prediction)" if f.is_prediction else f.evidence
        line = f"  {f.subject:<14} {f.quantity:<17} {_shown(f.value, f.unit):>14}  {kind}: {f.source}"
        record = measured.get(f.subject)
        if record and f.quantity in ("compute", "memory_bandwidth", "link_rate", "link_latency"):
            line += f"; measured profile {record} (physical) stands in where it matches"
        lines.append(line)
    if measured:
        found = ", ".join(f"{subject} {record}" for subject, record in sorted(measured.items()))
        lines.append(f"stored profiles (measured, physical): {found}")
    else:
        lines.append("stored profiles: none under the state directory; every time figure is a declared estimate")
    return lines
