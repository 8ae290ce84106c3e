"""`y[M, N] = x[M, K] @ W^T` with float32 activations and W in a GGUF block format.

W is uint8 [N, row bytes], each row its GGUF blocks. Work is split over N (output columns)
across the CPU's threads. With few activation rows (decode, M <= FUSED_MAX_ROWS) each weight
block is decoded into registers, 32 values at a time, and multiplied straight into up to
ROW_GROUP rows' accumulators, so the weights stream through once per row group. With more
rows each task decodes a tile of 4 weight rows to float32 into its own L1/L2-resident buffer
once and runs dot products against every activation row, 4 rows x 4 columns at a time.
Nothing is rounded below float32: the only error is float32 summation order.
"""

import extensibility
from extensibility import InputTensor, OutputTensor
from max.algorithm import sync_parallelize
from max.gpu.host import DeviceContext
from std.math import ceildiv
from std.sys.info import simd_width_of

from .blocks import Q8_0, Q4_0, Q5_0, Q5_1, Q4_K, Q6_K, Chunk, block_bytes, block_elems, chunk, decode_row

comptime COLS_PER_TILE = 4  # weight rows decoded together, sharing each activation load
comptime TASK_COLS = 32  # output columns per parallel task
comptime DOT_WIDTH = 32  # every block format's row length is a multiple of 32
comptime FUSED_MAX_ROWS = 8
comptime ROW_GROUP = 4


