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
    vsub16, vmul16, vdiv16(a, b)   per lane, IEEE (``vsubps``, ``vmulps``, ``vdivps``)
    vsqrt16(a), vabs16(a)          per lane (``vsqrtps``; ``vabs16`` clears the sign bits)
    vstream16(a, i, v)   a[i:i+16] = v as a non-temporal ("streaming") store (``vmovntps``): the line goes to
                         memory through a write-combining buffer, without being read into the cache first.
                         &a[i] MUST be 64-byte aligned (``stream_head`` says where that starts; a misaligned
                         one faults and ends the process), and each thread calls ``sfence()`` after its last
    sfence()             wait until this core's streaming stores are globally visible (``sfence``)

Why streaming stores: an ordinary store to a line that is not in the cache first reads the line from memory
(write-allocate, "read for ownership"), so a kernel that writes W arrays and reads R moves R + 2W lines, not
R + W. A streaming store of a whole line skips that read: AdamW (reads p, g, m, v; writes p, m, v) goes from 10
line transfers per 16 parameters to 7, a copy from 3 to 2. Their cost: the written data is not in the cache
afterwards (fine for an output nobody reads soon, wrong for one read next), and they are weakly ordered, hence
the fence. Elementwise rungs that hold only a few vectors at a time (the optimizers' ``stream`` rungs) need no
AVX-512: on AVX2 each f32x16 is two ymm registers (two 32-byte ``vmovntps``), and nothing spills.

No bounds are checked (like the intrinsics of C): the caller guarantees ``0 <= i`` and ``i + 16 <= len(a)``.
"""
from __future__ import annotations

import platform

from llvmlite import ir
from numba.core import cgutils, types
from numba.core.datamodel import models, register_default
from numba.extending import intrinsic

LANES = 16
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")
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


def _binop(name, op):
    def typer(typingctx, a, b):
        if not (a == f32x16 and b == f32x16):
            return None

        def codegen(context, builder, sig, args):
            return getattr(builder, op)(args[0], args[1])

        return f32x16(a, b), codegen

    typer.__name__ = name
    typer.__doc__ = f"a {op[1:]} b per lane, IEEE rounding (``v{op[1:]}ps``)."
    return intrinsic(typer)


vsub16 = _binop("vsub16", "fsub")
vmul16 = _binop("vmul16", "fmul")
vdiv16 = _binop("vdiv16", "fdiv")


@intrinsic
def vsqrt16(typingctx, a):
    """sqrt per lane, correctly rounded (``llvm.sqrt.v16f32``: ``vsqrtps``); sqrt(-x) is NaN, sqrt(inf) inf."""
    if a != f32x16:
        return None

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VEC, [_VEC]), "llvm.sqrt.v16f32")
        return builder.call(fn, args)

    return f32x16(a), codegen


@intrinsic
def vabs16(typingctx, a):
    """|a| per lane (``llvm.fabs.v16f32``: an and with the sign bit cleared)."""
    if a != f32x16:
        return None

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VEC, [_VEC]), "llvm.fabs.v16f32")
        return builder.call(fn, args)

    return f32x16(a), codegen


@intrinsic
def vstream16(typingctx, a, i, v):
    """a[i:i+16] = v, non-temporal (``vmovntps``: one 64-byte line written without reading it first). &a[i] must
    be 64-byte aligned (the instruction faults otherwise); end the kernel with ``sfence()``."""
    if not (_is_f32_array(a) and isinstance(i, types.Integer) and v == f32x16):
        return None

    def codegen(context, builder, sig, args):
        ptr = _ptr(context, builder, sig.args[0], args[0], args[1])
        inst = builder.store(args[2], ptr, align=64)
        inst.set_metadata("nontemporal", builder.module.add_metadata([ir.IntType(32)(1)]))
        return context.get_dummy_value()

    return types.void(a, i, v), codegen


@intrinsic
def sfence(typingctx):
    """Store fence (``llvm.x86.sse.sfence``): this core's earlier streaming stores become visible to every other
    core before any later store does. Call it after the last ``vstream16`` of each thread."""
    def codegen(context, builder, sig, args):
        if _X86:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse.sfence")
            builder.call(fn, [])
        else:  # elsewhere (an Arm Mac, say: nontemporal stores become stnp) a release fence orders them
            builder.fence("release")
        return context.get_dummy_value()

    return types.void(), codegen


def stream_head(*arrays) -> int:
    """For 1-D float32 arrays of one length: the first index i at which &a[i] is 64-byte aligned in every one of
    them (0..15), or -1 when they do not share one alignment (then a kernel uses ordinary stores throughout).
    NumPy's large arrays usually start 16 bytes into a line, so this is typically 12 for all of them."""
    offs = {a.ctypes.data % 64 for a in arrays}
    if len(offs) != 1:
        return -1
    off = offs.pop()
    return -1 if off % 4 else ((64 - off) % 64) // 4


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
