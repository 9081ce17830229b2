"""bias_gelu_dropout: y = dropout(gelu_tanh(x + b)), the mask regenerated from (seed, offset) (chapter 16).

The epilogue of a transformer MLP's first layer in training: add the bias, apply GELU (chapter 6's tanh form),
drop. Chapter 6 fused the first two; dropout's mask needs no memory either (chapter 16 regenerates it from the
counter-based stream), so all three fit in one pass that reads x once and writes y once.

Shapes: x (M,N) f32, b (N,) f32, p, seed, offset -> y (M,N) f32
        y[r, c] = keep_i ? gelu_tanh(x[r, c] + b[c]) * float32(1 / (1 - p)) : 0,  i = r * N + c
        keep_i is dropout's rule on element i of the stream (seed, offset) (kernels_src/ops/philox.py): the same
        mask as ``dropout`` on the flattened array, so the backward regenerates it the same way.
Cost:   reads x (4MN bytes) and b (4N, from cache), writes y (4MN): 8MN bytes. Per element ~20 FLOPs of GELU
        (one exp, one division) and ~20 integer instructions of Philox: memory-bound on the H100 if both hide
        under the 8 bytes. The unfused chain writes gelu(x + b) and reads it back: 16MN bytes; torch eager runs
        bias add, GELU and dropout as three kernels (and dropout writes a 1-byte mask): ~33MN bytes.

Ladder
  cpu/numpy     base    bias_gelu's float32 NumPy formula, then dropout's (the stream's bits, a mask, a select)
  cpu/loop      rung 1  @njit, one pass over groups of four elements: one Philox call per group
  cpu/prange    rung 2  the groups over the cores
  gpu/torch     base    torch eager: dropout(gelu(x + b, approximate="tanh"), p), copied into y (torch's stream:
                        speed only)
  gpu/compile   base    torch.compile of the same three ops writing into y (one Triton kernel; speed only)
  gpu/unfused   rung 1  chapter 6's bias_gelu (fused_v4) into y, then chapter 16's dropout (vec4) in place: two
                        kernels, 16MN bytes
  gpu/fused     rung 2  one kernel, one thread per four consecutive elements of the flat array, one Philox call,
                        4-byte loads and stores (any N)
  gpu/fused_v4  rung 3  one kernel, a 2-D grid (rows on y), one 16-byte load of x and of b and one 16-byte store
                        of y per Philox call (N a multiple of 4, else rung 2)

The backward, bias_gelu_dropout_bwd: dy (M,N), x (M,N), b (N,), p, seed, offset -> dx (M,N)
        dx[r, c] = gelu_tanh'(x[r, c] + b[c]) * (keep_i ? dy[r, c] / (1 - p) : 0)
        the mask regenerated again, and x + b recomputed from x and b instead of stored: 12MN bytes (dy and x in,
        dx out). db = the column sums of dx is a reduction (chapter 7), left out here.
  cpu/loop, cpu/prange    rungs 1, 2 as the forward
  gpu/torch     base    torch eager with the mask it stored in the forward: gelu_backward(native_dropout_backward(
                        dy, mask, 1 / (1 - p)), x + b) (the mask made once, not timed; torch's stream: speed only)
  gpu/fused     rung 1  one thread per four flat elements, 4-byte accesses
  gpu/fused_v4  rung 2  16-byte loads of dy, x and b, a 16-byte store of dx (N % 4 == 0, else rung 1)
"""
import numpy as np

from .. import device
from ..compiler import cuda, load4, njit, prange, store4
from ..device import ceil_div
from ..registry import define_op, register
from ..registry import sprinkle as _sprinkle
from . import activations as act
from . import philox as ph
from .reductions import torch_gpu

THREADS = 256


# --------------------------------------------------------------------------------------- reference
def reference(x, b, p, seed, offset):
    """float64: chapter 6's bias_gelu reference, then chapter 16's dropout reference on the flat array."""
    return ph.dropout_ref(act.bias_gelu_ref(x, b), p, seed, offset)


def make_inputs(size, dtype, rng):
    x, b = act.bias_gelu_make_inputs(size, dtype, rng)
    p = float(rng.choice([0.1, 0.25, 0.5]))
    return x, b, p, int(rng.integers(0, 1 << 62)), int(rng.integers(0, 1 << 40))


