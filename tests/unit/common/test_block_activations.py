"""One check says whether a mode can be a stage's block-format activations; the planner's
inventory, the stage worker's spec and flags and the orchestrator's settings all refuse through it
with the same stable reason codes, each as its own error and field."""

from __future__ import annotations

import pytest

from libs.common.kinds import BLOCK_ACTIVATIONS, DEFAULT_BLOCK_ACTIVATIONS, Backend, block_activations_refusal
from libs.service.errors import InvalidArgument
from services.orchestrator.route.settings import RouteSettings
from services.planner.inventory import InventoryError
from services.planner.inventory import check_max_activations as planner_check
from services.stage_worker.config import StageWorkerConfig
from services.stage_worker.runtime import check_max_activations as worker_check


@pytest.mark.parametrize("mode", BLOCK_ACTIVATIONS)
def test_a_mode_max_runs_is_accepted_on_max_and_unset_everywhere(mode):
    assert block_activations_refusal(mode, Backend.MAX) is None
    assert block_activations_refusal(mode) is None  # backend unknown: only the mode is checked
    assert block_activations_refusal("", Backend.NUMPY) is None and block_activations_refusal("") is None
    assert DEFAULT_BLOCK_ACTIVATIONS == "int8"


@pytest.mark.parametrize("bad", ["fp16", "INT8", "float", " int8"])
def test_an_unknown_mode_is_unsupported_on_any_backend(bad):
    for backend in (Backend.MAX, Backend.NUMPY, None):
        refusal = block_activations_refusal(bad, backend)
        assert refusal is not None and refusal[0] == "MAX_ACTIVATIONS_UNSUPPORTED" and repr(bad) in refusal[1]


@pytest.mark.parametrize("mode", BLOCK_ACTIVATIONS)
def test_a_mode_on_a_numpy_stage_is_refused_not_ignored(mode):
    refusal = block_activations_refusal(mode, Backend.NUMPY)
    assert refusal is not None and refusal[0] == "MAX_ACTIVATIONS_BACKEND" and "numpy" in refusal[1]


@pytest.mark.parametrize(("value", "backend", "reason"), [
    ("fp16", Backend.MAX, "MAX_ACTIVATIONS_UNSUPPORTED"), ("float32", Backend.NUMPY, "MAX_ACTIVATIONS_BACKEND")])
def test_every_surface_refuses_with_the_shared_reason(value, backend, reason):
    with pytest.raises(InventoryError) as planner:
        planner_check(value, backend, "nodes[0].max_activations")
    assert (planner.value.reason, planner.value.field) == (reason, "nodes[0].max_activations")
    with pytest.raises(InvalidArgument) as worker:
        worker_check(value, backend)
    assert (worker.value.reason, worker.value.field) == (reason, "spec.max_activations")
    assert worker.value.message == block_activations_refusal(value, backend)[1]
    with pytest.raises(SystemExit, match=f"^{reason}: "):
        StageWorkerConfig.from_env([], {"FORNAX_BACKEND": str(backend), "FORNAX_MAX_ACTIVATIONS": value})


def test_the_orchestrators_worker_modes_refuse_an_unknown_one():
    assert RouteSettings.from_env({"FORNAX_WORKER_MAX_ACTIVATIONS": "float32, int8"}).worker_max_activations == (
        "float32", "int8")
    with pytest.raises(InvalidArgument) as refused:
        RouteSettings.from_env({"FORNAX_WORKER_MAX_ACTIVATIONS": "int8,bf16"})
    assert (refused.value.reason, refused.value.field) == ("MAX_ACTIVATIONS_UNSUPPORTED",
                                                            "FORNAX_WORKER_MAX_ACTIVATIONS")


def test_a_numpy_worker_keeps_the_default_mode_it_never_uses():
    assert StageWorkerConfig.from_env([], {"FORNAX_BACKEND": "numpy"}).max_activations == DEFAULT_BLOCK_ACTIVATIONS
    assert planner_check("", Backend.NUMPY, "f") == "" and worker_check(None, Backend.NUMPY) is None
