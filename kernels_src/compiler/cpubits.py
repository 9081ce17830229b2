"""CPU intrinsics the course's vectorizable math needs: reinterpret the bits of an int32 as a float32.

``float32_from_bits(i)`` is one LLVM ``bitcast``: no instruction at all once vectorized (the integer and the float
live in the same vector register). The C idiom is ``memcpy`` between an ``int32_t`` and a ``float``; NumPy's is
``a.view(np.float32)`` on a whole array. The course uses it to build 2**n from its exponent bits, (n + 127) << 23,
inside ``exp`` (kernels_src/ops/cpumath.py), so that a loop over ``exp`` stays SIMD.
"""
from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic


@intrinsic
def float32_from_bits(typingctx, i):
    """float32 whose IEEE-754 bits are the low 32 bits of the integer ``i`` (a bit cast, not a conversion).
    Numba widens int32 arithmetic to int64, so any integer type is taken and its low 32 bits kept."""
    if not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        v = args[0]
        if v.type.width > 32:
            v = builder.trunc(v, ir.IntType(32))
        elif v.type.width < 32:
            v = builder.sext(v, ir.IntType(32)) if signature.args[0].signed else builder.zext(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())

    return types.float32(i), codegen


@intrinsic
def float32_bits(typingctx, x):
    """The IEEE-754 bits of the float32 ``x`` as an int32 (a bit cast, the inverse of ``float32_from_bits``)."""
    if not isinstance(x, types.Float) or x.bitwidth != 32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.int32(x), codegen


def _transpose_block_codegen(n, stream=False):
    vec = ir.VectorType(ir.FloatType(), n)
    h = n // 2
    lo = ir.Constant(ir.VectorType(ir.IntType(32), n), [v for j in range(h) for v in (j, n + j)])
    hi = ir.Constant(ir.VectorType(ir.IntType(32), n), [v for j in range(h, n) for v in (j, n + j)])

    def codegen(context, builder, sig, args):
        y = context.make_array(sig.args[0])(context, builder, args[0])
        x = context.make_array(sig.args[1])(context, builder, args[1])
        i64 = ir.IntType(64)
        ii = context.cast(builder, args[2], sig.args[2], types.int64)
        kk = context.cast(builder, args[3], sig.args[3], types.int64)
        x_cols = cgutils.unpack_tuple(builder, x.shape, 2)[1]
        y_cols = cgutils.unpack_tuple(builder, y.shape, 2)[1]

        def row(data, ncols, r0, r, c):  # &data[r0 + r, c] as a pointer to n floats
            off = builder.add(builder.mul(builder.add(r0, ir.Constant(i64, r)), ncols), c)
            return builder.bitcast(cgutils.gep(builder, data, off), vec.as_pointer())

        rows = [builder.load(row(x.data, x_cols, ii, r, kk), align=4) for r in range(n)]
        for _ in range(n.bit_length() - 1):  # log2(n) perfect shuffles (zip) transpose an n x n block
            rows = [builder.shuffle_vector(rows[j], rows[j + h], m) for j in range(h) for m in (lo, hi)]
        for c in range(n):
            if stream:  # non-temporal: the line written whole without being read first (needs 64-byte alignment)
                inst = builder.store(rows[c], row(y.data, y_cols, kk, c, ii), align=4 * n)
                inst.set_metadata("nontemporal", builder.module.add_metadata([ir.IntType(32)(1)]))
            else:
                builder.store(rows[c], row(y.data, y_cols, kk, c, ii), align=4)
        return context.get_dummy_value()

    return codegen


@intrinsic
def transpose16x16(typingctx, Y, X, i, k):
    """Y[k:k+16, i:i+16] = X[i:i+16, k:k+16].T for 2-D C-contiguous float32 arrays, in registers: 16 row loads of
    16 floats (64 bytes, one cache line when aligned), four rounds of 16 two-source shuffles (zip: row j of a
    round is the interleave of rows j and j+8 of the one before; AVX-512 does each in one vpermt2ps), 16 row
    stores. Without AVX-512 LLVM splits every 16-float vector in two. No bounds are checked: the caller keeps the
    block inside both arrays."""
    ok = all(isinstance(a, types.Array) and a.dtype == types.float32 and a.ndim == 2 and a.layout == "C"
             for a in (Y, X))
    if not (ok and isinstance(i, types.Integer) and isinstance(k, types.Integer)):
        return None
    return types.void(Y, X, i, k), _transpose_block_codegen(16)


