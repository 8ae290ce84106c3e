"""`fornax parity --max-activations`: which kernels a MAX stage's block-format products run."""

from pathlib import Path

from libs.model.parity import ParityRequest, _backend_options


def test_a_max_stage_gets_the_requested_block_activations():
    options = _backend_options("max", ParityRequest(Path("ck"), 2, "max", max_activations="float32"))
    assert options is not None and options.block_activations == "float32"
    assert _backend_options("max", ParityRequest(Path("ck"), 2, "max")).block_activations == "int8"


def test_a_numpy_stage_takes_no_backend_options():
    assert _backend_options("numpy", ParityRequest(Path("ck"), 2, "numpy", max_activations="float32")) is None
