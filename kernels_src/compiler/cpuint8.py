"""16-lane integer vectors for Numba's CPU code: the quantizer's steps on whole registers (chapter 11).

A quantizer turns 32 floats into one scale and 32 small integers. Written as scalar Numba, the 32-value loops
of a block are short, and LLVM vectorizes each with a runtime alias check and a scalar remainder, and the
block's max|x|, its first-wins signed max and the integer packing stay partly scalar (``kernels asm``). These
intrinsics say the vector steps directly, on :data:`f32x16` vectors from :mod:`.cpusimd` and on a new integer
vector type, ``i32x16`` (an LLVM ``<16 x i32>``: one zmm register on AVX-512, two ymm registers on AVX2):

    vmul16(a, b)               a * b per lane, one rounding (``vmulps``; never contracted into an FMA)
    vabsmax_bits16(a, b)       max over the 32 lanes of a and b of |x|'s bits (sign cleared), an int32:
                               ``vpandd``, ``vpmaxsd`` and a log2 reduction. For non-negative floats integer
                               order is float order, and a NaN's bits lie above inf's, so a NaN wins (np.max)
    vfirst_absbits16(a, bits)  the first lane of a whose |x| bits equal ``bits`` (16 if none):
                               ``vpcmpeqd`` to a mask register, then ``tzcnt``
    vtrunc16(a)                int32 lanes, truncated toward zero (``vcvttps2dq``)
    vround_away16(a)           int32 lanes, C's roundf (ties away from zero), exactly: t = trunc(a), the
                               fraction a - t is exact, and t moves by one where it is >= 0.5 (<= -0.5)
    vmini16(t, k)              min(t, k) per lane, k an integer scalar (``vpminsd``)
    vstore_bytes16(u8, i, t)   u8[i:i+16] = the low byte of each lane (``vpmovdb`` on AVX-512)
    vstore_nibbles16(u8, i, lo, hi)   u8[i:i+16] = lo | (hi << 4), low byte of each lane (Q4_0's packing)
    vload_u8x16(u8, i)         u8[i:i+16] as int32 lanes, zero-extended (``vpmovzxbd``)
    vload_i8x16(i8, i)         i8[i:i+16] of an int8 array as int32 lanes, sign-extended (``vpmovsxbd``)
    vandi16(t, k), vshri16(t, k)   t & k, t >> k per lane, k a literal (``vpandd``, ``vpsrld``): the nibbles
    vcvt16(t)                  int32 lanes to float32 (``vcvtdq2ps``)
    vsub16(a, b)               a - b per lane (``vsubps``)
    vsum16(a)                  the 16 lanes' sum, by halves (once per output, not once per block)

Integer lanes stay 32-bit: Numba's own integer arithmetic widens to int64, which halves the lanes per
register. Out-of-range conversions (inf or NaN lanes) give what the hardware gives, 0x80000000, whose low
byte 0 is what the scalar rungs store too. No bounds are checked (like C's intrinsics): the caller
guarantees ``0 <= i`` and ``i + 16 <= len(u8)``. Generic LLVM vector IR only, so the same code runs on any
x86-64 (and elsewhere LLVM has vectors).
"""
from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.core.datamodel import models, register_default
from numba.extending import intrinsic

from .cpusimd import f32x16

LANES = 16
_I32 = ir.IntType(32)
_I8 = ir.IntType(8)
_FVEC = ir.VectorType(ir.FloatType(), LANES)
_IVEC = ir.VectorType(_I32, LANES)
_BVEC = ir.VectorType(_I8, LANES)


class I32x16(types.Type):
    """The Numba type of a 16-lane int32 vector value (an LLVM ``<16 x i32>``)."""

    def __init__(self):
        super().__init__(name="i32x16")


i32x16 = I32x16()


@register_default(I32x16)
class _I32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _IVEC)


def _splat(value, vec):
    return ir.Constant(vec, [value] * LANES)


def _is_u8_array(a):
    return isinstance(a, types.Array) and a.dtype == types.uint8 and a.ndim == 1 and a.layout == "C"


def _bytes_ptr(context, builder, aty, arr, idx):
    ary = context.make_array(aty)(context, builder, arr)
    return builder.bitcast(cgutils.gep(builder, ary.data, idx), _BVEC.as_pointer())