def make_edge_inputs(size, dtype, rng):
    """bias_gelu's edge values in x (NaN, infinities, signed zeros, GELU's tails) with p = 1, 1/3 or 1/2: a dropped
    NaN comes out exactly 0, a kept one NaN. p = 0 is tested in tests/test_bias_gelu_dropout.py."""
    x, b, _, seed, offset = make_inputs(size, dtype, rng)
    _sprinkle(x, rng, act._EDGE_VALUES)
    return x, b, float(rng.choice([1.0, 1.0 / 3.0, 0.5])), seed, offset


def bytes_fused(s, itemsize):
    M, N = s
    return (2 * M * N + N) * itemsize


def bytes_unfused(s, itemsize):
    """bias_gelu reads x and b, writes y; dropout reads y and writes it again: 4MN + N elements."""
    M, N = s
    return (4 * M * N + N) * itemsize


# GELU's float32 tolerance (activations.TOL, (1e-5, 1e-6)) times the dropout scale (<= 2 in make_inputs, 1.5 in
# the edge inputs), plus the scale's and the product's roundings (2 x 2^-24 relative): (2e-5, 2e-6).
TOL = (2e-5, 2e-6)
SIZES = {"check": [(1, 1), (1, 3), (3, 7), (5, 33), (2, 257), (17, 4099), (3, 4100), (64, 1000)],
         "check_sim": [(1, 1), (1, 3), (3, 7), (5, 33), (3, 36)],
         "bench": [(1024, 4096)],
         # chapter 6's bias_gelu size: 2^26 elements, 256 MiB in and out
         "bench_gpu": [(16384, 4096)],
         "bench_sim": [(5, 33)]}

define_op("bias_gelu_dropout", reference=reference, make_inputs=make_inputs, chapter=16,
          title="bias + GELU + dropout (one pass, mask regenerated)", size_names=("M", "N"), kind="memory",
          tol=TOL, output_names=("y",), sizes=SIZES, edge_inputs=make_edge_inputs,
          flops=lambda s: 30 * s[0] * s[1], bytes=bytes_fused)


# --------------------------------------------------------------------------------------------- CPU
@register("bias_gelu_dropout", "cpu", "numpy", baseline=True, bytes=bytes_unfused)
def bgd_numpy(y, x, b, p, seed, offset):
    """bias_gelu's float32 NumPy formula into y, then dropout's NumPy formula in place."""
    t = x + b
    u = act.K_TANH * (t + act.C_TANH * t * t * t)
    with np.errstate(over="ignore", invalid="ignore"):
        y[:] = t / (act.F1 + np.exp(-act.F2 * u))
    ph.dropout_numpy(y.reshape(-1), y.reshape(-1).copy(), p, seed, offset)


@njit(inline="always")
def _group_cpu(y, x, b, g, n, N, t, scale, k0, k1, o0, o1):
    r = ph.philox10_cpu(np.uint32(g & 0xFFFFFFFF), np.uint32(g >> 32), o0, o1, k0, k1)
    for j in range(min(4, n - 4 * g)):
        i = 4 * g + j
        row = i // N
        c = i - row * N
        y[row, c] = ph.drop_cpu(act._gelu_tanh_cpu(x[row, c] + b[c]), r[j], t, scale)


