"""Instructions numba-cuda has no name for, emitted as inline PTX: ``dp4a``, and the tensor cores' ``mma.sync``.

The second half of this module (below ``dp4a``) reaches the tensor cores; its own docstring,
:data:`TENSOR_CORES`, says how.

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

from .. import target as _target  # gpu / sim / cpu / ptx, chosen before numba.cuda is imported
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


if _target.SIMULATED:
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


# ============================================================================================== tensor cores
TENSOR_CORES = """The tensor cores, reached with one warp-wide PTX instruction: ``mma.sync``.

``mma.sync.aligned.m16n8kK`` multiplies a 16 x K tile of A by a K x 8 tile of B and adds a 16 x 8 tile of C,
in float32. The 32 threads of a warp execute it together: each holds a few elements of A, B and C in its own
registers (its *fragments*) and gets a few elements of D = A B + C back. Which thread holds which element is
fixed by the PTX ISA ("matrix fragments for mma.m16n8k8 / m16n8k16"), and is written once here, in
:func:`frag_a`, :func:`frag_b` and :func:`frag_c`, which the simulator's emulation, the figures and the tests
all read. With ``g = lane // 4`` (the lane's group, a row of C) and ``t = lane % 4`` (its place in the group):

    C, D (16 x 8, both shapes):  c0 (g, 2t)   c1 (g, 2t+1)   c2 (g+8, 2t)   c3 (g+8, 2t+1)
    TF32, m16n8k8:   A (16 x 8)   a0 (g, t)  a1 (g+8, t)  a2 (g, t+4)  a3 (g+8, t+4)
                     B (8 x 8)    b0 (t, g)  b1 (t+4, g)
    FP16 / BF16, m16n8k16 (a register holds two values, consecutive in k, the lower k in the low 16 bits):
                     A (16 x 16)  a0 (g, 2t:2t+2)  a1 (g+8, 2t:2t+2)  a2 (g, 2t+8:2t+10)  a3 (g+8, 2t+8:2t+10)
                     B (16 x 8)   b0 (2t:2t+2, g)  b1 (2t+8:2t+10, g)

The intrinsics (each an ``@intrinsic`` emitting llvmlite ``InlineAsm``; in the simulator, an emulation):

    d0, d1, d2, d3 = mma_tf32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)   # floats in; TF32 = their top 19 bits
    d0, d1, d2, d3 = mma_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)    # a*, b*: uint32, two fp16 each
    d0, d1, d2, d3 = mma_bf16(...)                                      # a*, b*: uint32, two bf16 each
    x = to_tf32(x)              # cvt.rna.tf32.f32: round to TF32 (10 mantissa bits), nearest, ties away
    w = pack_f16x2(lo, hi)      # cvt.rn.f16x2.f32: two floats -> one uint32 of two fp16 (lo in bits 0-15)
    w = pack_bf16x2(lo, hi)     # cvt.rn.bf16x2.f32: the same in bf16
    y = exp2_approx(x)          # ex2.approx.ftz.f32: 2^x on the SFU, one instruction (flash attention's exp)
    r0, r1, r2, r3 = ldmatrix_x4(smem, i)        # ldmatrix.sync.aligned.m8n8.x4.shared.b16 (see below)
    r0, r1, r2, r3 = ldmatrix_x4_trans(smem, i)  # the same with .trans

ldmatrix. ``smem`` is a uint32 shared array and ``i`` the word index of a 16-byte row: lanes 8m .. 8m + 7 give the
rows 0-7 of 8 x 8 matrix m of 16-bit values (m = 0..3). Lane l receives in register m the two values of row l // 4,
columns 2 (l % 4) and 2 (l % 4) + 1 of matrix m (low half first): exactly an A or B fragment of m16n8k16, in one
instruction for the warp, whatever the rows' layout. With ``.trans`` it receives rows 2 (l % 4) and 2 (l % 4) + 1 of
column l // 4 instead: the fragment of the transposed matrix (how FlashAttention reads V). The simulator emulates
both (all 32 lanes must call it, as on the GPU).

Rounding. A TF32 operand is a float32 with its low 13 mantissa bits ignored: the tensor core reads the top 19
bits, so an unrounded float is truncated; ``to_tf32`` rounds to nearest first (what cuBLAS does), which
halves the worst error. Products of two TF32 (or FP16, BF16) values are exact in float32, and the tensor core
sums them in float32 (its order and its internal rounding are not specified by the ISA: the tests compare
against float64 with a tolerance, never bit for bit).