def _abs_bits(builder, v):
    return builder.and_(builder.bitcast(v, _IVEC), _splat(0x7FFFFFFF, _IVEC))


@intrinsic
def vmul16(typingctx, a, b):
    """a * b per lane (``vmulps``), rounded once; LLVM never fuses it with a later add (no fast-math flags)."""
    if not (a == f32x16 and b == f32x16):
        return None

    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], args[1])

    return f32x16(a, b), codegen


@intrinsic
def vabsmax_bits16(typingctx, a, b):
    """max over the 32 lanes of a and b of the int32 bits of |x| (the float's bits with the sign cleared)."""
    if not (a == f32x16 and b == f32x16):
        return None

    def codegen(context, builder, sig, args):
        ia, ib = _abs_bits(builder, args[0]), _abs_bits(builder, args[1])
        both = builder.select(builder.icmp_signed(">", ia, ib), ia, ib)
        fnty = ir.FunctionType(_I32, [_IVEC])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.vector.reduce.smax.v16i32")
        return builder.call(fn, [both])

    return types.int32(a, b), codegen


@intrinsic
def vfirst_absbits16(typingctx, a, bits):
    """The index of the first lane of a whose |x| bits equal ``bits``, or 16 where none does."""
    if not (a == f32x16 and isinstance(bits, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        want = context.cast(builder, args[1], sig.args[1], types.int32)
        row = builder.insert_element(ir.Constant(_IVEC, ir.Undefined), want, ir.Constant(_I32, 0))
        row = builder.shuffle_vector(row, ir.Constant(_IVEC, ir.Undefined), _splat(0, _IVEC))
        eq = builder.icmp_signed("==", _abs_bits(builder, args[0]), row)  # <16 x i1>
        m = builder.zext(builder.bitcast(eq, ir.IntType(16)), _I32)
        m = builder.or_(m, ir.Constant(_I32, 1 << 16))  # no lane: the answer is 16
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I32, [_I32, ir.IntType(1)]),
                                            "llvm.cttz.i32")
        return builder.call(fn, [m, ir.Constant(ir.IntType(1), 1)])

    return types.int32(a, bits), codegen


@intrinsic
def vtrunc16(typingctx, a):
    """int32 lanes truncated toward zero (``vcvttps2dq``)."""
    if a != f32x16:
        return None

    def codegen(context, builder, sig, args):
        return builder.fptosi(args[0], _IVEC)

    return i32x16(a), codegen


@intrinsic
def vround_away16(typingctx, a):
    """C's roundf per lane (ties away from zero), exactly, as int32 lanes: t = trunc(a); f = a - t (exact: same
    binade or smaller); t + (0.5 <= f < 1) - (-1 < f <= -0.5). An inf or NaN lane keeps t (f is NaN)."""
    if a != f32x16:
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        t = builder.fptosi(v, _IVEC)
        f = builder.fsub(v, builder.sitofp(t, _FVEC))
        half, one = _splat(0.5, _FVEC), _splat(1.0, _FVEC)
        up = builder.and_(builder.fcmp_ordered(">=", f, half), builder.fcmp_ordered("<", f, one))
        dn = builder.and_(builder.fcmp_ordered("<=", f, _splat(-0.5, _FVEC)),
                          builder.fcmp_ordered(">", f, _splat(-1.0, _FVEC)))
        return builder.sub(builder.add(t, builder.zext(up, _IVEC)), builder.zext(dn, _IVEC))

    return i32x16(a), codegen


