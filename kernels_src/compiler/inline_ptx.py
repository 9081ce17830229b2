"""Instructions numba-cuda has no name for, emitted as inline PTX: ``dp4a``.

``dp4a(a, b, c)`` is PTX's ``dp4a.s32.s32``: ``a`` and ``b`` are 32-bit words, each holding four signed
8-bit integers (byte 0 the lowest), and the result is ``c`` plus the sum of the four byte products, an
int32 that wraps modulo 2^32 like any int32 sum::

    dp4a(a, b, c) == c + sum(sbyte(a, k) * sbyte(b, k) for k in range(4))     (mod 2^32)

One instruction does four multiply-adds on integers: it is how int8 dot products run on CUDA cores
(llama.cpp's quantized GEMV uses it). Four products of two int8s are at most 4 * 128 * 128 = 65,536 in
size, so a sum of up to 32,767 calls cannot overflow int32.

Where it comes from, per compiler (:mod:`kernels_src.compiler` picks one):

- **numba-cuda:** a Numba ``@intrinsic`` whose code generator emits llvmlite's ``InlineAsm`` with the PTX
  text ``dp4a.s32.s32 $0, $1, $2, $3;``. NVVM passes it through to the PTX; ``ptxas`` turns it into one
  SASS ``IDP.4A.S8.S8`` instruction.
- **the CUDA simulator:** a Python function with the same integer semantics (bytes read as signed, the sum
  wrapped to int32), so a CPU-only student's kernel that calls ``dp4a`` runs, and is graded, unchanged.
- **numba-cuda-mlir (0.6):** no inline assembly; an overload computes the same sum with four multiplies
  (correct, and slower: the rung that needs ``dp4a`` for its speed says so).
"""
from __future__ import annotations

from .. import device
from . import USE_MLIR as _MLIR  # compiler/__init__.py sets it before it imports this module


def dp4a_reference(a, b, c):
    """The semantics, in Python integers: what every implementation below must return."""
    s = int(c)
    a, b = int(a) & 0xFFFFFFFF, int(b) & 0xFFFFFFFF
    for k in range(4):
        x = (a >> (8 * k)) & 0xFF
        y = (b >> (8 * k)) & 0xFF
        s += (x - 256 if x >= 128 else x) * (y - 256 if y >= 128 else y)
    s &= 0xFFFFFFFF
    return s - (1 << 32) if s >= (1 << 31) else s


if device.SIMULATED:
    import numpy as _np

    def dp4a(a, b, c):
        return _np.int32(dp4a_reference(a, b, c))

elif _MLIR:
    from numba_cuda_mlir.numba_cuda.extending import overload  # type: ignore[import-not-found]
    from numba_cuda_mlir.numba_cuda import types as _types  # type: ignore[import-not-found]

    def dp4a(a, b, c):
        """c + the dot product of the 4 signed bytes of a and b (compiled by numba-cuda-mlir, in software)."""
        raise NotImplementedError("dp4a runs only inside a kernel")

    @overload(dp4a, target="cuda")
    def _dp4a(a, b, c):
        if not all(isinstance(t, _types.Integer) for t in (a, b, c)):
            return None

        def impl(a, b, c):
            a32 = _types.int32(a)
            b32 = _types.int32(b)
            s = _types.int32(c)
            for k in range(4):
                x = (a32 >> (8 * k)) & 0xFF
                y = (b32 >> (8 * k)) & 0xFF
                s += _types.int32((x - ((x & 0x80) << 1)) * (y - ((y & 0x80) << 1)))
            return s
        return impl

else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def dp4a(typingctx, a, b, c):
        """c + the dot product of the 4 signed bytes of a and b: one ``dp4a.s32.s32`` instruction."""
        if not all(isinstance(t, types.Integer) for t in (a, b, c)):
            return None
        sig = types.int32(a, b, c)

        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            vals = [context.cast(builder, v, t, types.int32) for v, t in zip(args, sig.args)]
            asm = ir.InlineAsm(ir.FunctionType(i32, [i32, i32, i32]), "dp4a.s32.s32 $0, $1, $2, $3;",
                               "=r,r,r,r")
            return builder.call(asm, vals)

        return sig, codegen