The simulator runs each thread of a block as a Python thread. Its ``mma_*`` collect the 32 lanes' fragments
at a barrier of the warp, compute the 16 x 8 product in float64, round to float32, and hand each lane its
four values: a kernel that reaches ``mma`` from fewer than 32 lanes of a warp (a warp cut by a bounds guard,
a block not a multiple of 32) is an error there, as it is undefined on the GPU. numba-cuda-mlir 0.6 has no
inline assembly: the tensor-core kernels are in ``MLIR_GAPS``.
"""

# Fragment maps (lane, register) -> element(s). One source of truth for the emulation, figures and tests.
def frag_c(lane, r):
    """(row, col) of C/D held by ``lane`` in its register ``r`` (0-3), for m16n8k8 and m16n8k16."""
    g, t = lane >> 2, lane & 3
    return g + 8 * (r >> 1), 2 * t + (r & 1)


def frag_a(lane, r, k=8):
    """(row, col) of A held by ``lane`` in register ``r`` (0-3): one element for k=8 (TF32); for k=16 the
    first of the two (col and col + 1) in the register's low and high halves."""
    g, t = lane >> 2, lane & 3
    if k == 8:
        return g + 8 * (r & 1), t + 4 * (r >> 1)
    return g + 8 * (r & 1), 2 * t + 8 * (r >> 1)


def frag_b(lane, r, k=8):
    """(row, col) of B (K x 8) held by ``lane`` in register ``r`` (0-1); for k=16 the first of two rows."""
    g, t = lane >> 2, lane & 3
    if k == 8:
        return t + 4 * r, g
    return 2 * t + 8 * r, g


def tf32_round_bits(bits):
    """cvt.rna.tf32.f32 on the bits of a float32 (an int): round to 10 mantissa bits, ties away from zero; inf
    and NaN unchanged."""
    bits &= 0xFFFFFFFF
    if (bits >> 23) & 0xFF == 0xFF:
        return bits
    return ((bits + 0x1000) & 0xFFFFE000) & 0xFFFFFFFF


def mma_reference(a, b, c):
    """D = A B + C in float64, rounded once to float32: what the emulation returns (A (16,K), B (K,8))."""
    import numpy as np

    return (np.asarray(a, np.float64) @ np.asarray(b, np.float64) + np.asarray(c, np.float64)).astype(np.float32)


MMA_KINDS = ("tf32", "f16", "bf16")

