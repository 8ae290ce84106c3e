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



def _linear_graph(spec, fmts_and_dims):
    """One graph of `_Builder.linear` products, as the stage graphs call it; weights named by format."""
    from max.dtype import DType
    from max.graph import Graph, TensorType

    from libs.model.max_graphs import _Builder

    with Graph("linear_products", input_types=[TensorType(DType.float32, ["R", K], spec.device)],
               custom_extensions=spec.custom_extensions()) as graph:
        b = _Builder(spec)
        x = graph.inputs[0].tensor
        graph.output(*[b.linear(x, name, out_dim, K) for name, out_dim in fmts_and_dims])
    return graph


def _spec(activations, quant, package=""):
    from max.dtype import DType
    from max.graph import DeviceRef

    from libs.model.config import parse_config
    from libs.model.max_graphs import GraphKind, GraphSpec
    from libs.model.presets import preset_config

    cfg = parse_config(preset_config("tiny-lora-yarn", 0, 1))
    return GraphSpec(GraphKind.FINAL, cfg, DType.float32, DeviceRef.CPU(), quant, activations, package)


def test_the_stage_builder_runs_each_block_format_by_the_stage_activations(weights):
    """int8: Q4_K through MAX's packed product (its weight repacked at bind), Q8_0 (no MAX
    kernel) through the custom op; float32: Q4_K through the custom op too, as its stored bytes,
    so it matches the float32 product."""
    from max.driver import CPU
    from max.engine import InferenceSession
    from max.graph import DeviceRef

    from libs.model.max_graphs import runs_custom_op
    from libs.model.max_repack import Repacker

    package = str(gguf_matmul_package(default_cache_dir(os.environ), max_build()))
    quant = (("lm_head", "q8_0"), ("o_proj", "q4_k"))
    assert runs_custom_op("q8_0", N, "int8") and not runs_custom_op("q4_k", N, "int8")
    assert runs_custom_op("q4_k", N, "float32") and runs_custom_op("q4_k", 48, "int8")  # qmatmul's out multiple
    session = InferenceSession(devices=[CPU()])
    repacked_q4 = Repacker(session, CPU(), DeviceRef.CPU()).repack("q4_k", weights["q4_k"])
    x = np.random.default_rng(5).standard_normal((2, K)).astype(np.float32)
    errors = {}
    for activations in ("int8", "float32"):
        registry = {"lm_head": weights["q8_0"], "o_proj": repacked_q4 if activations == "int8" else weights["q4_k"]}
        graph = _linear_graph(_spec(activations, quant, package), [("lm_head", N), ("o_proj", N)])
        q8, q4 = session.load(graph, weights_registry=registry).execute(x)
        ref8, ref4 = _reference(x, weights["q8_0"], "q8_0"), _reference(x, weights["q4_k"], "q4_k")
        np.testing.assert_allclose(q8.to_numpy(), ref8, rtol=1e-5, atol=1e-5 * np.abs(ref8).max())
        errors[activations] = np.abs(q4.to_numpy() - ref4).max() / np.abs(ref4).max()
    assert errors["float32"] < 1e-5 < errors["int8"]


def test_a_custom_op_product_without_a_package_is_refused():
    from libs.model.errors import MojoKernelsError

    with pytest.raises(MojoKernelsError, match="names no kernel package"):
        _linear_graph(_spec("int8", (("lm_head", "q8_0"),)), [("lm_head", N)])


def test_blocks_whose_f16_scales_are_subnormal_are_read_exactly():
    """Weights small enough that their block scales are f16 subnormals (a layer of small weights
    in a llama.cpp Q4_K_M file had 94 % of them) still match the float32 product: the runtime
    may treat float32 subnormals as zero, so the op never forms one."""
    from max.driver import CPU
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Dim, Graph, TensorType, ops

    rng = np.random.default_rng(13)
    tiny = {f: encode((rng.standard_normal((N, K)) * 1e-4).astype(np.float32), weight_format(f))
            for f in CUSTOM_OP_FORMATS}
    scales = np.ascontiguousarray(tiny["q4_k"].reshape(-1, 144)[:, :2]).view(np.float16).astype(np.float32)
    assert np.mean(np.abs(scales) < 6.1e-5) > 0.5  # mostly subnormal f16 scales
    dev = DeviceRef.CPU()
    package = gguf_matmul_package(default_cache_dir(os.environ), max_build())
    inputs = [TensorType(DType.float32, ["R", K], dev)] + [TensorType(DType.uint8, list(tiny[f].shape), dev)
                                                          for f in CUSTOM_OP_FORMATS]
    with Graph("gguf_matmul_subnormal_scales", input_types=inputs, custom_extensions=[package]) as graph:
        x, *ws = (v.tensor for v in graph.inputs)
        graph.output(*[ops.custom(op_name(f), dev, [x, w], [TensorType(DType.float32, [Dim("R"), N], dev)])[0]
                       for f, w in zip(CUSTOM_OP_FORMATS, ws, strict=True)])
    model = InferenceSession(devices=[CPU()]).load(graph)
    x = rng.standard_normal((3, K)).astype(np.float32)
    for fmt, got in zip(CUSTOM_OP_FORMATS, model.execute(x, *[tiny[f] for f in CUSTOM_OP_FORMATS]), strict=True):
        ref = _reference(x, tiny[fmt], fmt)
        assert np.abs(ref).max() > 0, fmt
        np.testing.assert_allclose(got.to_numpy(), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max(), err_msg=fmt)
