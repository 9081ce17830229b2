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

Integer dot products (int8 activations, llama.cpp's CPU method; the GEMV's rung 7) on a second integer type,
``i16x32`` (an LLVM ``<32 x i16>``: one zmm on AVX-512, two ymm on AVX2), that holds one block of 32 int8
values widened once so that 4 weight rows can share it:

    vload_i8x32_i16(i8, i)     i8[i:i+32] of an int8 array as 32 int16 lanes, sign-extended (``vpmovsxbw``)
    vdot_i8x32(i8, i, xs)      the products of i8[i:i+32] and xs's 32 lanes, exact, summed in adjacent pairs
                               into 16 int32 lanes (lane j = w[2j]*x[2j] + w[2j+1]*x[2j+1]): the weights are
                               sign-extended to int16 (``vpmovsxbw``) and the multiply-add of pairs is
                               ``vpmaddwd``. The sum of the 16 lanes is the block's dot product; nothing can
                               overflow (|w*x| <= 128*128, and 32 of them are far below 2**31)
    vdot_q4x32(u8, i, xs)      the same for a Q4_0 block: the 16 bytes u8[i:i+16] hold element j in the low
                               nibble of byte j and element j + 16 in the high one; each weight is nibble - 8
                               (``vpmovzxbw``, ``vpand``, ``vpsrlw``, ``vpsubw``, then ``vpmaddwd``)

Why an x86 intrinsic there: the generic IR for vpmaddwd, add(sext(even w)*sext(even x), sext(odd w)*sext(odd x)),
does not survive LLVM's optimizer here. It knows w and x came from int8, moves the even/odd shuffles onto the
bytes and multiplies in int32 (``vpshufb``, ``vpmovsxbd``, ``vpmulld``: ~3x the instructions). So where the
compile target has AVX2, ``vdot_i8x32`` calls ``llvm.x86.avx2.pmadd.wd`` on two halves of 16 lanes, and elsewhere
it emits that generic IR (exact, just slower); :data:`DOT_PATH` says which, decided when a kernel is compiled.

