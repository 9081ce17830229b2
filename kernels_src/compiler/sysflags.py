"""Flag words that another GPU reads or writes: ``flag_load`` and ``flag_store``, strong at system scope.

Two GPUs that synchronise through memory (the course's multi-GPU all-reduce, :mod:`kernels_src.dist.gpu`) need
loads and stores of a flag word that neither the compiler nor the caches may keep to themselves:

    v = flag_load(flags, i)       # ld.relaxed.sys.global.u32: a fresh read of flags[i], every time
    flag_store(flags, i, v)       # st.relaxed.sys.global.u32: the write goes out to the owner of the memory

``flags`` is a 1-D int32 (or uint32) device array, in this GPU's memory or a peer's (opened through CUDA IPC).
Numba's plain ``flags[i]`` is a *weak* access: the compiler may hoist it out of a spin loop (an endless loop) and
the PTX memory model gives it no ordering with another GPU. ``.relaxed.sys`` makes each access *strong* at
system scope: every load really goes to memory, and a pair of them on two GPUs is "morally strong" (both
strong, each one's scope including the other thread), which is what the memory model asks of the flag in a
release/acquire pattern. The ordering itself comes from fences: the writer issues ``cuda.threadfence_system()``
(``fence.sc.sys``) between its data and ``flag_store`` (a release pattern), the reader issues one between
``flag_load`` and its data reads (an acquire pattern). Numba's own atomics would also be strong, but only at GPU
scope (``atom.global`` without a scope is ``.gpu``), which does not include a thread on the other GPU.

Each is one inline-PTX instruction marked as having side effects and clobbering memory, so LLVM keeps it in
place and in the loop. In the CUDA simulator they are plain indexing (the simulator's threads share one
Python process, and the GIL makes a 4-byte read or write whole). numba-cuda-mlir has no inline assembly: there
they are GPU-scope atomics (``atomic.add(flags, i, 0)`` and ``atomic.exch``), enough on one GPU and stated as
weaker across two.
"""
from __future__ import annotations

from .. import target as _target  # gpu / sim / cpu / ptx, chosen before numba.cuda is imported
from . import USE_MLIR as _MLIR  # compiler/__init__.py sets it before it imports this module

if _target.SIMULATED:

    def flag_load(arr, i):
        return arr[i]

    def flag_store(arr, i, v):
        arr[i] = v

elif _MLIR:  # pragma: no cover  (needs the optional package)
    from numba_cuda_mlir import cuda as _cuda  # type: ignore[import-not-found]
    from numba_cuda_mlir.numba_cuda.extending import overload  # type: ignore[import-not-found]

    def flag_load(arr, i):
        """flags[i], read from memory (GPU-scope atomic under numba-cuda-mlir)."""
        raise NotImplementedError("flag_load runs only inside a kernel")

    def flag_store(arr, i, v):
        """flags[i] = v, written to memory (GPU-scope atomic under numba-cuda-mlir)."""
        raise NotImplementedError("flag_store runs only inside a kernel")

    @overload(flag_load, target="cuda")
    def _flag_load(arr, i):
        def impl(arr, i):
            return _cuda.atomic.add(arr, i, 0)
        return impl

    @overload(flag_store, target="cuda")
    def _flag_store(arr, i, v):
        def impl(arr, i, v):
            _cuda.atomic.exch(arr, i, v)
        return impl

else:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.cuda.extending import intrinsic

    def _check(arr, i):
        if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype in (types.int32, types.uint32)):
            raise TypeError(f"flag_load/flag_store need a 1-D int32 or uint32 array, not {arr}")
        if not isinstance(i, types.Integer):
            raise TypeError(f"flag_load/flag_store need an integer index, not {i}")

    def _pointer(context, builder, aryty, ary, idxty, idx):
        arr = context.make_array(aryty)(context, builder, value=ary)
        idx = context.cast(builder, idx, idxty, types.intp)
        return cgutils.get_item_pointer(context, builder, aryty, arr, [idx], wraparound=False)

    @intrinsic
    def flag_load(typingctx, arr, i):
        """flags[i] as one ``ld.relaxed.sys.global.u32``: read from memory every time, strong at system scope."""
        _check(arr, i)
        sig = arr.dtype(arr, i)

        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            ptr = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            asm = ir.InlineAsm(ir.FunctionType(i32, [ptr.type]), "ld.relaxed.sys.global.u32 $0, [$1];",
                               "=r,l,~{memory}", side_effect=True)
            return builder.call(asm, [ptr])

        return sig, codegen

    @intrinsic
    def flag_store(typingctx, arr, i, v):
        """flags[i] = v as one ``st.relaxed.sys.global.u32``: strong at system scope."""
        _check(arr, i)
        if not isinstance(v, types.Integer):
            raise TypeError(f"flag_store stores an integer, not {v}")
        sig = types.void(arr, i, v)

        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            ptr = _pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            val = context.cast(builder, args[2], sig.args[2], sig.args[0].dtype)
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [ptr.type, i32]),
                               "st.relaxed.sys.global.u32 [$0], $1;", "l,r,~{memory}", side_effect=True)
            builder.call(asm, [ptr, val])
            return context.get_dummy_value()

        return sig, codegen
