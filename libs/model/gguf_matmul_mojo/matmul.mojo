"""`y[M, N] = x[M, K] @ W^T` with float32 activations and W in a GGUF block format.

W is uint8 [N, row bytes], each row its GGUF blocks. Work is split over N (output columns)
across the CPU's threads; each task decodes a tile of weight rows to float32 into its own
buffer (L1/L2 resident) and runs float32 FMA dot products against every activation row.
Nothing is rounded below float32: the only error is float32 summation order.
"""

import extensibility
from extensibility import InputTensor, OutputTensor
from max.algorithm import sync_parallelize
from max.gpu.host import DeviceContext
from std.math import ceildiv
from std.sys.info import simd_width_of

from .blocks import Q8_0, Q4_0, Q5_0, Q5_1, Q4_K, Q6_K, block_bytes, decode_row

comptime COLS_PER_TILE = 4  # weight rows decoded together, sharing each activation load
comptime TASK_COLS = 32  # output columns per parallel task
comptime DOT_WIDTH = 32  # every block format's row length is a multiple of 32


@always_inline
def dot_tile(
    x: Pointer[mut=True, Float32, _], w: Pointer[mut=True, Float32, _], k: Int, cols: Int,
    sums: Pointer[mut=True, Float32, _],
):
    """Set sums[c] to the dot of x[:k] and w[c * k : (c + 1) * k] for c < cols (cols <= COLS_PER_TILE)."""
    comptime W = DOT_WIDTH
    var a0 = SIMD[DType.float32, W](0)
    var a1 = SIMD[DType.float32, W](0)
    var a2 = SIMD[DType.float32, W](0)
    var a3 = SIMD[DType.float32, W](0)
    if cols == COLS_PER_TILE:
        for i in range(0, k, W):
            var xv = x.unsafe_load[width=W](i)
            a0 = xv.fma(w.unsafe_load[width=W](i), a0)
            a1 = xv.fma(w.unsafe_load[width=W](k + i), a1)
            a2 = xv.fma(w.unsafe_load[width=W](2 * k + i), a2)
            a3 = xv.fma(w.unsafe_load[width=W](3 * k + i), a3)
        sums.unsafe_store(0, a0.reduce_add())
        sums.unsafe_store(1, a1.reduce_add())
        sums.unsafe_store(2, a2.reduce_add())
        sums.unsafe_store(3, a3.reduce_add())
    else:
        for c in range(cols):
            var acc = SIMD[DType.float32, W](0)
            for i in range(0, k, W):
                acc = x.unsafe_load[width=W](i).fma(w.unsafe_load[width=W](c * k + i), acc)
            sums.unsafe_store(c, acc.reduce_add())


def gguf_matmul[fmt: Int](
    y: Pointer[mut=True, Float32, _], x: Pointer[mut=True, Float32, _], w: Pointer[mut=True, UInt8, _],
    m: Int, n: Int, k: Int,
) raises:
    var row_bytes = k // (256 if fmt == Q4_K or fmt == Q6_K else 32) * block_bytes[fmt]()
    var tasks = ceildiv(n, TASK_COLS)

    def task(t: Int) {imm}:
        var buf_store = List[Float32](length=COLS_PER_TILE * k, fill=0)
        var sums_store = List[Float32](length=COLS_PER_TILE, fill=0)
        var buf = buf_store.unsafe_ptr()
        var sums = sums_store.unsafe_ptr()
        var end = min(n, (t + 1) * TASK_COLS)
        for c0 in range(t * TASK_COLS, end, COLS_PER_TILE):
            var cols = min(COLS_PER_TILE, end - c0)
            for c in range(cols):
                decode_row[fmt](w + (c0 + c) * row_bytes, buf + c * k, k)
            for r in range(m):
                dot_tile(x + r * k, buf, k, cols, sums)
                for c in range(cols):
                    y.unsafe_store(r * n + c0 + c, sums.unsafe_load(c))
        _ = buf_store^
        _ = sums_store^

    sync_parallelize(task, tasks)


@always_inline
def run[fmt: Int](
    output: OutputTensor[dtype=DType.float32, rank=2, ...],
    x: InputTensor[dtype=DType.float32, rank=2, ...],
    w: InputTensor[dtype=DType.uint8, rank=2, ...],
) raises:
    var m = x.dim_size(0)
    var k = x.dim_size(1)
    var n = w.dim_size(0)
    if output.dim_size(0) != m or output.dim_size(1) != n:
        raise Error("gguf matmul: output shape does not match [M, N]")
    gguf_matmul[fmt](output.unsafe_ptr(), x.unsafe_ptr(), w.unsafe_ptr(), m, n, k)


@extensibility.register("fornax_gguf_matmul_q8_0")
struct GgufMatmulQ8_0:
    @staticmethod
    def execute[target: StaticString](
        output: OutputTensor[dtype=DType.float32, rank=2, ...],
        x: InputTensor[dtype=DType.float32, rank=2, ...],
        w: InputTensor[dtype=DType.uint8, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        run[Q8_0](output, x, w)


@extensibility.register("fornax_gguf_matmul_q4_k")
struct GgufMatmulQ4_K:
    @staticmethod
    def execute[target: StaticString](
        output: OutputTensor[dtype=DType.float32, rank=2, ...],
        x: InputTensor[dtype=DType.float32, rank=2, ...],
        w: InputTensor[dtype=DType.uint8, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        run[Q4_K](output, x, w)


@extensibility.register("fornax_gguf_matmul_q6_k")
struct GgufMatmulQ6_K:
    @staticmethod
    def execute[target: StaticString](
        output: OutputTensor[dtype=DType.float32, rank=2, ...],
        x: InputTensor[dtype=DType.float32, rank=2, ...],
        w: InputTensor[dtype=DType.uint8, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        run[Q6_K](output, x, w)


@extensibility.register("fornax_gguf_matmul_q4_0")
struct GgufMatmulQ4_0:
    @staticmethod
    def execute[target: StaticString](
        output: OutputTensor[dtype=DType.float32, rank=2, ...],
        x: InputTensor[dtype=DType.float32, rank=2, ...],
        w: InputTensor[dtype=DType.uint8, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        run[Q4_0](output, x, w)


@extensibility.register("fornax_gguf_matmul_q5_0")
struct GgufMatmulQ5_0:
    @staticmethod
    def execute[target: StaticString](
        output: OutputTensor[dtype=DType.float32, rank=2, ...],
        x: InputTensor[dtype=DType.float32, rank=2, ...],
        w: InputTensor[dtype=DType.uint8, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        run[Q5_0](output, x, w)


@extensibility.register("fornax_gguf_matmul_q5_1")
struct GgufMatmulQ5_1:
    @staticmethod
    def execute[target: StaticString](
        output: OutputTensor[dtype=DType.float32, rank=2, ...],
        x: InputTensor[dtype=DType.float32, rank=2, ...],
        w: InputTensor[dtype=DType.uint8, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        run[Q5_1](output, x, w)
