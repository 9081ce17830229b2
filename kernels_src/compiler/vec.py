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
"""
from __future__ import annotations

from .. import device

if device.SIMULATED:

    def load4(arr, i):
        flat = arr.reshape(-1) if arr.ndim != 1 else arr
        j = 4 * i
        return flat[j], flat[j + 1], flat[j + 2], flat[j + 3]

    def store4(arr, i, a, b, c, d):
        flat = arr.reshape(-1) if arr.ndim != 1 else arr
        j = 4 * i
        flat[j], flat[j + 1], flat[j + 2], flat[j + 3] = a, b, c, d

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
