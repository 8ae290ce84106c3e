"""A MAX worker's profiles and decode-step comparisons say which block-format activations they
timed, and its capabilities report the mode, so the planner can match a profile to the worker."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from fornax.stage_worker.v1 import stage_worker_pb2 as pb
from services.stage_worker.backend_compare import timed_builds
from services.stage_worker.config import StageWorkerConfig
from services.stage_worker.profiling import profile_options
from services.stage_worker.server import StageWorkerServicer


def _cfg(backend: str, activations: str = "") -> StageWorkerConfig:
    env = {"FORNAX_BACKEND": backend, **({"FORNAX_MAX_ACTIVATIONS": activations} if activations else {})}
    return StageWorkerConfig.from_env([], env)


def test_a_max_profile_builds_its_graphs_in_the_workers_mode_and_numpy_in_none():
    float32 = profile_options(_cfg("max", "float32"))
    assert float32 is not None and float32.block_activations == "float32" and float32.device == "cpu"
    default = profile_options(_cfg("max"))
    assert default is not None and default.block_activations == "int8"
    assert profile_options(_cfg("numpy")) is None


def test_a_decode_step_comparison_names_the_mode_of_its_max_timings_only():
    builds = {"numpy": "numpy 2.4", "max": "max 26.1"}
    assert timed_builds(builds, "max", "float32") == {"numpy": "numpy 2.4", "max": "max 26.1 (float32 activations)"}
    assert timed_builds(builds, "max", "int8")["max"] == "max 26.1 (int8 activations)"


def _capabilities(cfg: StageWorkerConfig) -> pb.GetCapabilitiesResponse:
    dataplane = SimpleNamespace(address="", advertised_host="h")
    servicer = StageWorkerServicer(cfg, None, dataplane, None, None)  # type: ignore[arg-type]
    return asyncio.run(servicer.GetCapabilities(pb.GetCapabilitiesRequest(), None))


def test_capabilities_report_a_max_workers_mode_and_none_on_numpy():
    assert _capabilities(_cfg("max", "float32")).max_activations == "float32"
    assert _capabilities(_cfg("max")).max_activations == "int8"
    assert _capabilities(_cfg("numpy")).max_activations == ""
