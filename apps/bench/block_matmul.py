"""`fornax bench block-matmul`: one linear product in one-op MAX graphs, side by side.

[M, K] float32 activations times an [N, K] weight at each M: MAX's float32 `ops.matmul`
(weight bound [K, N]), `ops.qmatmul` for the formats MAX has a kernel for (int8 activations),
and Fornax's float32-activation Mojo custom op (`libs.model.custom_kernels`) for every block
format. Each cell is the minimum wall time of `runs` executions after one warm-up; the weight
bytes read per second of that minimum are beside it. Every graph is compiled in this process
(the compile cache serves repeats).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

QMATMUL_FORMATS = ("q4_k", "q6_k", "q4_0")


@dataclass(frozen=True)
class Cell:
    kernel: str  # "matmul", "qmatmul", "custom"
    fmt: str  # "fp32" or a block format
    m: int
    min_ms: float
    weight_gb_per_s: float


def _graph(kernel: str, fmt: str, m: int, k: int, w: np.ndarray, package: Path) -> Any:
    """x [m, k] in, the weight bound as graph weight "w" the way the stage graphs bind it."""
    from max.dtype import DType
    from max.graph import DeviceRef, Graph, TensorType, Weight, ops

    from libs.model.custom_kernels import op_name
    from libs.model.max_graphs import QMATMUL_ENCODINGS

    dev = DeviceRef.CPU()
    extensions = [package] if kernel == "custom" else []
    with Graph(f"bench_{kernel}_{fmt}_{m}", input_types=[TensorType(DType.float32, [m, k], dev)],
               custom_extensions=extensions) as graph:
        x = graph.inputs[0].tensor
        dtype = DType.float32 if fmt == "fp32" else DType.uint8
        encoding = QMATMUL_ENCODINGS[fmt] if kernel == "qmatmul" else None
        weight = graph.add_weight(Weight("w", dtype, list(w.shape), dev, quantization_encoding=encoding),
                                  force_initial_weight_on_host=True)
        if kernel == "matmul":
            y = ops.matmul(x, weight)
        elif kernel == "qmatmul":
            y = ops.qmatmul(QMATMUL_ENCODINGS[fmt], None, x, weight)
        else:
            y = ops.custom(op_name(fmt), dev, [x, weight], [TensorType(DType.float32, [m, w.shape[0]], dev)])[0]
        graph.output(y)
    return graph


def run_bench(ms: tuple[int, ...], k: int, n: int, formats: tuple[str, ...], runs: int,
              package: Path, seed: int = 0) -> list[Cell]:
    from max.driver import CPU
    from max.engine import InferenceSession

    from libs.weights.codecs import encode
    from libs.weights.formats import weight_format

    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((n, k)).astype(np.float32)
    session = InferenceSession(devices=[CPU()])
    plans = [("matmul", "fp32", np.ascontiguousarray(dense.T))]
    for fmt in formats:
        stored = encode(dense, weight_format(fmt))
        if fmt in QMATMUL_FORMATS:
            plans.append(("qmatmul", fmt, stored))
        plans.append(("custom", fmt, stored))
    cells = []
    for m in ms:
        x = rng.standard_normal((m, k)).astype(np.float32)
        for kernel, fmt, w in plans:
            model = session.load(_graph(kernel, fmt, m, k, w, package), weights_registry={"w": w})
            model.execute(x)
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                model.execute(x)
                times.append(time.perf_counter() - start)
            best = min(times)
            cells.append(Cell(kernel, fmt, m, round(best * 1e3, 3), round(w.nbytes / best / 1e9, 2)))
    return cells


def render(cells: list[Cell]) -> str:
    ms = sorted({c.m for c in cells})
    rows = sorted({(c.kernel, c.fmt) for c in cells}, key=lambda r: (r[1] != "fp32", r[1], r[0]))
    by = {(c.kernel, c.fmt, c.m): c for c in cells}
    head = f"{'kernel':<9}{'format':<7}" + "".join(f"{f'M={m} ms (GB/s)':>22}" for m in ms)
    lines = [head]
    for kernel, fmt in rows:
        parts = [f"{by[(kernel, fmt, m)].min_ms:>12.3f} ({by[(kernel, fmt, m)].weight_gb_per_s:>6.2f})" for m in ms]
        lines.append(f"{kernel:<9}{fmt:<7}" + "".join(f"{p:>22}" for p in parts))
    return "\n".join(lines)
