"""16-byte global loads and stores for numba.cuda kernels: ``load4`` and ``store4``.

A GPU moves memory in 32-byte sectors, and one instruction of a warp can ask for up to 512 bytes when each
thread loads 16 (``ld.global.v4.f32``, SASS ``LDG.E.128``). Numba indexes arrays one element at a time and
cannot prove that ``x[4*i]`` is 16-byte aligned, so it emits four 4-byte loads: four times the load
instructions for the same bytes. These two intrinsics emit the 16-byte form::

    a, b, c, d = load4(x, i)        # x.flat[4*i : 4*i + 4], one 16-byte load
    store4(y, i, a, b, c, d)        # y.flat[4*i : 4*i + 4] = a, b, c, d, one 16-byte store

``x`` is a C-contiguous array of a 4-byte type (float32, int32, uint32) whose data starts on a 16-byte
boundary; ``i`` counts groups of four elements of its flat buffer. Arrays from ``cuda.device_array`` /
``cuda.to_device`` start on a 256-byte boundary; a slice that starts at an element that is not a multiple of
four does not. Like any CUDA load, nothing is bounds-checked on the GPU: the caller guards ``4*i + 3 < size``
and handles the tail. In the CUDA simulator they are ordinary Python, indexing (and bounds-checking) the
four elements.

Under numba-cuda they are Numba intrinsics that emit an LLVM ``<4 x float>`` load/store; under numba-cuda-mlir,
which lowers through MLIR and runs no llvmlite code, they are overloads on its ``cuda.vector.load``/``store``
with ``alignment=16``, which emit the same ``ld.global.v4``/``st.global.v4`` (a 2-D array's flat index becomes
a (row, column) pair there, one integer division more per call).
"""
from __future__ import annotations

from .. import target as _target  # gpu / sim / cpu / ptx, chosen before numba.cuda is imported
from . import USE_MLIR as _MLIR  # compiler/__init__.py sets it before it imports this module

if _target.SIMULATED:

    def load4(arr, i):
        flat = arr.reshape(-1) if arr.ndim != 1 else arr
        j = 4 * i
        return flat[j], flat[j + 1], flat[j + 2], flat[j + 3]

    def store4(arr, i, a, b, c, d):
        flat = arr.reshape(-1) if arr.ndim != 1 else arr
        j = 4 * i
        flat[j], flat[j + 1], flat[j + 2], flat[j + 3] = a, b, c, d

