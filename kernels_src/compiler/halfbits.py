"""Half-precision storage in kernels: bf16 <-> float32 by bit arithmetic, fp16 <-> float32 by conversion.

Kernels of chapter 19 store activations in 16 bits and compute in float32. The two formats reach a kernel
differently:

  fp16 (IEEE binary16: 1 sign, 5 exponent, 10 mantissa bits) is a numba type: a ``float16[:]`` array element
       converts with ``float32(h)`` (exact: every fp16 is a float32) and a store ``y[i] = float16(v)`` rounds
       to nearest, ties to even (PTX ``cvt.rn.f16.f32``); values beyond 65520 become inf.
  bf16 (1 sign, 8 exponent, 7 mantissa bits: the top half of a float32) has no array type NumPy knows, so it
       is held as its uint16 bit pattern h. Its value is the float32 whose bits are h << 16 (exact). Rounding a
       float32 with bits u to bf16, to nearest with ties to even, is integer arithmetic on u:
           h = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
       (add just under half a bf16 ulp, plus one more when the kept part is odd, then drop 16 bits). A finite
       float32 above the largest bf16 plus half an ulp carries into the exponent and becomes inf, as the
       hardware conversion does; a NaN could carry into inf or -0, so it is tested first and written as the
       quiet NaN 0x7FC0.

Names (device functions, for ``@cuda.jit`` kernels):

  f32_as_u32(x), u32_as_f32(u)   bit casts (no instruction on the GPU; NumPy views in the simulator)
  bf16_to_f32(h), f32_to_bf16(x) bf16 bits <-> float32 (the rule above)
  f16_to_f32(h), f32_to_f16(x)   fp16 element <-> float32 (numba's conversions)
  f16bits_to_f32(u), f32_to_f16bits(x)
                                 fp16 BIT PATTERN (the low 16 bits of an integer) <-> float32, for kernels that
                                 move two or eight fp16 numbers in one 4- or 16-byte word (an LLVM bitcast to
                                 ``half`` and ``fpext``/``fptrunc``: the cvt instructions, rounding to nearest even)

Implementations: numba-cuda (libdevice ``float_as_int``/``int_as_float``), the CUDA simulator (NumPy views:
the simulator runs kernels as Python), and numba-cuda-mlir (its libdevice, where it has the two functions; an
ImportError naming the missing one otherwise). The fp16 bit-pattern pair is an llvmlite intrinsic: numba-cuda
and the simulator have it; under numba-cuda-mlir, which runs no llvmlite code, calling it raises an error that
says so (kernels that need it fall back to element-wise fp16 access there).
"""
from __future__ import annotations

import numpy as np

from .. import target as _target  # gpu / sim / cpu / ptx, chosen before numba.cuda is imported

NAN_BF16 = 0x7FC0  # the quiet NaN every course kernel writes for a NaN result
_U16, _U7FFF, _U1 = np.uint32(16), np.uint32(0x7FFF), np.uint32(1)
_H_NAN = np.uint16(NAN_BF16)


def _build():
    from . import USE_MLIR, cuda, float16, float32, int32, uint32

    if _target.SIMULATED:
        def f32_as_u32(x):
            return np.float32(x).view(np.uint32)

        def u32_as_f32(u):
            return np.uint32(u).view(np.float32)
    else:
        if USE_MLIR:
            try:
                from numba_cuda_mlir.cuda import libdevice as lib  # type: ignore[import-not-found]
                float_as_int, int_as_float = lib.float_as_int, lib.int_as_float
            except (ImportError, AttributeError) as e:  # pragma: no cover  (needs the optional package)
                raise ImportError("kernels_src.compiler.halfbits needs libdevice.float_as_int and int_as_float "
                                  f"from numba-cuda-mlir ({e})") from e
        else:
            from numba.cuda import libdevice as lib

            float_as_int, int_as_float = lib.float_as_int, lib.int_as_float

        @cuda.jit(device=True, inline=True)
        def f32_as_u32(x):
            return uint32(float_as_int(x))

        @cuda.jit(device=True, inline=True)
        def u32_as_f32(u):
            return int_as_float(int32(u))

    @cuda.jit(device=True, inline=True)
    def bf16_to_f32(h):
        return u32_as_f32(uint32(h) << _U16)

    @cuda.jit(device=True, inline=True)
    def f32_to_bf16(x):
        if x != x:
            return _H_NAN
        u = f32_as_u32(x)
        return np.uint16((u + _U7FFF + ((u >> _U16) & _U1)) >> _U16)

    @cuda.jit(device=True, inline=True)
    def f16_to_f32(h):
        return float32(h)

    @cuda.jit(device=True, inline=True)
    def f32_to_f16(x):
        return float16(x)

    if _target.SIMULATED:
        def f16bits_to_f32(u):
            return np.float32(np.uint16(int(u) & 0xFFFF).view(np.float16))

        def f32_to_f16bits(x):
            with np.errstate(over="ignore"):
                return np.float16(np.float32(x)).view(np.uint16)
    elif USE_MLIR:
        def f16bits_to_f32(u):  # pragma: no cover  (needs the optional package)
            raise NotImplementedError("f16bits_to_f32 is an llvmlite intrinsic, which numba-cuda-mlir 0.6 cannot "
                                      "compile: use fp16 arrays element by element (f16_to_f32) there")

        f32_to_f16bits = f16bits_to_f32
    else:
        from llvmlite import ir
        from numba import types
        from numba.cuda.extending import intrinsic

        @intrinsic
        def f16bits_to_f32(typingctx, u):
            if not isinstance(u, types.Integer):
                return None

            def codegen(context, builder, sig, args):
                v = args[0]
                v = builder.trunc(v, ir.IntType(16)) if v.type.width > 16 else v
                return builder.fpext(builder.bitcast(v, ir.HalfType()), ir.FloatType())

            return types.float32(u), codegen

        @intrinsic
        def f32_to_f16bits(typingctx, x):
            if not isinstance(x, types.Float):
                return None

            def codegen(context, builder, sig, args):
                v = context.cast(builder, args[0], sig.args[0], types.float32)
                h = builder.fptrunc(v, ir.HalfType())
                return builder.bitcast(h, ir.IntType(16))

            return types.uint16(x), codegen

    return (f32_as_u32, u32_as_f32, bf16_to_f32, f32_to_bf16, f16_to_f32, f32_to_f16, f16bits_to_f32,
            f32_to_f16bits)


(f32_as_u32, u32_as_f32, bf16_to_f32, f32_to_bf16, f16_to_f32, f32_to_f16, f16bits_to_f32,
 f32_to_f16bits) = _build()

__all__ = ["NAN_BF16", "f32_as_u32", "u32_as_f32", "bf16_to_f32", "f32_to_bf16", "f16_to_f32", "f32_to_f16",
           "f16bits_to_f32", "f32_to_f16bits"]