@njit
def bgd_loop(y, x, b, t, scale, k0, k1, o0, o1):
    n = x.size
    N = x.shape[1]
    for g in range((n + 3) // 4):
        _group_cpu(y, x, b, g, n, N, t, scale, k0, k1, o0, o1)


@njit(parallel=True)
def bgd_ploop(y, x, b, t, scale, k0, k1, o0, o1):
    n = x.size
    N = x.shape[1]
    for g in prange((n + 3) // 4):
        _group_cpu(y, x, b, g, n, N, t, scale, k0, k1, o0, o1)


@register("bias_gelu_dropout", "cpu", "loop", rung=1)
def bgd_cpu(y, x, b, p, seed, offset):
    """One pass over groups of four elements of the flat array: one Philox call gives the group's four random
    words, GELU of x + b is computed in a register and dropped or scaled. Bound by the ~40 instructions per
    element (libm exp, Philox) on one core: predict ~dropout's loop plus gelu_tanh's loop."""
    bgd_loop(y, x, b, *ph.dropout_args(p, seed, offset))


@register("bias_gelu_dropout", "cpu", "prange", rung=2)
def bgd_cpu_par(y, x, b, p, seed, offset):
    """Rung 1 with the groups over the cores (prange): predict a speed-up equal to the number of cores."""
    bgd_ploop(y, x, b, *ph.dropout_args(p, seed, offset))


# --------------------------------------------------------------------------------------------- GPU
@cuda.jit
def bgd_flat_kernel(y, x, b, t, scale, k0, k1, o0, o1):
    # x (M,N), b (N,) -> y (M,N): thread g owns flat elements 4g .. 4g+3 (they may straddle two rows) and makes
    # their four random words with one Philox call at counter (g, 0, offset)
    g = cuda.grid(1)
    n = x.size
    N = x.shape[1]
    if 4 * g < n:
        r0, r1, r2, r3 = ph.philox10_dev(np.uint32(g), np.uint32(0), o0, o1, k0, k1)
        for j in range(4):
            i = 4 * g + j
            if i < n:
                rj = r0 if j == 0 else (r1 if j == 1 else (r2 if j == 2 else r3))
                row = i // N
                c = i - row * N
                y[row, c] = ph.drop_dev(act._gelu_tanh_dev(x[row, c] + b[c]), rj, t, scale)


@cuda.jit
def bgd_v4_kernel(y, x, b, t, scale, k0, k1, o0, o1):
    # x (M,N), N = 4 n4, b (N,) -> y (M,N). Grid (ceil(n4 / T), M): thread q of row blockIdx.y owns columns
    # 4q .. 4q+3, i.e. Philox group g = row * n4 + q; one 16-byte load of x, one of b, one 16-byte store of y
    n4 = x.shape[1] // 4
    row = cuda.blockIdx.y
    q = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if q < n4:
        g = row * n4 + q
        p0, p1, p2, p3 = load4(x, g)
        b0, b1, b2, b3 = load4(b, q)
        r0, r1, r2, r3 = ph.philox10_dev(np.uint32(g), np.uint32(0), o0, o1, k0, k1)
        store4(y, g, ph.drop_dev(act._gelu_tanh_dev(p0 + b0), r0, t, scale),
               ph.drop_dev(act._gelu_tanh_dev(p1 + b1), r1, t, scale),
               ph.drop_dev(act._gelu_tanh_dev(p2 + b2), r2, t, scale),
               ph.drop_dev(act._gelu_tanh_dev(p3 + b3), r3, t, scale))


M2, V = "float32[:, ::1]", "float32[::1]"
SIG = f"void({M2}, {M2}, {V}, {ph.SCALARS})"


def _threads():
    return 32 if device.SIMULATED else THREADS


def _check_n(x):
    ph._groups_check(x.size)
    if x.ndim != 2:
        raise ValueError(f"bias_gelu_dropout: x must be (M, N), got shape {x.shape}")


@register("bias_gelu_dropout", "gpu", "unfused", rung=1, bytes=bytes_unfused,
          ptx=[(act.bias_gelu_v4_kernel(), f"void({M2}, {M2}, {V})"), (act.bias_gelu_kernel, f"void({M2}, {M2}, {V})"),
               (ph.dropout_vec4_kernel, ph.D_SIG), (ph.dropout_thread4_kernel, ph.D_SIG)])
def bgd_gpu_unfused(y, x, b, p, seed, offset):
    """Two kernels, each the best of its chapter: bias_gelu (fused_v4) writes gelu(x + b) into y, then dropout
    (vec4) reads y and writes it in place. 16 bytes per element cross the bus: at copy speed predict twice the
    fused kernel's time."""
    _check_n(x)
    act.bias_gelu_fused_v4(y, x, b)
    yf = y.reshape(-1)
    ph.dropout_gpu_vec4(yf, yf, p, seed, offset)


@register("bias_gelu_dropout", "gpu", "fused", rung=2, ptx=[(bgd_flat_kernel, SIG)])
def bgd_gpu_fused(y, x, b, p, seed, offset):
    """One kernel: thread g takes four consecutive elements of the flat array, one Philox call gives their random
    words, x + b and GELU stay in registers, and only y is written: 8 bytes per element. 4-byte accesses and a
    division per element (row and column of any N): predict ~70 % of copy, like chapter 6's fused rung."""
    _check_n(x)
    groups = (x.size + 3) // 4
    bgd_flat_kernel[max(1, ceil_div(groups, _threads())), _threads()](y, x, b, *ph.dropout_args(p, seed, offset))


@register("bias_gelu_dropout", "gpu", "fused_v4", rung=3, ptx=[(bgd_v4_kernel, SIG)])
def bgd_gpu_fused_v4(y, x, b, p, seed, offset):
    """Rung 2 with the group of four in one row (N % 4 == 0), so x, b and y move as 16-byte vectors and the row is
    blockIdx.y (no division): one load of x, one of b (cached), one store and one Philox call per thread. The
    parts were each at copy speed (bias_gelu fused_v4, dropout vec4); the fused kernel does both computations
    on 8 bytes per element: predict >= 90 % of copy, about twice rung 1 and faster than torch.compile, which
    draws its random numbers in the same kernel but keeps torch's own generator. Other N take rung 2."""
    _check_n(x)
    M, N = x.shape
    if N % 4 or not ph._aligned16(y, x, b):
        return bgd_gpu_fused(y, x, b, p, seed, offset)
    T = _threads()
    bgd_v4_kernel[(max(1, ceil_div(N // 4, T)), M), T](y, x, b, *ph.dropout_args(p, seed, offset))


# ------------------------------------------------------------------------------------ torch baselines
def _torch_eager_bytes(s, itemsize):
    """x + b (read 2, write 1), GELU (read 1, write 1), dropout (read 1, write 1 and a 1-byte mask), the copy
    into y (read 1, write 1): 9 floats and a byte per element."""
    M, N = s
    return (9 * M * N + N) * itemsize + M * N


@register("bias_gelu_dropout", "gpu", "torch", baseline=True, requires=torch_gpu, tol=ph.STREAM_DIFFERS,
          bytes=_torch_eager_bytes, edge_exempt=ph.STREAM_EXEMPT)
def bgd_torch(y, x, b, p, seed, offset):
    """torch eager: dropout(gelu(x + b, approximate="tanh"), p, training=True) (three kernels; dropout also writes
    its mask), copied into y (torch's dropout has no out=). Speed only: torch's generator, not the course's."""
    import torch

    from .reductions import torch_view

    F = torch.nn.functional
    torch_view(y).copy_(F.dropout(F.gelu(torch_view(x) + torch_view(b), approximate="tanh"), p, training=True))


def _torch_fn(y, x, b, p):
    import torch

    F = torch.nn.functional
    y.copy_(F.dropout(F.gelu(x + b, approximate="tanh"), p, training=True))


_COMPILED: dict = {}


@register("bias_gelu_dropout", "gpu", "compile", baseline=True, requires=torch_gpu, tol=ph.STREAM_DIFFERS,
          edge_exempt=ph.STREAM_EXEMPT)
def bgd_compile(y, x, b, p, seed, offset):
    """torch.compile of the same three ops writing into y (Inductor fuses them into one Triton kernel, which
    draws Philox numbers itself and stores no mask). Speed only: torch's generator, not the course's."""
    import torch

    from .reductions import torch_view

    if "f" not in _COMPILED:
        _COMPILED["f"] = torch.compile(_torch_fn, dynamic=False)
    _COMPILED["f"](torch_view(y), torch_view(x), torch_view(b), p)


def bias_gelu_dropout(x, b, p, seed, offset=0, out=None):
    """y = dropout(gelu(x + b)) on whatever ``x`` is (NumPy: the CPU prange rung; a device array: the GPU fused_v4
    rung), with the mask of the stream (seed, offset)."""
    ph.check_p(p)
    if hasattr(x, "__cuda_array_interface__") and not isinstance(x, np.ndarray):
        y = out if out is not None else cuda.device_array_like(x)
        bgd_gpu_fused_v4(y, x, b, p, seed, offset)
        return y
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = out if out is not None else np.empty_like(x)
    bgd_cpu_par(y, x, np.ascontiguousarray(b, dtype=np.float32), p, seed, offset)
    return y


# ===================================================================================== the backward
def reference_bwd(dy, x, b, p, seed, offset):
    """float64: dropout's backward on dy (the same mask, regenerated), then GELU's derivative at x + b."""
    return act.gelu_tanh_bwd_ref(ph.dropout_bwd_ref(dy, p, seed, offset), x + b)


def make_inputs_bwd(size, dtype, rng):
    x, b, p, seed, offset = make_inputs(size, dtype, rng)
    return rng.standard_normal(x.shape).astype(dtype), x, b, p, seed, offset


def make_edge_inputs_bwd(size, dtype, rng):
    """NaN and infinities in dy (a dropped one must give exactly 0), GELU's finite edge values in x (its derivative
    at +-inf is 0 * inf in the textbook formula, a question the kernels do not answer), p = 1, 1/3 or 1/2."""
    dy, x, b, _, seed, offset = make_inputs_bwd(size, dtype, rng)
    _sprinkle(dy, rng, [np.nan, np.inf, -np.inf, -0.0])
    _sprinkle(x, rng, act._EDGE_VALUES[:6])
    return dy, x, b, float(rng.choice([1.0, 1.0 / 3.0, 0.5])), seed, offset


def bytes_bwd(s, itemsize):
    M, N = s
    return (3 * M * N + N) * itemsize


define_op("bias_gelu_dropout_bwd", reference=reference_bwd, make_inputs=make_inputs_bwd, chapter=16,
          title="bias + GELU + dropout backward (mask regenerated, x + b recomputed)", size_names=("M", "N"),
          kind="memory", tol=TOL, output_names=("dx",), sizes=SIZES, edge_inputs=make_edge_inputs_bwd,
          flops=lambda s: 40 * s[0] * s[1], bytes=bytes_bwd)

_gelu_bwd_cpu = act._cpu(act.gelu_tanh_bwd_s)
_gelu_bwd_dev = act._dev(act.gelu_tanh_bwd_s)


@njit(inline="always")
def _group_bwd_cpu(dx, dy, x, b, g, n, N, t, scale, k0, k1, o0, o1):
    r = ph.philox10_cpu(np.uint32(g & 0xFFFFFFFF), np.uint32(g >> 32), o0, o1, k0, k1)
    for j in range(min(4, n - 4 * g)):
        i = 4 * g + j
        row = i // N
        c = i - row * N
        dx[row, c] = _gelu_bwd_cpu(ph.drop_cpu(dy[row, c], r[j], t, scale), x[row, c] + b[c])


@njit
def bgd_bwd_loop(dx, dy, x, b, t, scale, k0, k1, o0, o1):
    n = x.size
    N = x.shape[1]
    for g in range((n + 3) // 4):
        _group_bwd_cpu(dx, dy, x, b, g, n, N, t, scale, k0, k1, o0, o1)


@njit(parallel=True)
def bgd_bwd_ploop(dx, dy, x, b, t, scale, k0, k1, o0, o1):
    n = x.size
    N = x.shape[1]
    for g in prange((n + 3) // 4):
        _group_bwd_cpu(dx, dy, x, b, g, n, N, t, scale, k0, k1, o0, o1)


@register("bias_gelu_dropout_bwd", "cpu", "loop", rung=1)
def bgd_bwd_cpu(dx, dy, x, b, p, seed, offset):
    """One pass over groups of four: one Philox call per group rebuilds the forward's mask, dy is dropped and
    scaled, then multiplied by GELU's derivative at x + b (recomputed, not stored)."""
    bgd_bwd_loop(dx, dy, x, b, *ph.dropout_args(p, seed, offset))


@register("bias_gelu_dropout_bwd", "cpu", "prange", rung=2)
def bgd_bwd_cpu_par(dx, dy, x, b, p, seed, offset):
    """Rung 1 with the groups over the cores: predict a speed-up equal to the number of cores."""
    bgd_bwd_ploop(dx, dy, x, b, *ph.dropout_args(p, seed, offset))


@cuda.jit
def bgd_bwd_flat_kernel(dx, dy, x, b, t, scale, k0, k1, o0, o1):
    # dy, x (M,N), b (N,) -> dx (M,N): thread g owns flat elements 4g .. 4g+3 and one Philox call
    g = cuda.grid(1)
    n = x.size
    N = x.shape[1]
    if 4 * g < n:
        r0, r1, r2, r3 = ph.philox10_dev(np.uint32(g), np.uint32(0), o0, o1, k0, k1)
        for j in range(4):
            i = 4 * g + j
            if i < n:
                rj = r0 if j == 0 else (r1 if j == 1 else (r2 if j == 2 else r3))
                row = i // N
                c = i - row * N
                dx[row, c] = _gelu_bwd_dev(ph.drop_dev(dy[row, c], rj, t, scale), x[row, c] + b[c])


@cuda.jit
def bgd_bwd_v4_kernel(dx, dy, x, b, t, scale, k0, k1, o0, o1):
    # as bgd_v4_kernel: grid (ceil(n4 / T), M), one 16-byte group of dy, x, b and dx per thread
    n4 = x.shape[1] // 4
    row = cuda.blockIdx.y
    q = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if q < n4:
        g = row * n4 + q
        d0, d1, d2, d3 = load4(dy, g)
        p0, p1, p2, p3 = load4(x, g)
        b0, b1, b2, b3 = load4(b, q)
        r0, r1, r2, r3 = ph.philox10_dev(np.uint32(g), np.uint32(0), o0, o1, k0, k1)
        store4(dx, g, _gelu_bwd_dev(ph.drop_dev(d0, r0, t, scale), p0 + b0),
               _gelu_bwd_dev(ph.drop_dev(d1, r1, t, scale), p1 + b1),
               _gelu_bwd_dev(ph.drop_dev(d2, r2, t, scale), p2 + b2),
               _gelu_bwd_dev(ph.drop_dev(d3, r3, t, scale), p3 + b3))


SIG_BWD = f"void({M2}, {M2}, {M2}, {V}, {ph.SCALARS})"


@register("bias_gelu_dropout_bwd", "gpu", "fused", rung=1, ptx=[(bgd_bwd_flat_kernel, SIG_BWD)])
def bgd_bwd_gpu_fused(dx, dy, x, b, p, seed, offset):
    """One kernel, one thread per four flat elements: the mask from one Philox call, x + b recomputed, GELU's
    derivative applied; 12 bytes per element, no mask and no saved x + b read. 4-byte accesses and a division
    per element: predict ~70 % of copy."""
    _check_n(x)
    groups = (x.size + 3) // 4
    bgd_bwd_flat_kernel[max(1, ceil_div(groups, _threads())), _threads()](dx, dy, x, b,
                                                                          *ph.dropout_args(p, seed, offset))


@register("bias_gelu_dropout_bwd", "gpu", "fused_v4", rung=2, ptx=[(bgd_bwd_v4_kernel, SIG_BWD)])
def bgd_bwd_gpu_fused_v4(dx, dy, x, b, p, seed, offset):
    """Rung 1 with 16-byte loads of dy, x and b and a 16-byte store of dx (N % 4 == 0, else rung 1). ~40
    instructions per element (Philox, exp, the derivative) against 12 bytes: predict >= 85 % of copy, and ahead of
    torch's backward, which reads a stored mask and a stored x + b in two kernels."""
    _check_n(x)
    M, N = x.shape
    if N % 4 or not ph._aligned16(dx, dy, x, b):
        return bgd_bwd_gpu_fused(dx, dy, x, b, p, seed, offset)
    T = _threads()
    bgd_bwd_v4_kernel[(max(1, ceil_div(N // 4, T)), M), T](dx, dy, x, b, *ph.dropout_args(p, seed, offset))


_SAVED: dict = {}


def _torch_bwd_bytes(s, itemsize):
    """dropout's backward reads dy and the 1-byte mask and writes a float; GELU's backward reads it and the saved
    x + b and writes dx: 5 floats and a byte per element."""
    M, N = s
    return 5 * M * N * itemsize + M * N


@register("bias_gelu_dropout_bwd", "gpu", "torch", baseline=True, requires=torch_gpu, tol=ph.STREAM_DIFFERS,
          bytes=_torch_bwd_bytes, edge_exempt=ph.STREAM_EXEMPT)
def bgd_bwd_torch(dx, dy, x, b, p, seed, offset):
    """torch eager as autograd runs it, from what the forward saved (x + b and dropout's 1-byte mask, made once
    here and not timed): native_dropout_backward, then gelu_backward into dx. Speed only: torch's mask."""
    import torch

    from .reductions import torch_view

    key = (id(x), id(b), p)
    if key not in _SAVED:
        _SAVED.clear()
        t = torch_view(x) + torch_view(b)
        _SAVED[key] = (t, torch.native_dropout(t, p, True)[1])
    t, mask = _SAVED[key]
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    g = torch.ops.aten.native_dropout_backward(torch_view(dy), mask, scale)
    try:  # the out= overload writes dx directly
        torch.ops.aten.gelu_backward.grad_input(g, t, approximate="tanh", grad_input=torch_view(dx))
    except (RuntimeError, TypeError, AttributeError):
        torch_view(dx).copy_(torch.ops.aten.gelu_backward(g, t, approximate="tanh"))
