"""Fleet inventory and planning target: typed values, plus the YAML reader.

Quantities in YAML may be plain numbers in base units (bytes, FLOP/s, bytes/s, ns) or
strings with a unit: `80GiB`, `400TFLOP/s`, `3.35TB/s`, `25Gbit/s`, `50us`.
See `services/planner/examples/README.md` for the file format.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from libs.common.kinds import FLOAT_DTYPES, Backend, DType, block_activations_refusal
from libs.profiles.schema import DEFAULT_MAX_ACTIVATIONS
from libs.service.errors import InvalidArgument
from libs.weights.formats import FORMATS

BACKENDS = tuple(backend.value for backend in Backend)
DTYPES = tuple(dtype.value for dtype in FLOAT_DTYPES)
OBJECTIVES = ("throughput", "latency")
MODES = ("exploratory", "deployment")
RECORD_TYPES = ("model", "capability", "measurement", "calibration", "route", "qualification")
DEFAULT_MAX_STAGES = 8


class InventoryError(InvalidArgument):
    default_reason = "INVALID_PLAN_INPUT"


@dataclass(frozen=True)
class EvidenceRef:
    record_id: str
    record_type: str  # one of RECORD_TYPES
    sha256: str = ""  # optional expected "sha256:<hex>" of the record's blob


@dataclass(frozen=True)
class Node:
    name: str
    backend: Backend
    memory_bytes: int
    compute_flops: float
    memory_bandwidth_bytes_per_s: float
    dtypes: tuple[DType, ...]
    operations: tuple[str, ...]
    build: str = ""
    reserve_bytes: int = 0
    evidence: tuple[EvidenceRef, ...] = ()
    host: str = ""  # the fleet host it runs on (its stage profile's host); "" = the node name
    weight_formats: tuple[str, ...] = ()  # formats its backend runs; () = not reported
    # A MAX node's block-format activations ("int8" or "float32"; "" = not reported, the
    # worker's default int8); "" on numpy. Its stage profile must be timed in the same mode.
    max_activations: str = ""

    @property
    def activations(self) -> str:
        """The mode its stage profile must have been timed in: a MAX node's activations (int8
        where unreported), "" on numpy."""
        return (self.max_activations or DEFAULT_MAX_ACTIVATIONS) if self.backend == Backend.MAX else ""


def check_max_activations(value: str, backend: Backend, field: str) -> str:
    """A node's reported activations: one MAX runs (MAX_ACTIVATIONS_UNSUPPORTED), and only on a
    MAX node (MAX_ACTIVATIONS_BACKEND); "" = not reported (`libs.common.kinds.block_activations_refusal`)."""
    refusal = block_activations_refusal(value, backend)
    if refusal is not None:
        reason, message = refusal
        raise InventoryError(message, reason=reason, field=field)
    return value


@dataclass(frozen=True)
class Link:
    from_node: str
    to_node: str
    bandwidth_bytes_per_s: float
    latency_ns: int
    evidence: tuple[EvidenceRef, ...] = ()


@dataclass(frozen=True)
class Inventory:
    nodes: tuple[Node, ...]
    links: tuple[Link, ...] = ()
    model_evidence: tuple[EvidenceRef, ...] = ()

    def link_index(self) -> dict[tuple[str, str], Link]:
        """(from, to) -> link; an entry serves both directions unless the reverse is given too."""
        index: dict[tuple[str, str], Link] = {}
        for x in self.links:
            index.setdefault((x.to_node, x.from_node), x)
        for x in self.links:
            index[(x.from_node, x.to_node)] = x
        return index

    def link(self, from_node: str, to_node: str) -> Link | None:
        return self.link_index().get((from_node, to_node))

    def without(self, name: str) -> Inventory:
        return Inventory(
            nodes=tuple(n for n in self.nodes if n.name != name),
            links=tuple(x for x in self.links if name not in (x.from_node, x.to_node)),
            model_evidence=self.model_evidence,
        )


@dataclass(frozen=True)
class Target:
    context_tokens: int = 4096
    concurrency: int = 1
    objective: str = "throughput"
    min_stages: int = 1
    max_stages: int = DEFAULT_MAX_STAGES
    mode: str = "exploratory"
    boundary_dtype: DType = DType.BF16
    prefill_tokens: int = 512
    decode_microbatch_rows: int = 0  # 0: floor(concurrency / (2 * max_stages - 1)), at least 1
    # Tokens of past per decode row that decode times are predicted at (attention reads rows x
    # past). 0: `context_tokens`, the deployment's configured context (the longest past a
    # sequence reaches, so the prediction bounds a decode step from above).
    decode_context_tokens: int = 0

    @property
    def decode_context(self) -> int:
        """The past per decode row the plan's decode terms are predicted at."""
        return self.decode_context_tokens or self.context_tokens

    @property
    def microbatch_rows(self) -> int:
        """Rows per decode microbatch. The default keeps at least 2*max_stages-1 microbatches in
        flight when concurrency allows, so every stage and route can stay busy."""
        if self.decode_microbatch_rows:
            return self.decode_microbatch_rows
        return max(1, self.concurrency // (2 * self.max_stages - 1))


_UNITS = {
    "bytes": {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
              "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40},
    "flops": {"": 1, "flop/s": 1, "gflop/s": 1e9, "tflop/s": 1e12, "pflop/s": 1e15},
    "rate": {"": 1, "b/s": 1, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12,
             "gib/s": 2**30, "mbit/s": 1e6 / 8, "gbit/s": 1e9 / 8},
    "time_ns": {"": 1, "ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9},
}
_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z/]*)\s*$")


def parse_quantity(value: Any, kind: str, where: str) -> float:
    if isinstance(value, bool):
        raise InventoryError(f"expected a quantity, got {value!r}", field=where)
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        match = _QUANTITY.match(str(value).lower())
        if match is None:
            raise InventoryError(f"cannot read quantity {value!r}", field=where)
        number, unit = float(match.group(1)), match.group(2)
    scale = _UNITS[kind].get(unit)
    if scale is None:
        units = ", ".join(u for u in _UNITS[kind] if u)
        raise InventoryError(f"unit {unit!r} not allowed here (use one of {units})", field=where)
    return number * scale


def _positive(value: Any, kind: str, where: str, allow_zero: bool = False) -> float:
    number = parse_quantity(value, kind, where)
    if number < 0 or (number == 0 and not allow_zero):
        raise InventoryError(f"must be {'>= 0' if allow_zero else '> 0'}, got {value!r}", field=where)
    return number


def _choice(value: Any, choices: tuple[str, ...], where: str) -> str:
    text = str(value).lower()
    if text not in choices:
        raise InventoryError(f"{value!r} is not one of {choices}", field=where)
    return text


def _evidence(items: Any, where: str) -> tuple[EvidenceRef, ...]:
    if items is None:
        return ()
    if not isinstance(items, list):
        raise InventoryError("must be a list", field=where)
    refs = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(item, dict) or not item.get("record_id"):
            raise InventoryError("each evidence entry needs record_id and type", field=at)
        refs.append(EvidenceRef(
            record_id=str(item["record_id"]),
            record_type=_choice(item.get("type", ""), RECORD_TYPES, at + ".type"),
            sha256=str(item.get("sha256") or ""),
        ))
    return tuple(refs)


FORMAT_NAMES = tuple(FORMATS)
NODE_KEYS = {"name", "backend", "memory", "compute", "memory_bandwidth", "dtypes", "operations", "build", "reserve",
             "evidence", "host", "weight_formats", "max_activations"}
LINK_KEYS = {"between", "from", "to", "bandwidth", "latency", "evidence"}
TOP_KEYS = {"nodes", "links", "target", "model_evidence"}


def _known_keys(raw: dict, allowed: set[str], where: str) -> None:
    """Typos fail loudly; keys starting with `x-` are free (YAML anchors and notes)."""
    unknown = sorted(k for k in raw if k not in allowed and not str(k).startswith("x-"))
    if unknown:
        raise InventoryError(
            f"unknown keys {unknown} (allowed: {sorted(allowed)})",
            field=f"{where}.{unknown[0]}" if where else unknown[0],
        )


def _node(raw: Any, where: str) -> Node:
    if not isinstance(raw, dict) or not raw.get("name"):
        raise InventoryError("each node needs a name", field=where)
    _known_keys(raw, NODE_KEYS, where)
    required = ("backend", "memory", "compute", "memory_bandwidth", "dtypes", "operations")
    for key in required:
        if key not in raw:
            raise InventoryError(f"node {raw['name']!r} lacks {key!r}", field=f"{where}.{key}")
    dtypes = tuple(DType(_choice(d, DTYPES, f"{where}.dtypes")) for d in raw["dtypes"] or ())
    backend = Backend(_choice(raw["backend"], BACKENDS, f"{where}.backend"))
    return Node(
        name=str(raw["name"]),
        backend=backend,
        memory_bytes=int(_positive(raw["memory"], "bytes", f"{where}.memory")),
        compute_flops=_positive(raw["compute"], "flops", f"{where}.compute"),
        memory_bandwidth_bytes_per_s=_positive(raw["memory_bandwidth"], "rate", f"{where}.memory_bandwidth"),
        dtypes=dtypes,
        operations=tuple(str(x) for x in raw["operations"] or ()),
        build=str(raw.get("build") or ""),
        reserve_bytes=int(_positive(raw.get("reserve", 0), "bytes", f"{where}.reserve", allow_zero=True)),
        evidence=_evidence(raw.get("evidence"), f"{where}.evidence"),
        host=str(raw.get("host") or ""),
        weight_formats=tuple(_choice(f, FORMAT_NAMES, f"{where}.weight_formats")
                             for f in raw.get("weight_formats") or ()),
        max_activations=check_max_activations(str(raw.get("max_activations") or ""), backend,
                                              f"{where}.max_activations"),
    )


def _link(raw: Any, where: str, names: set[str]) -> Link:
    if not isinstance(raw, dict):
        raise InventoryError("each link is a mapping", field=where)
    _known_keys(raw, LINK_KEYS, where)
    if "between" in raw:
        pair = raw["between"]
        if not isinstance(pair, list) or len(pair) != 2:
            raise InventoryError("between needs exactly two node names", field=f"{where}.between")
        a, b = (str(x) for x in pair)
    else:
        a, b = str(raw.get("from", "")), str(raw.get("to", ""))
    for name in (a, b):
        if name not in names:
            raise InventoryError(f"link names unknown node {name!r}", field=where)
    if a == b:
        raise InventoryError("a link joins two different nodes", field=where)
    return Link(
        from_node=a,
        to_node=b,
        bandwidth_bytes_per_s=_positive(raw.get("bandwidth"), "rate", f"{where}.bandwidth"),
        latency_ns=int(_positive(raw.get("latency", 0), "time_ns", f"{where}.latency", allow_zero=True)),
        evidence=_evidence(raw.get("evidence"), f"{where}.evidence"),
    )


def parse_inventory(raw: Any) -> Inventory:
    if not isinstance(raw, dict) or not isinstance(raw.get("nodes"), list) or not raw["nodes"]:
        raise InventoryError("inventory needs a non-empty nodes list", field="nodes")
    _known_keys(raw, TOP_KEYS, "")
    nodes = tuple(_node(x, f"nodes[{i}]") for i, x in enumerate(raw["nodes"]))
    names = {n.name for n in nodes}
    if len(names) != len(nodes):
        raise InventoryError("node names must be unique", field="nodes")
    links = tuple(_link(x, f"links[{i}]", names) for i, x in enumerate(raw.get("links") or []))
    return Inventory(nodes=nodes, links=links, model_evidence=_evidence(raw.get("model_evidence"), "model_evidence"))


def parse_target(raw: Any, mode: str | None = None) -> Target:
    raw = dict(raw or {})
    if mode is not None:
        raw["mode"] = mode
    known = set(Target.__dataclass_fields__)
    unknown = set(raw) - known
    if unknown:
        raise InventoryError(f"unknown target keys {sorted(unknown)}", field="target")
    target = Target(**raw)
    return validate_target(target)


def validate_target(t: Target) -> Target:
    for name in ("context_tokens", "concurrency", "min_stages", "max_stages"):
        value = getattr(t, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InventoryError(f"must be a positive integer, got {value!r}", field=f"target.{name}")
    for name in ("prefill_tokens", "decode_microbatch_rows"):
        value = getattr(t, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InventoryError(f"must be a non-negative integer, got {value!r}", field=f"target.{name}")
    if t.min_stages > t.max_stages:
        raise InventoryError("min_stages exceeds max_stages", field="target.min_stages")
    _choice(t.objective, OBJECTIVES, "target.objective")
    _choice(t.mode, MODES, "target.mode")
    _choice(t.boundary_dtype, DTYPES, "target.boundary_dtype")
    return t


@dataclass(frozen=True)
class InventoryFile:
    inventory: Inventory
    target: Target = field(default_factory=Target)


def load_inventory_file(path: str | Path, mode: str | None = None) -> InventoryFile:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError as exc:
        raise InventoryError(f"inventory file {path} not found", field="inventory") from exc
    except yaml.YAMLError as exc:
        raise InventoryError(f"inventory file {path} is not valid YAML: {exc}", field="inventory") from exc
    return InventoryFile(inventory=parse_inventory(raw), target=parse_target(raw.get("target"), mode))