Integer lanes stay 32-bit: Numba's own integer arithmetic widens to int64, which halves the lanes per
register. Out-of-range conversions (inf or NaN lanes) give what the hardware gives, 0x80000000, whose low
byte 0 is what the scalar rungs store too. No bounds are checked (like C's intrinsics): the caller
guarantees ``0 <= i`` and ``i + 16 <= len(u8)`` (``i + 32`` for the 32-lane loads). Generic LLVM vector IR,
so the same code runs on any x86-64 (and elsewhere LLVM has vectors), except ``vdot_i8x32``'s AVX2 path above.
"""
from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.core.datamodel import models, register_default
from numba.extending import intrinsic

from .cpusimd import _X86, f32x16

LANES = 16
_I32 = ir.IntType(32)
_I8 = ir.IntType(8)
_FVEC = ir.VectorType(ir.FloatType(), LANES)
_IVEC = ir.VectorType(_I32, LANES)
_BVEC = ir.VectorType(_I8, LANES)
_I16 = ir.IntType(16)
_HVEC = ir.VectorType(_I16, 2 * LANES)  # <32 x i16>
_B32VEC = ir.VectorType(_I8, 2 * LANES)  # <32 x i8>


class I32x16(types.Type):
    """The Numba type of a 16-lane int32 vector value (an LLVM ``<16 x i32>``)."""

    def __init__(self):
        super().__init__(name="i32x16")


i32x16 = I32x16()


@register_default(I32x16)
class _I32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _IVEC)


class I16x32(types.Type):
    """The Numba type of a 32-lane int16 vector value (an LLVM ``<32 x i16>``): one block of int8 values, widened."""

    def __init__(self):
        super().__init__(name="i16x32")


i16x32 = I16x32()


@register_default(I16x32)
class _I16x32Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _HVEC)


def _splat(value, vec):
    return ir.Constant(vec, [value] * LANES)


def _is_u8_array(a):
    return isinstance(a, types.Array) and a.dtype == types.uint8 and a.ndim == 1 and a.layout == "C"


def _bytes_ptr(context, builder, aty, arr, idx, vec=_BVEC):
    ary = context.make_array(aty)(context, builder, arr)
    return builder.bitcast(cgutils.gep(builder, ary.data, idx), vec.as_pointer())


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


# ------------------------------------------------------------ int8 x int8 dot products: int32 sums, exact
def _is_i8_array(a):
    return isinstance(a, types.Array) and a.dtype == types.int8 and a.ndim == 1 and a.layout == "C"


def _load_i8x32_i16(context, builder, aty, arr, idx):
    return builder.sext(builder.load(_bytes_ptr(context, builder, aty, arr, idx, _B32VEC), align=1), _HVEC)


@intrinsic
def vload_i8x32_i16(typingctx, i8, i):
    """i8[i:i+32] of an int8 array as 32 int16 lanes, sign-extended (``vpmovsxbw``): x's block, widened once."""
    if not (_is_i8_array(i8) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return _load_i8x32_i16(context, builder, sig.args[0], args[0], args[1])

    return i16x32(i8, i), codegen


def _pairs(builder, v, first):
    idx = ir.Constant(ir.VectorType(_I32, LANES), list(range(first, 2 * LANES, 2)))
    return builder.sext(builder.shuffle_vector(v, v, idx), _IVEC)


def _target_has_avx2() -> bool:
    """Whether Numba compiles for a CPU with AVX2: its NUMBA_CPU_FEATURES if set, else this host's features."""
    if not _X86:
        return False
    from numba.core import config

    if config.CPU_FEATURES:
        return "+avx2" in config.CPU_FEATURES.split(",")
    if config.CPU_NAME and config.CPU_NAME != "host":
        return False  # a named (e.g. generic) target: do not assume its features
    try:
        import llvmlite.binding as ll

        return bool(ll.get_host_cpu_features().get("avx2"))
    except Exception:  # noqa: BLE001
        return False


#: How :func:`vdot_i8x32` multiplies: "avx2" (``llvm.x86.avx2.pmadd.wd``) or "generic" (LLVM vector IR). Read when
#: a kernel using it is compiled; tests set it to "generic" (and compile afresh) to check the fallback.
DOT_PATH = "avx2" if _target_has_avx2() else "generic"


def _pmaddwd(builder, w, x):
    """w, x: <32 x i16> -> <16 x i32>, lane j = w[2j]*x[2j] + w[2j+1]*x[2j+1], exact, on the path DOT_PATH names:
    two ``vpmaddwd`` (one per half of 16 lanes), or the generic sext(even)*sext(even) + sext(odd)*sext(odd)."""
    if DOT_PATH != "avx2":
        return builder.add(builder.mul(_pairs(builder, w, 0), _pairs(builder, x, 0)),
                           builder.mul(_pairs(builder, w, 1), _pairs(builder, x, 1)))
    half = ir.VectorType(_I16, LANES)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VectorType(_I32, LANES // 2), [half, half]),
                                        "llvm.x86.avx2.pmadd.wd")
    parts = []
    for k in range(2):
        sel = ir.Constant(ir.VectorType(_I32, LANES), list(range(k * LANES, (k + 1) * LANES)))
        parts.append(builder.call(fn, [builder.shuffle_vector(w, w, sel), builder.shuffle_vector(x, x, sel)]))
    return builder.shuffle_vector(parts[0], parts[1], ir.Constant(ir.VectorType(_I32, LANES), list(range(LANES))))


@intrinsic
def vdot_i8x32(typingctx, i8, i, xs):
    """w = i8[i:i+32] (int8, sign-extended to int16) times xs's 32 int16 lanes, added in adjacent pairs: 16 int32
    lanes, lane j = w[2j]*xs[2j] + w[2j+1]*xs[2j+1], exact. Written as generic IR, sext(even w)*sext(even x) +
    sext(odd w)*sext(odd x) where the target lacks AVX2 (exact; LLVM picks the instructions), and as two
    ``vpmaddwd`` (``llvm.x86.avx2.pmadd.wd``) where it has it: see :data:`DOT_PATH`."""
    if not (_is_i8_array(i8) and isinstance(i, types.Integer) and xs == i16x32):
        return None

    def codegen(context, builder, sig, args):
        return _pmaddwd(builder, _load_i8x32_i16(context, builder, sig.args[0], args[0], args[1]), args[2])

    return i32x16(i8, i, xs), codegen


def _q4_lanes(context, builder, aty, arr, idx):
    """The 16 bytes at arr[idx] as two <16 x i16>: low nibbles - 8 (elements 0-15), high nibbles - 8 (16-31)."""
    half = ir.VectorType(_I16, LANES)
    b = builder.zext(builder.load(_bytes_ptr(context, builder, aty, arr, idx), align=1), half)
    eight = ir.Constant(half, [8] * LANES)
    lo = builder.sub(builder.and_(b, ir.Constant(half, [15] * LANES)), eight)
    hi = builder.sub(builder.lshr(b, ir.Constant(half, [4] * LANES)), eight)
    return lo, hi


@intrinsic
def vdot_q4x32(typingctx, u8, i, xs):
    """A Q4_0 block's weights times xs's 32 int16 lanes, summed in adjacent pairs into 16 exact int32 lanes, as
    :func:`vdot_i8x32` (same lane order: lanes 0-7 hold elements 0-15, lanes 8-15 elements 16-31). The block is
    the 16 bytes u8[i:i+16]; weight j is (byte j & 15) - 8 and weight j + 16 is (byte j >> 4) - 8."""
    if not (_is_u8_array(u8) and isinstance(i, types.Integer) and xs == i16x32):
        return None

    def codegen(context, builder, sig, args):
        lo, hi = _q4_lanes(context, builder, sig.args[0], args[0], args[1])
        w = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_I32, 2 * LANES), list(range(2 * LANES))))
        return _pmaddwd(builder, w, args[2])  # on AVX2, LLVM folds the join and _pmaddwd's split away

    return i32x16(u8, i, xs), codegen