@intrinsic
def vmini16(typingctx, t, k):
    """min(t, k) per lane, signed, k an integer scalar (``vpminsd``)."""
    if not (t == i32x16 and isinstance(k, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        kk = context.cast(builder, args[1], sig.args[1], types.int32)
        row = builder.insert_element(ir.Constant(_IVEC, ir.Undefined), kk, ir.Constant(_I32, 0))
        row = builder.shuffle_vector(row, ir.Constant(_IVEC, ir.Undefined), _splat(0, _IVEC))
        return builder.select(builder.icmp_signed("<", args[0], row), args[0], row)

    return i32x16(t, k), codegen


@intrinsic
def vstore_bytes16(typingctx, u8, i, t):
    """u8[i:i+16] = the low byte of each lane of t (``vpmovdb`` on AVX-512, packs on AVX2)."""
    if not (_is_u8_array(u8) and isinstance(i, types.Integer) and t == i32x16):
        return None

    def codegen(context, builder, sig, args):
        ptr = _bytes_ptr(context, builder, sig.args[0], args[0], args[1])
        builder.store(builder.trunc(args[2], _BVEC), ptr, align=1)
        return context.get_dummy_value()

    return types.void(u8, i, t), codegen


@intrinsic
def vstore_nibbles16(typingctx, u8, i, lo, hi):
    """u8[i:i+16] = the low byte of lo | (hi << 4) per lane: GGML's Q4_0 packing of elements j and j + 16."""
    if not (_is_u8_array(u8) and isinstance(i, types.Integer) and lo == i32x16 and hi == i32x16):
        return None

    def codegen(context, builder, sig, args):
        ptr = _bytes_ptr(context, builder, sig.args[0], args[0], args[1])
        packed = builder.or_(args[2], builder.shl(args[3], _splat(4, _IVEC)))
        builder.store(builder.trunc(packed, _BVEC), ptr, align=1)
        return context.get_dummy_value()

    return types.void(u8, i, lo, hi), codegen


# ------------------------------------------------------------ Q4_0 GEMV: bytes in, floats out, one sum at the end
@intrinsic
def vload_u8x16(typingctx, u8, i):
    """u8[i:i+16] as 16 int32 lanes, zero-extended (``vpmovzxbd``: one load and one widening)."""
    if not (_is_u8_array(u8) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _bytes_ptr(context, builder, sig.args[0], args[0], args[1])
        return builder.zext(builder.load(ptr, align=1), _IVEC)

    return i32x16(u8, i), codegen


@intrinsic
def vload_i8x16(typingctx, i8, i):
    """i8[i:i+16] of an int8 array as 16 int32 lanes, sign-extended (``vpmovsxbd``): Q8_0's quants."""
    if not (isinstance(i8, types.Array) and i8.dtype == types.int8 and i8.ndim == 1 and i8.layout == "C"
            and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _bytes_ptr(context, builder, sig.args[0], args[0], args[1])
        return builder.sext(builder.load(ptr, align=1), _IVEC)

    return i32x16(i8, i), codegen


def _int_lanes_op(name, build):
    @intrinsic
    def op(typingctx, t, k):
        if not (t == i32x16 and isinstance(k, types.IntegerLiteral)):
            return None

        def codegen(context, builder, sig, args):
            return build(builder, args[0], _splat(sig.args[1].literal_value, _IVEC))

        return i32x16(t, k), codegen

    op.__name__ = name
    return op


vandi16 = _int_lanes_op("vandi16", lambda b, t, k: b.and_(t, k))
vandi16.__doc__ = "t & k per lane, k a literal integer (``vpandd``): Q4_0's low nibble is vandi16(t, 15)."
vshri16 = _int_lanes_op("vshri16", lambda b, t, k: b.lshr(t, k))
vshri16.__doc__ = "t >> k per lane (logical), k a literal integer (``vpsrld``): Q4_0's high nibble is vshri16(t, 4)."


@intrinsic
def vcvt16(typingctx, t):
    """int32 lanes to float32 (``vcvtdq2ps``), exact below 2**24."""
    if t != i32x16:
        return None

    def codegen(context, builder, sig, args):
        return builder.sitofp(args[0], _FVEC)

    return f32x16(t), codegen


@intrinsic
def vsub16(typingctx, a, b):
    """a - b per lane (``vsubps``)."""
    if not (a == f32x16 and b == f32x16):
        return None

    def codegen(context, builder, sig, args):
        return builder.fsub(args[0], args[1])

    return f32x16(a, b), codegen


@intrinsic
def vsum16(typingctx, a):
    """The sum of the 16 lanes as one float32, by halves (8 + 8, 4 + 4, 2 + 2, 1 + 1: four shuffles and four
    adds, the order fixed here rather than left to fast-math flags)."""
    if a != f32x16:
        return None

    def codegen(context, builder, sig, args):
        v, n = args[0], LANES
        while n > 1:
            h = n // 2
            vt = ir.VectorType(ir.FloatType(), h)
            lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, h), list(range(h))))
            hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, h), list(range(h, n))))
            v, n = builder.fadd(lo, hi), h
            assert v.type == vt
        return builder.extract_element(v, ir.Constant(_I32, 0))

    return types.float32(a), codegen
