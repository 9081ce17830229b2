"""CPU intrinsics the course's vectorizable math needs: reinterpret the bits of an int32 as a float32.

``float32_from_bits(i)`` is one LLVM ``bitcast``: no instruction at all once vectorized (the integer and the float
live in the same vector register). The C idiom is ``memcpy`` between an ``int32_t`` and a ``float``; NumPy's is
``a.view(np.float32)`` on a whole array. The course uses it to build 2**n from its exponent bits, (n + 127) << 23,
inside ``exp`` (kernels_src/ops/cpumath.py), so that a loop over ``exp`` stays SIMD.
"""
from __future__ import annotations

from llvmlite import ir
from numba.core import types
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
