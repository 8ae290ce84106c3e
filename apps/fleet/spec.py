"""The fleet file: hosts of a local multi-host fleet, validated against its JSON schema.

A fleet file is YAML. `load_fleet_spec` validates it with `fleet.schema.json`, then checks what
a schema cannot say (unique names, a control host that exists, hops that match the stages),
and returns frozen values. Nothing here touches the kernel; `netns_plan` turns a spec into
the commands that build it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import yaml

from libs.common.kinds import Backend, DType, block_activations_refusal
from services.planner.inventory import InventoryError, parse_quantity

SCHEMA_PATH = Path(__file__).with_name("fleet.schema.json")


class FleetFileError(ValueError):
    """The fleet file is unreadable or invalid; the message names the field."""


@dataclass(frozen=True)
class LinkSpec:
    rate_bits_per_s: int
    delay_ns: int = 0


@dataclass(frozen=True)
class HostSpec:
    name: str
    backend: Backend
    device: str  # "cpu" or "gpu:N"
    cpu_cores: float
    memory_limit_bytes: int
    link: LinkSpec
    stage_worker: bool = True
    clock_offset_s: int = 0
    # The weight policy this host's stage is built in; None: the fleet's (--weights).
    weights: str | None = None
    # Block-format activations of this host's MAX stage (int8 or float32); None: the fleet's
    # (--max-activations), else the worker's default, int8. Only on a max host.
    max_activations: str | None = None


@dataclass(frozen=True)
class FleetSpec:
    hosts: tuple[HostSpec, ...]
    control_host: str
    # One per hop, hop i carrying stage i's output to stage i+1.
    hop_dtypes: tuple[DType, ...]
    # sha256 of the file's bytes: every figure measured on this fleet names it.
    file_sha256: str

    @property
    def stage_hosts(self) -> tuple[HostSpec, ...]:
        return tuple(h for h in self.hosts if h.stage_worker)

    def host(self, name: str) -> HostSpec:
        return next(h for h in self.hosts if h.name == name)


def _schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def _quantity(value, kind: str, where: str) -> float:
    try:
        return parse_quantity(value, kind, where)
    except InventoryError as exc:
        raise FleetFileError(f"{where}: {exc}") from exc


def _host(raw: dict, index: int) -> HostSpec:
    where = f"hosts[{index}]"
    link = raw["link"]
    rate_bytes = _quantity(link["rate"], "rate", f"{where}.link.rate")
    delay_ns = _quantity(link.get("delay", 0), "time_ns", f"{where}.link.delay")
    memory = _quantity(raw["memory_limit"], "bytes", f"{where}.memory_limit")
    if rate_bytes <= 0 or memory < 64 * 2**20:
        raise FleetFileError(f"{where}: link rate must be > 0 and memory_limit at least 64MiB")
    refusal = block_activations_refusal(str(raw.get("max_activations") or ""), raw["backend"])
    if refusal is not None:
        raise FleetFileError(f"{where}.max_activations: {refusal[1]} ({refusal[0]})")
    return HostSpec(
        name=raw["name"], backend=Backend(raw["backend"]), device=raw.get("device", "cpu"),
        cpu_cores=float(raw["cpu_cores"]), memory_limit_bytes=int(memory),
        link=LinkSpec(rate_bits_per_s=int(rate_bytes * 8), delay_ns=int(delay_ns)),
        stage_worker=bool(raw.get("stage_worker", True)), clock_offset_s=int(raw.get("clock_offset_s", 0)),
        weights=raw.get("weights"), max_activations=raw.get("max_activations"),
    )


def parse_fleet_spec(raw: object, file_sha256: str, dtype_override: DType | None = None) -> FleetSpec:
    """Validate a decoded fleet file; `dtype_override` sets every hop the file does not set."""
    errors = sorted(jsonschema.Draft202012Validator(_schema()).iter_errors(raw), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        path = "/".join(str(p) for p in first.absolute_path) or "(top level)"
        raise FleetFileError(f"{path}: {first.message}")
    if not isinstance(raw, dict):  # the schema requires a mapping; this narrows the type
        raise FleetFileError("(top level): must be a mapping")
    hosts = tuple(_host(h, i) for i, h in enumerate(raw["hosts"]))
    names = [h.name for h in hosts]
    if len(set(names)) != len(names):
        raise FleetFileError(f"hosts: names must be unique, got {names}")
    if raw["control_host"] not in names:
        raise FleetFileError(f"control_host: {raw['control_host']!r} is not one of the hosts {names}")
    stages = sum(h.stage_worker for h in hosts)
    if stages < 1:
        raise FleetFileError("hosts: at least one host must run a stage worker")
    hops = raw.get("hops")
    if hops is not None and len(hops) != stages - 1:
        raise FleetFileError(f"hops: {stages} stages have {stages - 1} hops, the file lists {len(hops)}")
    default = dtype_override or DType(raw.get("boundary_dtype", "fp32"))
    hop_dtypes = tuple(DType(h["boundary_dtype"]) for h in hops) if hops else (default,) * (stages - 1)
    return FleetSpec(hosts=hosts, control_host=raw["control_host"], hop_dtypes=hop_dtypes, file_sha256=file_sha256)


def load_fleet_spec(path: str | Path, dtype_override: DType | None = None) -> FleetSpec:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise FleetFileError(f"cannot read fleet file {path}: {exc.strerror}") from exc
    try:
        raw = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise FleetFileError(f"{path} is not YAML: {exc}") from exc
    return parse_fleet_spec(raw, hashlib.sha256(data).hexdigest(), dtype_override)