if _target.SIMULATED:
    import threading as _threading

    import numpy as _np

    _lock = _threading.Lock()

    def _f32(bits):
        return _np.array([bits & 0xFFFFFFFF], _np.uint32).view(_np.float32)[0]

    def _bits(x):
        return int(_np.array([x], _np.float32).view(_np.uint32)[0])

    def _halves(word, kind):
        """The two values (low, high) of a uint32 holding two fp16 or bf16."""
        w = int(word) & 0xFFFFFFFF
        lo, hi = w & 0xFFFF, w >> 16
        if kind == "f16":
            return [float(_np.array([h], _np.uint16).view(_np.float16)[0]) for h in (lo, hi)]
        return [float(_f32(h << 16)) for h in (lo, hi)]

    def _warp_exchange():
        """This lane's warp rendezvous in the simulator: (lane, exchange object)."""
        th = _threading.current_thread()
        mgr = getattr(th, "_manager", None)
        if mgr is None:
            raise RuntimeError("mma_* runs only inside a kernel")
        n = 1
        for v in mgr._block_dim:
            n *= v
        warp, lane = divmod(th.thread_id, 32)
        if (warp + 1) * 32 > n:
            raise RuntimeError(f"mma.sync needs all 32 lanes of a warp; block of {n} threads leaves warp {warp} "
                               f"with {n - 32 * warp}")
        with _lock:
            ex = getattr(mgr, "_kernels_mma", None)
            if ex is None:
                ex = mgr._kernels_mma = {}
            key = (tuple(th.blockIdx), warp)
            if key not in ex:
                ex[key] = {"barrier": _threading.Barrier(32, timeout=120), "slots": [None] * 32}
        return lane, ex[key]

    def _mma_emulate(kind, a, b, c):
        lane, ex = _warp_exchange()
        ex["slots"][lane] = (a, b, c)
        try:
            ex["barrier"].wait()
            if lane == 0:
                k = 8 if kind == "tf32" else 16
                A, B, C = _np.zeros((16, k)), _np.zeros((k, 8)), _np.zeros((16, 8))
                for ln, (fa, fb, fc) in enumerate(ex["slots"]):
                    for r in range(4):
                        i, j = frag_a(ln, r, k)
                        if kind == "tf32":
                            A[i, j] = _f32(_bits(fa[r]) & 0xFFFFE000)  # the tensor core reads the top 19 bits
                        else:
                            A[i, j], A[i, j + 1] = _halves(fa[r], kind)
                        C[frag_c(ln, r)] = fc[r]
                    for r in range(2):
                        i, j = frag_b(ln, r, k)
                        if kind == "tf32":
                            B[i, j] = _f32(_bits(fb[r]) & 0xFFFFE000)
                        else:
                            B[i, j], B[i + 1, j] = _halves(fb[r], kind)
                ex["D"] = mma_reference(A, B, C)
            ex["barrier"].wait()
            D = ex["D"]
            out = tuple(_np.float32(D[frag_c(lane, r)]) for r in range(4))
            ex["barrier"].wait()  # nobody starts the next mma before every lane has read this one
        except _threading.BrokenBarrierError:
            raise RuntimeError("mma.sync: not every lane of the warp reached it (a bounds guard around an mma, or "
                               "lanes that returned early); on a GPU that is undefined behaviour") from None
        return out

    def mma_tf32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        return _mma_emulate("tf32", (a0, a1, a2, a3), (b0, b1), (c0, c1, c2, c3))

    def mma_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        return _mma_emulate("f16", (a0, a1, a2, a3), (b0, b1), (c0, c1, c2, c3))

    def mma_bf16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        return _mma_emulate("bf16", (a0, a1, a2, a3), (b0, b1), (c0, c1, c2, c3))

    def to_tf32(x):
        return _f32(tf32_round_bits(_bits(x)))

    def pack_f16x2(lo, hi):
        h = _np.array([lo, hi], _np.float32).astype(_np.float16).view(_np.uint16).astype(_np.uint32)
        return _np.uint32(int(h[0]) | (int(h[1]) << 16))

    def _bf16_bits(x):
        b = _bits(x)
        if (b >> 23) & 0xFF == 0xFF and b & 0x7FFFFF:
            return (b >> 16) | 0x40  # NaN stays a (quiet) NaN
        return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF  # round to nearest, ties to even

    def pack_bf16x2(lo, hi):
        return _np.uint32(_bf16_bits(lo) | (_bf16_bits(hi) << 16))

    def exp2_approx(x):
        return _np.float32(2.0 ** float(x))  # 2^-inf = 0, as ex2.approx gives

    def ldmatrix_reference(rows, lane, m, trans):
        """Register m of ``lane``: ``rows[m][r]`` is row r of matrix m as 4 words (8 values of 16 bits)."""
        def half(r, c):
            w = int(rows[m][r][c >> 1]) & 0xFFFFFFFF
            return (w >> (16 * (c & 1))) & 0xFFFF
        if trans:
            lo, hi = half(2 * (lane & 3), lane >> 2), half(2 * (lane & 3) + 1, lane >> 2)
        else:
            lo, hi = half(lane >> 2, 2 * (lane & 3)), half(lane >> 2, 2 * (lane & 3) + 1)
        return _np.uint32(lo | (hi << 16))

    def _ldmatrix_emulate(arr, i, trans):
        lane, ex = _warp_exchange()
        flat = arr.reshape(-1) if arr.ndim != 1 else arr
        ex["slots"][lane] = [flat[int(i) + k] for k in range(4)]  # this lane's row: 4 words
        try:
            ex["barrier"].wait()
            rows = [[ex["slots"][8 * m + r] for r in range(8)] for m in range(4)]
            out = tuple(ldmatrix_reference(rows, lane, m, trans) for m in range(4))
            ex["barrier"].wait()
        except _threading.BrokenBarrierError:
            raise RuntimeError("ldmatrix: not every lane of the warp reached it") from None
        return out

    def ldmatrix_x4(arr, i):
        return _ldmatrix_emulate(arr, i, False)

    def ldmatrix_x4_trans(arr, i):
        return _ldmatrix_emulate(arr, i, True)

elif _MLIR:
    def _no_inline_asm(*args):
        raise NotImplementedError("tensor-core intrinsics need inline PTX, which numba-cuda-mlir 0.6 does not have "
                                  "(see kernels_src.compiler.MLIR_GAPS)")

    mma_tf32 = mma_f16 = mma_bf16 = to_tf32 = pack_f16x2 = pack_bf16x2 = exp2_approx = _no_inline_asm
    ldmatrix_x4 = ldmatrix_x4_trans = _no_inline_asm

