"""Below numba.cuda's launch path: record the launches a piece of code makes, pack each one's arguments once,
and launch the packed kernel straight through the driver.

This is the part of the runtime (:mod:`kernels_src.runtime.launch`, :mod:`kernels_src.runtime.graphs`) that
has to name numba's internals, so it lives behind the compiler door. A launch from Python through
``kern[grid, block](*args)`` does, every time: look up the overload for the argument types, wrap and check each
array, flatten it into (meminfo, parent, size, itemsize, data, shape..., strides...), build a cuda.core launch
configuration and hand the parameters to the driver. When the same kernel is launched on the same buffers
again and again (a decode step), all of that but the last call can be done once:

    rec = []
    with recording(rec):                    # run the code once; every launch is also appended to rec
        step()
    packed = [pack(r) for r in rec]         # overload chosen, arguments flattened into a ctypes array
    for p in packed:
        p.launch(stream_handle)             # one cuLaunchKernel each

Real GPU only: the CUDA simulator has no driver (``AVAILABLE`` and ``WHY`` say so).
"""
from __future__ import annotations

import ctypes
from contextlib import contextmanager

from .. import target as _target  # gpu / sim / cpu / ptx, chosen before numba.cuda is imported

AVAILABLE = _target.MODE == "gpu"
WHY = "" if AVAILABLE else f"needs a real GPU (kernels run in the {_target.MODE} mode)"


class Recorded:
    """One launch as numba made it: the compiled kernel (one overload), grid, block, dynamic shared memory
    and the Python arguments (device arrays and scalars; arrays are kept alive by this record)."""

    __slots__ = ("kernel", "griddim", "blockdim", "sharedmem", "args")

    def __init__(self, kernel, griddim, blockdim, sharedmem, args):
        self.kernel, self.griddim, self.blockdim, self.sharedmem, self.args = kernel, griddim, blockdim, sharedmem, args

    @property
    def name(self) -> str:
        """The Python name of the kernel (``gemv_kernel``), not the mangled one."""
        return getattr(self.kernel, "py_func", None).__name__ if getattr(self.kernel, "py_func", None) else "?"


def _dims(d):
    d = list(d) if isinstance(d, (tuple, list)) else [d]
    return tuple(int(x) for x in d + [1] * (3 - len(d)))


@contextmanager
def recording(into: list, execute: bool = True):
    """Within the block every numba.cuda kernel launch is appended to ``into`` as a :class:`Recorded` (and
    still runs, unless ``execute=False``). Host-side work (copies, allocations) is not recorded."""
    if not AVAILABLE:
        raise RuntimeError(f"recording launches {WHY}")
    from numba.cuda.dispatcher import _Kernel

    orig = _Kernel.launch

    def launch(self, args, griddim, blockdim, stream=0, sharedmem=0):
        into.append(Recorded(self, _dims(griddim), _dims(blockdim), int(sharedmem), tuple(args)))
        if execute:
            return orig(self, args, griddim, blockdim, stream, sharedmem)

    _Kernel.launch = launch
    try:
        yield into
    finally:
        _Kernel.launch = orig


class Packed:
    """A launch with its parameters flattened once into a ctypes array of pointers (``kernelParams``)."""

    __slots__ = ("name", "func", "griddim", "blockdim", "sharedmem", "n_params", "_vals", "_params", "_ptr")

    def __init__(self, name, func, griddim, blockdim, sharedmem, vals):
        self.name, self.func, self.griddim, self.blockdim, self.sharedmem = name, func, griddim, blockdim, sharedmem
        self._vals = vals
        self.n_params = len(vals)
        self._params = (ctypes.c_void_p * max(1, len(vals)))(*[ctypes.addressof(v) for v in vals])
        self._ptr = ctypes.addressof(self._params)

    @property
    def params_address(self) -> int:
        """The address of the kernelParams array (for a graph node's CUDA_KERNEL_NODE_PARAMS)."""
        return self._ptr

    def launch(self, stream=0):
        """One cuLaunchKernel on ``stream`` (a CUstream or its integer handle; 0 is the legacy stream)."""
        from cuda.bindings import driver

        g, b = self.griddim, self.blockdim
        err, = driver.cuLaunchKernel(self.func, g[0], g[1], g[2], b[0], b[1], b[2], self.sharedmem, stream,
                                     self._ptr, 0)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuLaunchKernel({self.name}) failed: {err!r}")


def _func(kernel):
    """The driver handle of a compiled kernel, as a CUfunction (a CUkernel is accepted by cuLaunchKernel
    once cast: CUDA 12's context-independent loading)."""
    from cuda.bindings import driver

    h = kernel._codelibrary.get_cufunc().handle
    return h if isinstance(h, driver.CUfunction) else driver.CUfunction(int(h))


def pack(rec: Recorded, stream=0) -> Packed:
    """Flatten the recorded arguments the way numba does (``_Kernel._prepare_args``) into ctypes values."""
    k = rec.kernel
    kernelargs, retr = [], []
    for t, v in zip(k.argument_types, rec.args):
        k._prepare_args(t, v, stream, retr, kernelargs)
    if retr:  # a host array was copied in for this launch: its write-back would be lost on a replay
        raise ValueError(f"{rec.name}: a host array was passed to the kernel; pass device arrays to pack a launch")
    vals = [a if isinstance(a, ctypes._SimpleCData) else ctypes.c_ssize_t(int(a)) for a in kernelargs]
    return Packed(rec.name, _func(k), rec.griddim, rec.blockdim, rec.sharedmem, vals)


def specialize(dispatcher, *args):
    """``dispatcher.specialize(*args)``: a dispatcher that skips the type lookup of every call."""
    return dispatcher.specialize(*args)