@intrinsic
def transpose16x16_nt(typingctx, Y, X, i, k):
    """``transpose16x16`` with the 16 row stores non-temporal (``vmovntps``): each row of Y written as one whole
    64-byte line without reading it first. Every &Y[k + c, i] MUST be 64-byte aligned (rows a multiple of 16
    floats, the block starting a line), and the kernel ends with ``sfence()`` (compiler/cpusimd.py)."""
    ok = all(isinstance(a, types.Array) and a.dtype == types.float32 and a.ndim == 2 and a.layout == "C"
             for a in (Y, X))
    if not (ok and isinstance(i, types.Integer) and isinstance(k, types.Integer)):
        return None
    return types.void(Y, X, i, k), _transpose_block_codegen(16, stream=True)


def cpu_dispatcher_type():
    """The class of an ``@njit`` function (Numba's CPU dispatcher), for tools that look at compiled code."""
    from numba.core.registry import CPUDispatcher

    return CPUDispatcher


def using_svml() -> bool:
    """Whether Numba vectorizes math calls with Intel's SVML (it needs an SVML-patched llvmlite and the library)."""
    try:
        from numba.core import config

        return bool(config.USING_SVML)
    except Exception:  # noqa: BLE001
        return False


def numba_threads_started() -> bool:
    """Whether Numba has started its parallel (``prange``) thread pool in this process."""
    try:
        from numba.np.ufunc import parallel

        return bool(getattr(parallel, "_is_initialized", False))
    except Exception:  # noqa: BLE001
        return False


def import_torch_first() -> None:
    """Import torch, if it is installed, before anything starts Numba's threads (benchmarks call this first):
    torch imported after Numba's thread pool started runs its CPU kernels 10-50x slower (ops/cpu_baselines.py)."""
    import sys

    if "torch" in sys.modules:
        return
    if not numba_threads_started():
        try:
            import torch  # noqa: F401
        except ImportError:
            pass


# ---------------------------------------------------------------------------------------- CPU vector width
# LLVM's tuning for recent Intel server CPUs ("prefer-256-bit") keeps auto-vectorized loops at 256 bits even
# where AVX-512 is available, and Numba has no per-function switch. Measured on the 2-core Xeon that builds the
# book: with 512-bit vectors the packed GEMM rung went from 58-61 % to ~72 % of OpenBLAS and the vectorized exp
# from 0.73 to 0.49 ns per element. KERNELS_CPU_VECTOR_BITS chooses: "auto" (512 where the CPU has AVX-512F,
# else LLVM's choice), "512", or "256"/"llvm" (LLVM's own preference). It must be decided before Numba compiles
# anything: the door applies it when it is imported.
VECTOR_BITS_CHOICES = ("auto", "512", "256", "llvm")


def cpu_vector_bits_wanted() -> str:
    import os

    w = os.environ.get("KERNELS_CPU_VECTOR_BITS", "auto").strip().lower() or "auto"
    if w not in VECTOR_BITS_CHOICES:
        raise ValueError(f"KERNELS_CPU_VECTOR_BITS={w!r} is not one of {', '.join(VECTOR_BITS_CHOICES)}")
    return w


def apply_cpu_vector_bits() -> str:
    """Set Numba's CPU features so that LLVM may use 512-bit vectors where the CPU has them (see above).
    Returns what is in effect, in words. A user's own NUMBA_CPU_FEATURES or NUMBA_CPU_NAME is left alone."""
    import os

    from numba.core import config

    wanted = cpu_vector_bits_wanted()
    if os.environ.get("NUMBA_CPU_FEATURES") or os.environ.get("NUMBA_CPU_NAME"):
        return "as NUMBA_CPU_FEATURES/NUMBA_CPU_NAME say (set by you)"
    import llvmlite.binding as ll

    try:
        features = ll.get_host_cpu_features()
    except RuntimeError:  # not available on this platform (e.g. some ARM builds)
        return "LLVM's choice"
    has512 = bool(features.get("avx512f"))
    if wanted in ("256", "llvm") or not has512:
        config.CPU_FEATURES = None
        return "LLVM's choice (256-bit on this CPU's tuning)" if has512 else "LLVM's choice (no AVX-512 here)"
    features["prefer-256-bit"] = False
    config.CPU_FEATURES = features.flatten()
    return "512-bit where LLVM vectorizes (AVX-512; KERNELS_CPU_VECTOR_BITS=256 for LLVM's default)"
