"""Dequantize rows of GGUF blocks to float32, value for value as `gguf.quants.dequantize`.

Each `decode_row[fmt]` reads the `K / block` blocks of one weight row at `src` and writes
its `K` float32 values at `dst`. Block layouts are GGUF's (ggml-common.h); every scale is
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
    var bits = UInt16(p.unsafe_load(off)) | (UInt16(p.unsafe_load(off + 1)) << 8)
    return bitcast[DType.float16, 1](bits).cast[DType.float32]()


@always_inline
def decode_row[fmt: Int](src: Pointer[mut=True, UInt8, _], dst: Pointer[mut=True, Float32, _], k: Int):
    comptime BE = block_elems[fmt]()
    comptime BB = block_bytes[fmt]()
    for b in range(k // BE):
        var blk = src + b * BB
        var o = dst + b * BE
        comptime if fmt == Q8_0:
            var d = half_at(blk, 0)
            var q = (blk + 2).unsafe_load[width=32]().cast[DType.int8]().cast[DType.float32]()
            o.unsafe_store(0, q * d)
        comptime if fmt == Q4_0:
            var d = half_at(blk, 0)
            var qs = (blk + 2).unsafe_load[width=16]()
            var lo = (qs & 0xF).cast[DType.float32]() - 8.0
            var hi = (qs >> 4).cast[DType.float32]() - 8.0
            o.unsafe_store(0, lo * d)
            o.unsafe_store(16, hi * d)
        comptime if fmt == Q5_0 or fmt == Q5_1:
            var d = half_at(blk, 0)
            comptime QH = 4 if fmt == Q5_1 else 2
            var qh = UInt32(blk.unsafe_load(QH)) | (UInt32(blk.unsafe_load(QH + 1)) << 8) | (
                UInt32(blk.unsafe_load(QH + 2)) << 16) | (UInt32(blk.unsafe_load(QH + 3)) << 24)
            var qs = (blk + QH + 4).unsafe_load[width=16]().cast[DType.uint32]()
            var j = SIMD[DType.uint32, 16](0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
            var qhv = SIMD[DType.uint32, 16](qh)
            var h0 = ((qhv >> j) << 4) & 0x10
            var h1 = (qhv >> (j + 12)) & 0x10
            var lo = ((qs & 0xF) | h0).cast[DType.float32]()
            var hi = ((qs >> 4) | h1).cast[DType.float32]()
            comptime if fmt == Q5_0:
                o.unsafe_store(0, (lo - 16.0) * d)
                o.unsafe_store(16, (hi - 16.0) * d)
            else:
                var m = half_at(blk, 2)
                o.unsafe_store(0, lo * d + m)
                o.unsafe_store(16, hi * d + m)
        comptime if fmt == Q4_K:
            var d = half_at(blk, 0)
            var dmin = half_at(blk, 2)
            var sc = blk + 4
            var qs = blk + 16
            comptime for j in range(4):
                comptime is0 = 2 * j
                comptime is1 = 2 * j + 1
                var s0: Int
                var m0: Int
                var s1: Int
                var m1: Int
                comptime if j < 2:
                    s0 = Int(sc.unsafe_load(is0) & 63)
                    m0 = Int(sc.unsafe_load(is0 + 4) & 63)
                    s1 = Int(sc.unsafe_load(is1) & 63)
                    m1 = Int(sc.unsafe_load(is1 + 4) & 63)
                else:
                    s0 = Int((sc.unsafe_load(is0 + 4) & 0xF) | ((sc.unsafe_load(is0 - 4) >> 6) << 4))
                    m0 = Int((sc.unsafe_load(is0 + 4) >> 4) | ((sc.unsafe_load(is0) >> 6) << 4))
                    s1 = Int((sc.unsafe_load(is1 + 4) & 0xF) | ((sc.unsafe_load(is1 - 4) >> 6) << 4))
                    m1 = Int((sc.unsafe_load(is1 + 4) >> 4) | ((sc.unsafe_load(is1) >> 6) << 4))
                var d0 = d * Float32(s0)
                var d1 = d * Float32(s1)
                var mm0 = dmin * Float32(m0)
                var mm1 = dmin * Float32(m1)
                var q = (qs + 32 * j).unsafe_load[width=32]()
                o.unsafe_store(64 * j, (q & 0xF).cast[DType.float32]() * d0 - mm0)
                o.unsafe_store(64 * j + 32, (q >> 4).cast[DType.float32]() * d1 - mm1)
        comptime if fmt == Q6_K:
            var d = half_at(blk, 208)
            comptime for half in range(2):
                var ql = blk + 64 * half
                var qh = blk + 128 + 32 * half
                var scp = blk + 192 + 8 * half
                var oh = o + 128 * half
                comptime for part in range(2):
                    # l in [16 * part, 16 * part + 16): scale index is = part
                    comptime l0 = 16 * part
                    var a = (ql + l0).unsafe_load[width=16]()
                    var c = (ql + 32 + l0).unsafe_load[width=16]()
                    var h = (qh + l0).unsafe_load[width=16]()
                    var q1 = ((a & 0xF) | ((h & 3) << 4)).cast[DType.float32]() - 32.0
                    var q2 = ((c & 0xF) | (((h >> 2) & 3) << 4)).cast[DType.float32]() - 32.0
                    var q3 = ((a >> 4) | (((h >> 4) & 3) << 4)).cast[DType.float32]() - 32.0
                    var q4 = ((c >> 4) | (((h >> 6) & 3) << 4)).cast[DType.float32]() - 32.0
                    var s1 = d * scp.unsafe_load(part).cast[DType.int8]().cast[DType.float32]()
                    var s2 = d * scp.unsafe_load(part + 2).cast[DType.int8]().cast[DType.float32]()
                    var s3 = d * scp.unsafe_load(part + 4).cast[DType.int8]().cast[DType.float32]()
                    var s4 = d * scp.unsafe_load(part + 6).cast[DType.int8]().cast[DType.float32]()
                    oh.unsafe_store(l0, q1 * s1)
                    oh.unsafe_store(l0 + 32, q2 * s2)
                    oh.unsafe_store(l0 + 64, q3 * s3)
                    oh.unsafe_store(l0 + 96, q4 * s4)
