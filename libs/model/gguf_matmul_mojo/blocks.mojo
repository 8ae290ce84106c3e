"""Dequantize rows of GGUF blocks to float32, value for value as `gguf.quants.dequantize`.

`chunk[fmt, j](blk)` is the j-th run of 32 values of the block at `blk`, as one float32 SIMD
vector (a 32-element format has one; Q4_K and Q6_K have eight); `decode_row[fmt]` writes a
whole row of `K` values. Block layouts are GGUF's (ggml-common.h); every scale is
an f16 at an even byte offset.
"""

from std.memory import bitcast

comptime Q8_0 = 0
comptime Q4_0 = 1
comptime Q5_0 = 2
comptime Q5_1 = 3
comptime Q4_K = 4
comptime Q6_K = 5


def block_elems[fmt: Int]() -> Int:
    comptime if fmt == Q4_K or fmt == Q6_K:
        return 256
    return 32


def block_bytes[fmt: Int]() -> Int:
    comptime if fmt == Q8_0:
        return 34
    comptime if fmt == Q4_0:
        return 18
    comptime if fmt == Q5_0:
        return 22
    comptime if fmt == Q5_1:
        return 24
    comptime if fmt == Q4_K:
        return 144
    return 210


@always_inline
def half_at(p: Pointer[mut=True, UInt8, _], off: Int) -> Float32:
    """The little-endian f16 at `p + off`, exactly, as float32.

    A normal f16 moves its exponent and mantissa into float32 position and rebiases the
    exponent by 112 (the bias difference) in integer arithmetic; a subnormal one is its
    mantissa times 2^-24. No float32 subnormal is formed on the way: the runtime may run
    with denormals-are-zero, which made every subnormal scale 0 (a whole layer of small
    weights, whose Q4_K scales are mostly f16 subnormals, read as zeros). The sign is copied.
    Inf and NaN are not kept (stores refuse non-finite scales before load). Much faster than
    the compiler's generic f16 conversion in this loop.
    """
    var h = UInt32(p.unsafe_load(off)) | (UInt32(p.unsafe_load(off + 1)) << 8)
    var normal = bitcast[DType.float32, 1](((h & 0x7FFF) << 13) + 0x38000000)
    var subnormal = (h & 0x3FF).cast[DType.float32]() * 5.960464477539063e-08
    var magnitude = normal if (h & 0x7C00) != 0 else subnormal
    return bitcast[DType.float32, 1](bitcast[DType.uint32, 1](magnitude) | ((h & 0x8000) << 16))


comptime Chunk = SIMD[DType.float32, 32]


@always_inline
def _q4_k_scale_min(sc: Pointer[mut=True, UInt8, _], comptime_index: Int) -> Tuple[Float32, Float32]:
    """The 6-bit (scale, min) of sub-block `comptime_index` of a Q4_K block's 12 scale bytes."""
    var i = comptime_index
    if i < 4:
        return (Float32(Int(sc.unsafe_load(i) & 63)), Float32(Int(sc.unsafe_load(i + 4) & 63)))
    var s = (sc.unsafe_load(i + 4) & 0xF) | ((sc.unsafe_load(i - 4) >> 6) << 4)
    var m = (sc.unsafe_load(i + 4) >> 4) | ((sc.unsafe_load(i) >> 6) << 4)
    return (Float32(Int(s)), Float32(Int(m)))


@always_inline
def chunk[fmt: Int, j: Int](blk: Pointer[mut=True, UInt8, _]) -> Chunk:
    comptime if fmt == Q8_0:
        return blk.unsafe_load[width=32](2).cast[DType.int8]().cast[DType.float32]() * half_at(blk, 0)
    elif fmt == Q4_0:
        var qs = blk.unsafe_load[width=16](2)
        var q = (qs & 0xF).join(qs >> 4).cast[DType.float32]() - 8.0
        return q * half_at(blk, 0)
    elif fmt == Q5_0 or fmt == Q5_1:
        comptime QH = 4 if fmt == Q5_1 else 2
        var qh = UInt32(blk.unsafe_load(QH)) | (UInt32(blk.unsafe_load(QH + 1)) << 8) | (
            UInt32(blk.unsafe_load(QH + 2)) << 16) | (UInt32(blk.unsafe_load(QH + 3)) << 24)
        var qs = blk.unsafe_load[width=16](QH + 4).cast[DType.uint32]()
        var lane = SIMD[DType.uint32, 16](0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
        var qhv = SIMD[DType.uint32, 16](qh)
        var lo = (qs & 0xF) | (((qhv >> lane) << 4) & 0x10)
        var hi = (qs >> 4) | ((qhv >> (lane + 12)) & 0x10)
        var q = lo.join(hi).cast[DType.float32]()
        comptime if fmt == Q5_0:
            return (q - 16.0) * half_at(blk, 0)
        else:
            return q * half_at(blk, 0) + half_at(blk, 2)
    elif fmt == Q4_K:
        # 4 runs of 64: 32 low nibbles (sub-block j), then 32 high nibbles (sub-block j + 1)
        var sm = _q4_k_scale_min(blk.unsafe_offset(4), j)
        var q = blk.unsafe_load[width=32](16 + 32 * (j // 2))
        comptime if j % 2 == 0:
            q = q & 0xF
        else:
            q = q >> 4
        return q.cast[DType.float32]() * (half_at(blk, 0) * sm[0]) - half_at(blk, 2) * sm[1]
    else:  # Q6_K: 2 halves of 128; run j is quarter j % 4 of half j // 4
        comptime half = j // 4
        comptime quarter = j % 4
        var ql = blk.unsafe_load[width=32](64 * half + 32 * (quarter % 2))
        var qh = blk.unsafe_load[width=32](128 + 32 * half)
        comptime if quarter >= 2:
            ql = ql >> 4
        else:
            ql = ql & 0xF
        var q = (ql | (((qh >> SIMD[DType.uint8, 32](2 * quarter)) & 3) << 4)).cast[DType.float32]() - 32.0
        comptime sc = 192 + 8 * half + 2 * quarter
        var d = half_at(blk, 208)
        var s0 = d * blk.unsafe_load(sc).cast[DType.int8]().cast[DType.float32]()
        var s1 = d * blk.unsafe_load(sc + 1).cast[DType.int8]().cast[DType.float32]()
        return q * SIMD[DType.float32, 16](s0).join(SIMD[DType.float32, 16](s1))


@always_inline
def decode_row[fmt: Int](src: Pointer[mut=True, UInt8, _], dst: Pointer[mut=True, Float32, _], k: Int):
    comptime BE = block_elems[fmt]()
    comptime BB = block_bytes[fmt]()
    for b in range(k // BE):
        var blk = src.unsafe_offset(b * BB)
        comptime for j in range(BE // 32):
            dst.unsafe_store(b * BE + 32 * j, chunk[fmt, j](blk))