@always_inline
def fused_columns[fmt: Int, R: Int](
    y: Pointer[mut=True, Float32, _], x: Pointer[mut=True, Float32, _], w: Pointer[mut=True, UInt8, _],
    n: Int, k: Int, row_bytes: Int, r0: Int, c_begin: Int, c_end: Int,
):
    """Rows r0..r0+R of y, columns c_begin..c_end, decoding each weight block in registers."""
    comptime BE = block_elems[fmt]()
    comptime BB = block_bytes[fmt]()
    var xr = x.unsafe_offset(r0 * k)
    for c in range(c_begin, c_end):
        var a0 = Chunk(0)
        var a1 = Chunk(0)
        var a2 = Chunk(0)
        var a3 = Chunk(0)
        var wrow = w.unsafe_offset(c * row_bytes)
        for b in range(k // BE):
            var blk = wrow.unsafe_offset(b * BB)
            comptime for j in range(BE // 32):
                var v = chunk[fmt, j](blk)
                var at = b * BE + 32 * j
                a0 = xr.unsafe_load[width=32](at).fma(v, a0)
                comptime if R > 1:
                    a1 = xr.unsafe_load[width=32](k + at).fma(v, a1)
                comptime if R > 2:
                    a2 = xr.unsafe_load[width=32](2 * k + at).fma(v, a2)
                comptime if R > 3:
                    a3 = xr.unsafe_load[width=32](3 * k + at).fma(v, a3)
        y.unsafe_store(r0 * n + c, a0.reduce_add())
        comptime if R > 1:
            y.unsafe_store((r0 + 1) * n + c, a1.reduce_add())
        comptime if R > 2:
            y.unsafe_store((r0 + 2) * n + c, a2.reduce_add())
        comptime if R > 3:
            y.unsafe_store((r0 + 3) * n + c, a3.reduce_add())


@always_inline
def fused_one_row[fmt: Int](
    y: Pointer[mut=True, Float32, _], x: Pointer[mut=True, Float32, _], w: Pointer[mut=True, UInt8, _],
    n: Int, k: Int, row_bytes: Int, r0: Int, c_begin: Int, c_end: Int,
):
    """`fused_columns[fmt, 1]`, two weight rows at a time: two independent decode and FMA chains."""
    comptime BE = block_elems[fmt]()
    comptime BB = block_bytes[fmt]()
    var xr = x.unsafe_offset(r0 * k)
    var c = c_begin
    while c + 2 <= c_end:
        var a0 = Chunk(0)
        var a1 = Chunk(0)
        var w0 = w.unsafe_offset(c * row_bytes)
        var w1 = w.unsafe_offset((c + 1) * row_bytes)
        for b in range(k // BE):
            var blk0 = w0.unsafe_offset(b * BB)
            var blk1 = w1.unsafe_offset(b * BB)
            comptime for j in range(BE // 32):
                var xv = xr.unsafe_load[width=32](b * BE + 32 * j)
                a0 = xv.fma(chunk[fmt, j](blk0), a0)
                a1 = xv.fma(chunk[fmt, j](blk1), a1)
        y.unsafe_store(r0 * n + c, a0.reduce_add())
        y.unsafe_store(r0 * n + c + 1, a1.reduce_add())
        c += 2
    if c < c_end:
        fused_columns[fmt, 1](y, x, w, n, k, row_bytes, r0, c, c_end)


@always_inline
def fused_rows[fmt: Int](
    y: Pointer[mut=True, Float32, _], x: Pointer[mut=True, Float32, _], w: Pointer[mut=True, UInt8, _],
    m: Int, n: Int, k: Int, row_bytes: Int, c_begin: Int, c_end: Int,
):
    for r0 in range(0, m, ROW_GROUP):
        var rows = min(ROW_GROUP, m - r0)
        if rows == 4:
            fused_columns[fmt, 4](y, x, w, n, k, row_bytes, r0, c_begin, c_end)
        elif rows == 3:
            fused_columns[fmt, 3](y, x, w, n, k, row_bytes, r0, c_begin, c_end)
        elif rows == 2:
            fused_columns[fmt, 2](y, x, w, n, k, row_bytes, r0, c_begin, c_end)
        else:
            fused_one_row[fmt](y, x, w, n, k, row_bytes, r0, c_begin, c_end)


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


@always_inline
def dot_4x4(
    x: Pointer[mut=True, Float32, _], w: Pointer[mut=True, Float32, _], k: Int,
    y: Pointer[mut=True, Float32, _], n: Int,
):
    """Set y[r * n + c] to the dot of activation row r and decoded weight row c, for r, c < 4:
    each loaded vector feeds four FMAs (16 accumulators)."""
    comptime W = 16
    var acc = SIMD[DType.float32, W * 16](0)
    for i in range(0, k, W):
        var x0 = x.unsafe_load[width=W](i)
        var x1 = x.unsafe_load[width=W](k + i)
        var x2 = x.unsafe_load[width=W](2 * k + i)
        var x3 = x.unsafe_load[width=W](3 * k + i)
        comptime for c in range(4):
            var wv = w.unsafe_load[width=W](c * k + i)
            var a0 = acc.slice[W, offset=W * c]()
            var a1 = acc.slice[W, offset=W * (4 + c)]()
            var a2 = acc.slice[W, offset=W * (8 + c)]()
            var a3 = acc.slice[W, offset=W * (12 + c)]()
            acc = acc.insert[offset=W * c](x0.fma(wv, a0))
            acc = acc.insert[offset=W * (4 + c)](x1.fma(wv, a1))
            acc = acc.insert[offset=W * (8 + c)](x2.fma(wv, a2))
            acc = acc.insert[offset=W * (12 + c)](x3.fma(wv, a3))
    comptime for r in range(4):
        comptime for c in range(4):
            y.unsafe_store(r * n + c, acc.slice[W, offset=W * (4 * r + c)]().reduce_add())


def gguf_matmul[fmt: Int](
    y: Pointer[mut=True, Float32, _], x: Pointer[mut=True, Float32, _], w: Pointer[mut=True, UInt8, _],
    m: Int, n: Int, k: Int,
) raises:
    var row_bytes = k // (256 if fmt == Q4_K or fmt == Q6_K else 32) * block_bytes[fmt]()
    var tasks = ceildiv(n, TASK_COLS)

    def task(t: Int) {imm}:
        var end = min(n, (t + 1) * TASK_COLS)
        if m <= FUSED_MAX_ROWS:
            fused_rows[fmt](y, x, w, m, n, k, row_bytes, t * TASK_COLS, end)
            return
        var buf_store = List[Float32](length=COLS_PER_TILE * k, fill=0)
        var sums_store = List[Float32](length=COLS_PER_TILE, fill=0)
        var buf = buf_store.unsafe_ptr()
        var sums = sums_store.unsafe_ptr()
        for c0 in range(t * TASK_COLS, end, COLS_PER_TILE):
            var cols = min(COLS_PER_TILE, end - c0)
            for c in range(cols):
                decode_row[fmt](w.unsafe_offset((c0 + c) * row_bytes), buf.unsafe_offset(c * k), k)
            var r = 0
            if cols == COLS_PER_TILE:
                while r + 4 <= m:
                    dot_4x4(x.unsafe_offset(r * k), buf, k, y.unsafe_offset(r * n + c0), n)
                    r += 4
            while r < m:
                dot_tile(x.unsafe_offset(r * k), buf, k, cols, sums)
                for c in range(cols):
                    y.unsafe_store(r * n + c0 + c, sums.unsafe_load(c))
                r += 1
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
