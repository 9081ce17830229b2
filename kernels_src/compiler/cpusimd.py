"""16-float vectors for Numba's CPU code: what C programmers get from ``<immintrin.h>`` (``__m512``).

LLVM's loop vectorizer turns a loop of scalar sums into vector code, but only along the loop it vectorizes: a
GEMM micro-kernel written that way is a set of dot products along ``k``, each register holding 16 partial sums
that must be folded into one number at the end (chapter 5, rungs 5-8). BLAS kernels do the other thing: each
step of ``k`` multiplies a *broadcast* element of ``A`` by a vector of a row of ``B`` and adds it into a tile of
``C`` held in registers, with no folding at all. Scalar Numba cannot say that (a tile of ``C`` in a local array
lives in memory), so these intrinsics give Numba a vector value type, ``f32x16``: a Numba value that LLVM holds
as one ``<16 x float>``, a zmm register on AVX-512 (two ymm registers on AVX2, where a kernel sized for 32 zmm
registers spills: rungs that use these say ``requires=`` AVX-512).

    vload16(a, i)        a[i:i+16] of a contiguous 1-D float32 array, as one vector (unaligned load)
    vstore16(a, i, v)    a[i:i+16] = v
    vsplat16(x)          16 copies of the float32 x (``vbroadcastss``)
    vfma16(a, b, c)      a * b + c, one fused multiply-add per lane (``vfmadd231ps``)
    vadd16(a, b)         a + b
    vzero16()            16 zeros
    prefetchw(a, i)      start fetching the cache line of a[i] for a coming store (a hint; never faults)

No bounds are checked (like the intrinsics of C): the caller guarantees ``0 <= i`` and ``i + 16 <= len(a)``.
"""
from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.core.datamodel import models, register_default
from numba.extending import intrinsic

LANES = 16
_VEC = ir.VectorType(ir.FloatType(), LANES)


class F32x16(types.Type):
    """The Numba type of a 16-float vector value (an LLVM ``<16 x float>``)."""

    def __init__(self):
        super().__init__(name="f32x16")


f32x16 = F32x16()


@register_default(F32x16)
class _F32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VEC)


def _is_f32_array(a):
    return isinstance(a, types.Array) and a.dtype == types.float32 and a.ndim == 1 and a.layout == "C"


def _ptr(context, builder, aty, arr, idx):
    ary = context.make_array(aty)(context, builder, arr)
    base = cgutils.gep(builder, ary.data, idx)  # float* + i
    return builder.bitcast(base, _VEC.as_pointer())


@intrinsic
def vload16(typingctx, a, i):
    """a[i:i+16] as one vector (``vmovups``)."""
    if not (_is_f32_array(a) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _ptr(context, builder, sig.args[0], args[0], args[1])
        return builder.load(ptr, align=4)

    return f32x16(a, i), codegen


@intrinsic
def vstore16(typingctx, a, i, v):
    """a[i:i+16] = v (``vmovups``)."""
    if not (_is_f32_array(a) and isinstance(i, types.Integer) and v == f32x16):
        return None

    def codegen(context, builder, sig, args):
        ptr = _ptr(context, builder, sig.args[0], args[0], args[1])
        builder.store(args[2], ptr, align=4)
        return context.get_dummy_value()

    return types.void(a, i, v), codegen


@intrinsic
def vsplat16(typingctx, x):
    """16 copies of x (``vbroadcastss``; from memory it is a plain load)."""
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        if v.type != ir.FloatType():
            v = builder.fptrunc(v, ir.FloatType())
        one = builder.insert_element(ir.Constant(_VEC, ir.Undefined), v, ir.Constant(ir.IntType(32), 0))
        return builder.shuffle_vector(one, ir.Constant(_VEC, ir.Undefined),
                                      ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES))

    return f32x16(x), codegen


@intrinsic
def vfma16(typingctx, a, b, c):
    """a * b + c per lane, one rounding (``llvm.fma.v16f32``: ``vfmadd231ps`` on AVX-512)."""
    if not (a == f32x16 and b == f32x16 and c == f32x16):
        return None

    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(_VEC, [_VEC, _VEC, _VEC])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.fma.v16f32")
        return builder.call(fn, args)

    return f32x16(a, b, c), codegen


@intrinsic
def vadd16(typingctx, a, b):
    """a + b per lane (``vaddps``)."""
    if not (a == f32x16 and b == f32x16):
        return None

    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1])

    return f32x16(a, b), codegen


@intrinsic
def prefetchw(typingctx, a, i):
    """Ask for the cache line holding a[i], to be written soon (``prefetchw``): the line is on its way while
    other work runs, instead of a miss at the store. A hint only: it never faults and changes no value."""
    if not (_is_f32_array(a) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        ptr = builder.bitcast(cgutils.gep(builder, ary.data, args[1]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        builder.call(fn, [ptr, ir.Constant(i32, 1), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(a, i), codegen


@intrinsic
def vzero16(typingctx):
    """16 zeros."""
    def codegen(context, builder, sig, args):
        return ir.Constant(_VEC, [0.0] * LANES)

    return f32x16(), codegen


def has_avx512() -> bool:
    """Whether this CPU has AVX-512F, where one f32x16 is one zmm register."""
    try:
        import llvmlite.binding as ll

        return bool(ll.get_host_cpu_features().get("avx512f"))
    except Exception:  # noqa: BLE001
        return False


def zmm_kernels() -> tuple[bool, str]:
    """``requires=`` for rungs written with f32x16: they need AVX-512 (32 zmm registers) and the door's 512-bit
    switch on (KERNELS_CPU_VECTOR_BITS=auto or 512). Elsewhere (an AVX2 machine: 16 ymm registers, so each
    f32x16 is two of them and a tile of 16-32 vectors spills) they are skipped, and the ymm rungs stay best."""
    if not has_avx512():
        return False, "needs AVX-512 (this CPU has none): a 16-float vector is two ymm registers here, the tile spills"
    from . import CPU_VECTORS

    if not CPU_VECTORS.startswith("512"):
        return False, f"needs 512-bit vectors, but the compiler door says: {CPU_VECTORS} (KERNELS_CPU_VECTOR_BITS)"
    return True, ""
