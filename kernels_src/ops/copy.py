"""copy: out = x. The copy yardstick: the fastest way to move bytes, against which every memory-bound kernel
in the course is measured (chapter 1).

Shapes: x (n,) -> out (n,)
Cost:   0 FLOPs; 2n elements move (read x, write out).

A memory-bound kernel reads and writes at least some number of bytes; the best it can do is move them as
fast as a plain copy does. So the yardstick is the fastest copy measured in the same run, by the same timer:
the fastest of the driver's ``cudaMemcpy`` device-to-device, torch's copy kernel (when torch is installed)
and the course's own copy kernel below. A yardstick a kernel beats is no yardstick, so it takes the best of
all three (:func:`kernels_src.bench.measure_peaks`).

Ladder
  gpu/memcpy       baseline  cudaMemcpy device-to-device (numba's ``copy_to_device``)
  gpu/torch        baseline  torch's ``Tensor.copy_`` kernel
  gpu/thread       rung 1    one thread per element, 4-byte loads and stores
  gpu/stride_v4    rung 2    a grid of 4 blocks per SM x 1024 threads that strides over the array, 16-byte
                             loads and stores (``kernels_src.vec.load4``): a quarter of the memory
                             instructions of rung 1, and no tail of idle blocks
  cpu/numpy        baseline  ``numpy.copyto``
  cpu/prange       rung 1    a ``prange`` loop over every core
"""
import numpy as np
from ..compiler import cuda, load4, njit, prange, store4

from .. import device
from ..device import ceil_div
from ..registry import define_op, register
from .reductions import torch_gpu, torch_view


def reference(x):
    """float64 oracle."""
    return x.copy()


def make_inputs(size, dtype, rng):
    (n,) = size
    return (rng.standard_normal(n).astype(dtype),)


define_op(
    "copy", reference=reference, make_inputs=make_inputs, chapter=1, title="copy: the bandwidth yardstick",
    size_names=("n",), kind="memory", tol=(0.0, 0.0),
    flops=lambda s: 0, bytes=lambda s, b: 2 * s[0] * b,
    sizes={"check": [(1,), (3,), (4,), (5,), (127,), (1000,), (4099,), (65537,)],
           "check_sim": [(1,), (3,), (5,), (130,)],
           "bench": [(1 << 20,), (1 << 24,)],
           "bench_gpu": [(1 << 20,), (1 << 24,), (1 << 26,), (1 << 28,)],
           "bench_sim": [(256,)]},
)


# ------------------------------------------------------------------------------------------ CPU
@register("copy", "cpu", "numpy", baseline=True)
def copy_numpy(out, x):
    """numpy.copyto: one thread, memcpy underneath."""
    np.copyto(out, x)


@njit(parallel=True, cache=True)
def _copy_prange(out, x):
    for i in prange(x.size):
        out[i] = x[i]


@register("copy", "cpu", "prange", rung=1)
def copy_prange(out, x):
    """A prange loop: every core streams a slice. Predicted: faster than one thread where one core cannot
    use the whole memory bandwidth (most servers), about equal on a small machine."""
    _copy_prange(out, x)


# ------------------------------------------------------------------------------------------ GPU
THREADS = 256
STRIDE_THREADS = 1024
BLOCKS_PER_SM = 4  # 4 x 1024 threads = 2048, a full SM on Hopper


@cuda.jit
def copy_thread_kernel(out, x):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = x[i]


@register("copy", "gpu", "thread", rung=1, ptx=[(copy_thread_kernel, "void(float32[::1], float32[::1])")])
def copy_thread(out, x):
    """One thread per element. Predicted: near the copy speed on large arrays already (each warp reads
    128 contiguous bytes), a little below it from the per-element instruction count."""
    copy_thread_kernel[ceil_div(x.size, THREADS), THREADS](out, x)


@cuda.jit
def copy_stride_v4_kernel(out, x):
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    n4 = x.size // 4
    i = start
    while i < n4:
        a, b, c, d = load4(x, i)
        store4(out, i, a, b, c, d)
        i += stride
    j = 4 * n4 + start  # the last x.size % 4 elements, one per thread
    if j < x.size:
        out[j] = x[j]


def _grid(n4: int) -> int:
    if device.SIMULATED:
        return max(1, min(2, ceil_div(n4, 32)))
    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    return max(1, min(BLOCKS_PER_SM * sms, ceil_div(n4, STRIDE_THREADS)))


@register("copy", "gpu", "stride_v4", rung=2,
          ptx=[(copy_stride_v4_kernel, "void(float32[::1], float32[::1])")])
def copy_stride_v4(out, x):
    """16-byte loads and stores over a grid that fills every SM once and strides. Predicted: the fastest
    course copy, at the cudaMemcpy speed or a few per cent above it (a copy kernel is what torch uses)."""
    threads = 32 if device.SIMULATED else STRIDE_THREADS
    copy_stride_v4_kernel[_grid(x.size // 4), threads](out, x)


@register("copy", "gpu", "memcpy", baseline=True)
def copy_memcpy(out, x):
    """cudaMemcpy device-to-device (numba's ``DeviceNDArray.copy_to_device``)."""
    out.copy_to_device(x)


@register("copy", "gpu", "torch", baseline=True, requires=torch_gpu)
def copy_torch(out, x):
    """torch's copy kernel (``Tensor.copy_``) on zero-copy views of the same buffers."""
    torch_view(out).copy_(torch_view(x))
