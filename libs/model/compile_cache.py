"""Which MAX graphs a route needs, and which of them the compile cache already holds.

MAX keeps its compiled artifacts in `MODULAR_MAX_CACHE_DIR` but cannot be asked whether a
graph is there without compiling it. So every successful compile also leaves a small marker
beside them, named by a key over the MAX build and everything the graph is built from (graph
kind, model config, weight dtype, device): a marker means "a compile of exactly this graph
with exactly this build finished into this directory". A marker whose MAX artifacts were
deleted only costs a recompile; a missing marker makes the fleet serve on the reference
backend first. Nothing here imports `max`, so the orchestrator can decide without loading it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from libs.model.config import DeepseekV2Config
from libs.model.custom_kernels import SOURCES, needs_custom_op, sources_sha256

MARKER_DIR = "fornax-graphs"
# Bumped whenever `max_graphs` builds a graph differently (inputs, ops or weights), so a marker
# left by an older graph does not claim the new one is compiled. 2: both MLA forms in the layer
# graphs; all routed experts of a layer in one graph. 3: block-format products on weights repacked at
# bind time (MAX's packed product kernel, no repack in the graph). 4: graphs with block-format
# products compute in float32 around their bf16-stored weights (norms and router bound float32).
GRAPH_REVISION = 4


class GraphName(Enum):
    """The graph kinds of `max_graphs.GraphKind`, by value, without importing MAX."""

    EMBED = "embed"
    DENSE_LAYER = "dense_layer"
    MOE_LAYER = "moe_layer"
    FINAL = "final"
    EXPERT = "expert"


@dataclass(frozen=True)
class GraphTarget:
    """One graph to have compiled: its kind and what its compile is keyed by."""

    name: GraphName
    build: str  # e.g. "max 26.7.0"
    device: str
    weight_dtype: str
    config_sha256: str
    # (linear weight name, block format) of a graph's block-format weights; () for a float graph
    quant: tuple[tuple[str, str], ...] = ()
    # the stage's block-format activations (`MaxOptions.block_activations`)
    activations: str = "int8"

    @property
    def key(self) -> str:
        identity: dict[str, object] = {
            "graph": self.name.value, "build": self.build, "device": self.device,
            "weight_dtype": self.weight_dtype, "config_sha256": self.config_sha256,
            "graph_revision": GRAPH_REVISION}
        if self.quant:  # float graphs keep the keys they always had
            identity["quant"] = [list(pair) for pair in self.quant]
        if self.activations != "int8":
            identity["activations"] = self.activations
        if any(needs_custom_op(fmt, self.activations) for _, fmt in self.quant):
            # a graph running the Mojo custom op is also keyed by the kernel sources
            identity["kernels_sha256"] = sources_sha256(SOURCES, self.build)
        canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def config_sha256(cfg: DeepseekV2Config) -> str:
    """Hash of every config field; graphs are built from the config alone."""
    canonical = json.dumps(dataclasses.asdict(cfg), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def stage_graphs(cfg: DeepseekV2Config, layer_start: int, layer_end: int, first: bool,
                 last: bool) -> tuple[GraphName, ...]:
    """The graph kinds one stage binds (layer_end exclusive)."""
    names: list[GraphName] = [GraphName.EMBED] if first else []
    layers = range(layer_start, layer_end)
    if any(not cfg.is_moe_layer(i) for i in layers):
        names.append(GraphName.DENSE_LAYER)
    if any(cfg.is_moe_layer(i) for i in layers):
        names += [GraphName.MOE_LAYER, GraphName.EXPERT]
    if last:
        names.append(GraphName.FINAL)
    return tuple(names)


def assign_compiles(needs: list[tuple[GraphName, ...]]) -> list[tuple[GraphName, ...]]:
    """Each graph kind compiled once, by one of the stages that needs it (the one with the
    least work so far), since one compiled graph serves every stage and layer of its kind.

    `needs[i]` is stage i's graph kinds; the answer gives each stage the kinds it compiles.
    """
    assigned: list[list[GraphName]] = [[] for _ in needs]
    seen: set[GraphName] = set()
    for name in GraphName:
        wanting = [i for i, kinds in enumerate(needs) if name in kinds]
        if not wanting or name in seen:
            continue
        seen.add(name)
        assigned[min(wanting, key=lambda i: (len(assigned[i]), i))].append(name)
    return [tuple(kinds) for kinds in assigned]


def marker_path(cache_dir: Path, target: GraphTarget) -> Path:
    return cache_dir / MARKER_DIR / f"{target.name.value}-{target.key[:32]}.json"


def is_cached(cache_dir: Path, target: GraphTarget) -> bool:
    return marker_path(cache_dir, target).is_file()


def record_compiled(cache_dir: Path, target: GraphTarget, seconds: float) -> Path:
    """Writes the marker atomically, so a reader never sees half of one."""
    path = marker_path(cache_dir, target)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"graph": target.name.value, "build": target.build, "device": target.device,
            "weight_dtype": target.weight_dtype, "config_sha256": target.config_sha256,
            "compile_seconds": round(seconds, 3)}
    scratch = path.with_suffix(f".{os.getpid()}.tmp")
    scratch.write_text(json.dumps(body, indent=2), encoding="utf-8")
    scratch.replace(path)
    return path
