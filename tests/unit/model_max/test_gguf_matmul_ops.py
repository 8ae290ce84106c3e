"""The float32-activation custom ops on GGUF block weights, in one compiled MAX graph.

For every format the op's product equals `x @ gguf.dequantize(bytes).T` in float32 up to
summation order, at more than one row count (the graph's rows dim is symbolic); for Q4_K it
is closer to that float32 reference than `ops.qmatmul`, whose activations are int8.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("max")

from libs.model.custom_kernels import CUSTOM_OP_FORMATS, gguf_matmul_package, op_name  # noqa: E402
from libs.model.max_kernels import default_cache_dir, max_build  # noqa: E402
from libs.weights.codecs import decode, encode  # noqa: E402
from libs.weights.formats import weight_format  # noqa: E402

K, N = 512, 64


@pytest.fixture(scope="module")
def weights():
    rng = np.random.default_rng(7)
    return {f: encode(rng.standard_normal((N, K)).astype(np.float32), weight_format(f)) for f in CUSTOM_OP_FORMATS}


@pytest.fixture(scope="module")
def model(weights):
    """x [R, K] in; one output per format (custom op), then Q4_K through ops.qmatmul."""
    from max.driver import CPU
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Dim, Graph, TensorType, Weight, ops
    from max.graph.quantization import QuantizationEncoding

    package = gguf_matmul_package(default_cache_dir(os.environ), max_build())
    dev = DeviceRef.CPU()
    with Graph("gguf_matmul_ops", input_types=[TensorType(DType.float32, ["R", K], dev)],
               custom_extensions=[package]) as graph:
        x = graph.inputs[0].tensor
        outs = []
        for fmt in CUSTOM_OP_FORMATS:
            w = graph.add_weight(Weight(fmt, DType.uint8, list(weights[fmt].shape), dev),
                                 force_initial_weight_on_host=True)
            outs.append(ops.custom(op_name(fmt), dev, [x, w], [TensorType(DType.float32, [Dim("R"), N], dev)])[0])
        q = graph.add_weight(Weight("qmatmul_q4_k", DType.uint8, list(weights["q4_k"].shape), dev,
                                    quantization_encoding=QuantizationEncoding.Q4_K), force_initial_weight_on_host=True)
        outs.append(ops.qmatmul(QuantizationEncoding.Q4_K, None, x, q))
        graph.output(*outs)
    registry = {**weights, "qmatmul_q4_k": weights["q4_k"]}
    return InferenceSession(devices=[CPU()]).load(graph, weights_registry=registry)


def _reference(x: np.ndarray, stored: np.ndarray, fmt: str) -> np.ndarray:
    return (x.astype(np.float64) @ decode(stored, weight_format(fmt)).astype(np.float64).T).astype(np.float32)


@pytest.mark.parametrize("rows", [1, 3, 9])  # 9: past the decode-sized fused path
def test_each_format_matches_the_dequantized_float32_product(model, weights, rows):
    x = np.random.default_rng(rows).standard_normal((rows, K)).astype(np.float32)
    results = model.execute(x)
    for fmt, got in zip(CUSTOM_OP_FORMATS, results, strict=False):
        ref = _reference(x, weights[fmt], fmt)
        np.testing.assert_allclose(got.to_numpy(), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max(), err_msg=fmt)


def test_q4_k_is_closer_to_float32_than_qmatmul(model, weights):
    x = np.random.default_rng(11).standard_normal((3, K)).astype(np.float32)
    results = model.execute(x)
    ours = results[CUSTOM_OP_FORMATS.index("q4_k")].to_numpy()
    theirs = results[-1].to_numpy()
    ref = _reference(x, weights["q4_k"], "q4_k")
    ours_err, theirs_err = np.abs(ours - ref).max(), np.abs(theirs - ref).max()
    assert theirs_err > 1e-4 * np.abs(ref).max()  # int8 activations round visibly
    assert ours_err * 100 < theirs_err