else:
    _MMA_PTX = {
        "tf32": "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
        "f16": "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
        "bf16": "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
    }

    def _make_mma(kind):
        text = _MMA_PTX[kind] + " {$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};"

        def typer(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
            ab = (a0, a1, a2, a3, b0, b1)
            want = types.Float if kind == "tf32" else types.Integer
            if not all(isinstance(t, want) for t in ab) or not all(isinstance(t, types.Float)
                                                                   for t in (c0, c1, c2, c3)):
                return None
            sig = types.UniTuple(types.float32, 4)(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)

            def codegen(context, builder, sig, args):
                i32, f32 = ir.IntType(32), ir.FloatType()
                regs = []
                for v, t in zip(args[:6], sig.args[:6]):
                    if kind == "tf32":
                        regs.append(builder.bitcast(context.cast(builder, v, t, types.float32), i32))
                    else:
                        regs.append(context.cast(builder, v, t, types.uint32))
                accs = [context.cast(builder, v, t, types.float32) for v, t in zip(args[6:], sig.args[6:])]
                fty = ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32] * 6 + [f32] * 4)
                asm = ir.InlineAsm(fty, text, "=f,=f,=f,=f," + "r," * 6 + "f,f,f,f", side_effect=False)
                res = builder.call(asm, regs + accs)
                outs = [builder.extract_value(res, i) for i in range(4)]
                return context.make_tuple(builder, sig.return_type, outs)

            return sig, codegen

        typer.__name__ = f"mma_{kind}"
        typer.__doc__ = f"D = A B + C on the tensor cores: one ``{_MMA_PTX[kind]}`` for the whole warp."
        return intrinsic(typer)

    mma_tf32, mma_f16, mma_bf16 = (_make_mma(k) for k in MMA_KINDS)

    @intrinsic
    def to_tf32(typingctx, x):
        """x rounded to TF32 (10 mantissa bits, nearest, ties away): ``cvt.rna.tf32.f32``; still a float32."""
        if not isinstance(x, types.Float):
            return None

        def codegen(context, builder, sig, args):
            v = context.cast(builder, args[0], sig.args[0], types.float32)
            asm = ir.InlineAsm(ir.FunctionType(ir.IntType(32), [ir.FloatType()]), "cvt.rna.tf32.f32 $0, $1;",
                               "=r,f")
            return builder.bitcast(builder.call(asm, [v]), ir.FloatType())

        return types.float32(x), codegen

    def _make_pack(fmt):
        text = f"cvt.rn.{fmt}x2.f32 $0, $1, $2;"  # $1 goes to the high half, $2 to the low half

        def typer(typingctx, lo, hi):
            if not (isinstance(lo, types.Float) and isinstance(hi, types.Float)):
                return None

            def codegen(context, builder, sig, args):
                f32 = ir.FloatType()
                lo_, hi_ = (context.cast(builder, v, t, types.float32) for v, t in zip(args, sig.args))
                asm = ir.InlineAsm(ir.FunctionType(ir.IntType(32), [f32, f32]), text, "=r,f,f")
                return builder.call(asm, [hi_, lo_])

            return types.uint32(lo, hi), codegen

        typer.__name__ = f"pack_{fmt}x2"
        typer.__doc__ = f"Two floats -> one uint32 of two {fmt} (lo in bits 0-15), rounded to nearest even."
        return intrinsic(typer)

    pack_f16x2, pack_bf16x2 = _make_pack("f16"), _make_pack("bf16")

    @intrinsic
    def exp2_approx(typingctx, x):
        """2^x by the SFU: ``ex2.approx.ftz.f32`` (max relative error ~2^-22; 2^-inf = 0; subnormals flushed)."""
        if not isinstance(x, types.Float):
            return None

        def codegen(context, builder, sig, args):
            v = context.cast(builder, args[0], sig.args[0], types.float32)
            asm = ir.InlineAsm(ir.FunctionType(ir.FloatType(), [ir.FloatType()]), "ex2.approx.ftz.f32 $0, $1;", "=f,f")
            return builder.call(asm, [v])

        return types.float32(x), codegen

    def _make_ldmatrix(trans):
        op = "ldmatrix.sync.aligned.m8n8.x4" + (".trans" if trans else "") + ".shared.b16"
        text = ("{ .reg .u64 p; .reg .u32 s; cvta.to.shared.u64 p, $4; cvt.u32.u64 s, p; "
                + op + " {$0, $1, $2, $3}, [s]; }")

        def typer(typingctx, arr, i):
            if not (isinstance(arr, types.Array) and arr.dtype == types.uint32 and arr.layout == "C"
                    and isinstance(i, types.Integer)):
                return None
            sig = types.UniTuple(types.uint32, 4)(arr, i)

            def codegen(context, builder, sig, args):
                ary = context.make_array(sig.args[0])(context, builder, args[0])
                idx = context.cast(builder, args[1], sig.args[1], types.intp)
                ptr = builder.ptrtoint(builder.gep(ary.data, [idx]), ir.IntType(64))
                i32 = ir.IntType(32)
                fty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [ir.IntType(64)])
                res = builder.call(ir.InlineAsm(fty, text, "=r,=r,=r,=r,l", side_effect=True), [ptr])
                outs = [builder.extract_value(res, k) for k in range(4)]
                return context.make_tuple(builder, sig.return_type, outs)

            return sig, codegen

        typer.__name__ = "ldmatrix_x4" + ("_trans" if trans else "")
        typer.__doc__ = f"Four 8 x 8 matrices of 16-bit values from shared memory into fragments: ``{op}``."
        return intrinsic(typer)

    ldmatrix_x4, ldmatrix_x4_trans = _make_ldmatrix(False), _make_ldmatrix(True)
