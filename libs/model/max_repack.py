"""Block-format weights laid out once, at bind time, for MAX's CPU product kernels.

`ops.qmatmul` is two MAX kernels: a repack of the weight's GGUF bytes into the product kernel's
own layout, then the product (int8 activations per 32-block). MAX runs a repack once, at model
init, only where it can hoist it out of the graph; inside an `ops.cond` branch, where every
routed expert runs, it repacks the weight on every call. Measured with one-op graphs (physical,
AMD EPYC Zen 5, 2 vCPU, max 26.7.0, Q4_K [2816, 2048] at 1 row, min of 20): 0.23 ms plain,
4.50 ms inside a cond, 0.33 ms inside a cond on a weight repacked beforehand, bit-identical
outputs. A Lite MoE layer spent about 5 ms per routed expert on that repack.

So the graphs call the product kernel alone (`max_graphs.PACKED_MATMUL_OPS`), and each
block-format weight is repacked here once, by MAX's own repack kernel, when a stage binds it.
The repacked bytes (as many as the stored ones) live in the runtime's memory; the artifact's
stored bytes are read once and stay byte for byte what its manifest hashes. Imports `max`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from max.driver import Buffer
from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, ops

# MAX's repack kernel for each block format its product kernels run.
REPACK_OPS = {"q4_0": "vroom_q4_0_repack_weights", "q4_k": "vroom_q4_k_repack_weights",
              "q6_k": "vroom_q6_k_repack_weights"}


def repack_graph(fmt: str, device: DeviceRef) -> Graph:
    """uint8 [N, row bytes] in GGUF's layout -> the same bytes in MAX's product layout (any N, row bytes)."""
    shape = ["N", "B"]
    with Graph(f"fornax_repack_{fmt}", input_types=[TensorType(DType.uint8, shape, device=device)]) as graph:
        stored = graph.inputs[0].tensor
        out = TensorType(DType.uint8, stored.shape, device=device)
        graph.output(ops.custom(REPACK_OPS[fmt], device, [stored], out_types=[out])[0].tensor)
    return graph


class Repacker:
    """Compiles each format's repack graph once per session and repacks weights with it."""

    def __init__(self, session: Any, device: Any, device_ref: DeviceRef) -> None:
        self._session, self._device, self._device_ref = session, device, device_ref
        self._models: dict[str, Any] = {}

    def repack(self, fmt: str, stored: np.ndarray) -> Any:
        """A device buffer holding `stored` (uint8 [N, row bytes], GGUF layout) in MAX's layout."""
        if fmt not in REPACK_OPS:
            raise ValueError(f"MAX has no product kernel for {fmt} to lay weights out for")
        if fmt not in self._models:
            self._models[fmt] = self._session.load(repack_graph(fmt, self._device_ref))
        source = Buffer.from_numpy(np.ascontiguousarray(stored))
        if self._device_ref != DeviceRef.CPU():
            source = source.to(self._device)
        (packed,) = self._models[fmt].execute(source)
        return packed
