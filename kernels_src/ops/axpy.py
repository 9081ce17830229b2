"""axpy: out = a * x + y, the "hello world" of kernels (chapter 1).

Shapes: a scalar; x (n,), y (n,) -> out (n,)
Cost:   2n FLOPs; at least 3n elements move (read x, read y, write out). At 2 FLOPs per 12 bytes
        (float32) it is memory-bound on every machine ever built.

Ladder
  cpu/numpy               baseline: NumPy's vectorised expression (it makes a temporary)
  cpu/loop      rung 1    one @njit loop: compiled, one pass, no temporary
  cpu/prange    rung 2    the same loop split across cores with prange
  gpu/thread    rung 1    one thread per element, with a bounds guard for the last block
  gpu/stride    rung 2    a fixed grid that strides over the array: fewer, longer-lived threads
"""
import numpy as np
from ..compiler import cuda, njit, prange

from ..device import ceil_div
from ..registry import define_op, register


def reference(a, x, y):
    """float64 oracle."""
    return a * x + y


def make_inputs(size, dtype, rng):
    (n,) = size
    a = dtype.type(rng.uniform(0.5, 2.0))
    x = rng.standard_normal(n).astype(dtype)
    y = rng.standard_normal(n).astype(dtype)
    return a, x, y


define_op(
    "axpy", reference=reference, make_inputs=make_inputs, chapter=1, title="axpy: a*x + y",
    size_names=("n",), kind="memory",
    flops=lambda s: 2 * s[0], bytes=lambda s, b: 3 * s[0] * b,
    sizes={"check": [(1,), (2,), (7,), (127,), (1000,), (4099,), (65537,)],
           "check_sim": [(1,), (7,), (127,), (1000,)],
           "bench": [(1 << 12,), (1 << 16,), (1 << 20,), (1 << 22,), (1 << 24,)],
           "bench_gpu": [(1 << 12,), (1 << 16,), (1 << 20,), (1 << 22,), (1 << 24,), (1 << 26,), (1 << 28,)],
           "bench_sim": [(256,)]},
)


# ------------------------------------------------------------------------------------------ CPU
@register("axpy", "cpu", "numpy", baseline=True, bytes=lambda s, b: 5 * s[0] * b)
def axpy_numpy(out, a, x, y):
    """NumPy: out = a*x, then out += y. Two passes over out, so 5n elements move, not 3n."""
    np.multiply(x, a, out=out)
    out += y


def _torch_cpu():
    from .cpu_baselines import torch_cpu

    return torch_cpu()


@register("axpy", "cpu", "torch", baseline=True, requires=_torch_cpu)
def axpy_torch_cpu(out, a, x, y):
    """torch on the CPU: ``torch.add(y, x, alpha=a, out=out)``, one fused pass (3n elements)."""
    import torch

    from .cpu_baselines import tviews

    to, tx, ty = tviews(out, x, y)
    torch.add(ty, tx, alpha=float(a), out=to)


@njit(cache=True)
def _axpy_loop(out, a, x, y):
    for i in range(out.size):
        out[i] = a * x[i] + y[i]


@register("axpy", "cpu", "loop", rung=1)
def axpy_loop(out, a, x, y):
    """One compiled loop: a single pass, 3n elements moved, no temporary. Predicted: about NumPy's
    speed or better once the arrays are larger than the caches, since both are bandwidth-limited."""
    _axpy_loop(out, a, x, y)


@njit(parallel=True, cache=True)
def _axpy_prange(out, a, x, y):
    for i in prange(out.size):
        out[i] = a * x[i] + y[i]


@register("axpy", "cpu", "prange", rung=2)
def axpy_prange(out, a, x, y):
    """prange splits the loop over cores. Predicted: up to cores x faster on cache-resident arrays,
    much less once DRAM bandwidth (shared by the cores) is the limit; slower on tiny arrays, where
    waking the thread pool costs more than the work."""
    _axpy_prange(out, a, x, y)


# ------------------------------------------------------------------------------------------ GPU
SIG = "void(float32[::1], float32, float32[::1], float32[::1])"
THREADS = 256


@cuda.jit
def axpy_thread_kernel(out, a, x, y):
    i = cuda.grid(1)  # blockIdx.x * blockDim.x + threadIdx.x
    if i < out.size:  # the last block may run past the end
        out[i] = a * x[i] + y[i]


@register("axpy", "gpu", "thread", rung=1, ptx=[(axpy_thread_kernel, SIG)])
def axpy_thread(out, a, x, y):
    """One thread per element, ceil(n/256) blocks of 256. Neighbouring threads touch neighbouring
    addresses, so each warp's loads coalesce into full 128-byte transactions."""
    axpy_thread_kernel[ceil_div(out.size, THREADS), THREADS](out, a, x, y)


@cuda.jit
def axpy_stride_kernel(out, a, x, y):
    start = cuda.grid(1)
    step = cuda.gridsize(1)  # total threads in the grid
    for i in range(start, out.size, step):
        out[i] = a * x[i] + y[i]


@register("axpy", "gpu", "stride", rung=2, ptx=[(axpy_stride_kernel, SIG)])
def axpy_stride(out, a, x, y):
    """A grid-stride loop over at most 1024 blocks: each thread handles several elements. Predicted:
    the same bandwidth as one-thread-per-element at large n (both are memory-bound), with fewer
    block launches; the point is that one launch configuration now fits every n."""
    blocks = min(ceil_div(out.size, THREADS), 1024)
    axpy_stride_kernel[blocks, THREADS](out, a, x, y)