elif _MLIR:
    from numba_cuda_mlir import cuda as _cuda  # type: ignore[import-not-found]
    from numba_cuda_mlir.cuda import vector_types as _vt  # type: ignore[import-not-found]
    from numba_cuda_mlir.numba_cuda import types as _types  # type: ignore[import-not-found]
    from numba_cuda_mlir.numba_cuda.extending import overload  # type: ignore[import-not-found]

    def load4(arr, i):
        """x.flat[4*i : 4*i + 4] as one 16-byte load (compiled by numba-cuda-mlir)."""
        raise NotImplementedError("load4 runs only inside a kernel")

    def store4(arr, i, a, b, c, d):
        """x.flat[4*i : 4*i + 4] = a, b, c, d as one 16-byte store (compiled by numba-cuda-mlir)."""
        raise NotImplementedError("store4 runs only inside a kernel")

    def _vector_type(arr):
        name = {_types.float32: "float32x4", _types.int32: "int32x4", _types.uint32: "uint32x4"}.get(arr.dtype)
        if name is None or arr.layout != "C" or arr.ndim > 4:
            raise TypeError(f"load4/store4 need a C-contiguous array (1-D to 4-D) of float32, int32 or uint32, "
                            f"not {arr}")
        return getattr(_vt, name)

    # cuda.vector.load/store index an array by its own dimensions: the flat index 4*i becomes one index per
    # dimension (integer divisions by the trailing extents, which the caller keeps multiples of 4).
    @overload(load4, target="cuda")
    def _load4(arr, i):
        _vector_type(arr)
        if arr.ndim == 1:
            def impl(arr, i):
                v = _cuda.vector.load(arr, 4 * i, 4, alignment=16)
                return v.x, v.y, v.z, v.w
        elif arr.ndim == 2:
            def impl(arr, i):
                j = 4 * i
                n = arr.shape[1]
                v = _cuda.vector.load(arr, (j // n, j % n), 4, alignment=16)
                return v.x, v.y, v.z, v.w
        elif arr.ndim == 3:
            def impl(arr, i):
                j = 4 * i
                n1, n2 = arr.shape[1], arr.shape[2]
                v = _cuda.vector.load(arr, (j // (n1 * n2), (j // n2) % n1, j % n2), 4, alignment=16)
                return v.x, v.y, v.z, v.w
        else:
            def impl(arr, i):
                j = 4 * i
                n1, n2, n3 = arr.shape[1], arr.shape[2], arr.shape[3]
                v = _cuda.vector.load(arr, (j // (n1 * n2 * n3), (j // (n2 * n3)) % n1, (j // n3) % n2, j % n3), 4,
                                      alignment=16)
                return v.x, v.y, v.z, v.w
        return impl

    @overload(store4, target="cuda")
    def _store4(arr, i, a, b, c, d):
        vec = _vector_type(arr)
        if arr.ndim == 1:
            def impl(arr, i, a, b, c, d):
                _cuda.vector.store(arr, 4 * i, vec(a, b, c, d), alignment=16)
        elif arr.ndim == 2:
            def impl(arr, i, a, b, c, d):
                j = 4 * i
                n = arr.shape[1]
                _cuda.vector.store(arr, (j // n, j % n), vec(a, b, c, d), alignment=16)
        elif arr.ndim == 3:
            def impl(arr, i, a, b, c, d):
                j = 4 * i
                n1, n2 = arr.shape[1], arr.shape[2]
                _cuda.vector.store(arr, (j // (n1 * n2), (j // n2) % n1, j % n2), vec(a, b, c, d), alignment=16)
        else:
            def impl(arr, i, a, b, c, d):
                j = 4 * i
                n1, n2, n3 = arr.shape[1], arr.shape[2], arr.shape[3]
                _cuda.vector.store(arr, (j // (n1 * n2 * n3), (j // (n2 * n3)) % n1, (j // n3) % n2, j % n3),
                                   vec(a, b, c, d), alignment=16)
        return impl

else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    _FOUR_BYTE = (types.float32, types.int32, types.uint32)

    def _vector_pointer(context, builder, arrty, arr, idx, idxty):
        ary = context.make_array(arrty)(context, builder, arr)
        i = context.cast(builder, idx, idxty, types.intp)
        elem = builder.gep(ary.data, [builder.mul(i, ir.Constant(i.type, 4))])
        lltype = context.get_data_type(arrty.dtype)
        return builder.bitcast(elem, ir.PointerType(ir.VectorType(lltype, 4)))

    def _check(arr, i):
        return (isinstance(arr, types.Array) and arr.dtype in _FOUR_BYTE and arr.layout == "C"
                and isinstance(i, types.Integer))

    @intrinsic
    def load4(typingctx, arr, i):
        if not _check(arr, i):
            return None
        sig = types.UniTuple(arr.dtype, 4)(arr, i)

        def codegen(context, builder, sig, args):
            vptr = _vector_pointer(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            vec = builder.load(vptr, align=16)
            vals = [builder.extract_element(vec, ir.Constant(ir.IntType(32), k)) for k in range(4)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    @intrinsic
    def store4(typingctx, arr, i, a, b, c, d):
        if not _check(arr, i):
            return None
        sig = types.void(arr, i, arr.dtype, arr.dtype, arr.dtype, arr.dtype)

        def codegen(context, builder, sig, args):
            arrty = sig.args[0]
            vptr = _vector_pointer(context, builder, arrty, args[0], args[1], sig.args[1])
            vec = ir.Constant(ir.VectorType(context.get_data_type(arrty.dtype), 4), ir.Undefined)
            for k, (v, vt) in enumerate(zip(args[2:], sig.args[2:])):
                v = context.cast(builder, v, vt, arrty.dtype)
                vec = builder.insert_element(vec, v, ir.Constant(ir.IntType(32), k))
            builder.store(vec, vptr, align=16)
            return context.get_dummy_value()

        return sig, codegen
