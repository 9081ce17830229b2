"""Fused chains of the decode step (chapter 14): a residual add and the RMSNorm that follows it, in one kernel.

add_rmsnorm  a (M,C), b (M,C), gamma (C,) -> s (M,C), y (M,C), rstd (M,)
             s = a + b                          (the residual stream, kept: the next residual add reads it)
             rstd_i = 1 / sqrt(sum_j s_ij^2 / C + eps);  y_ij = s_ij * rstd_i * gamma_j   (eps = 1e-5, as ch 7)

In a pre-norm transformer every residual add is followed by the next block's RMSNorm of its result
(x + attn(...) -> norm 2; x + mlp(...) -> the next layer's norm 1, or the final norm). Unfused, that is two
launches and the sum written by one kernel and read back by the next. Fused: one launch, a and b read once,
s and y written once. Cost: ~5 FLOPs per element; bytes 4 M C + C + M elements (read a, b; write s, y).
At decode (M = 1, C = 768) the bytes are ~12 KB, so the time is the launch and the latency of one block's
load -> reduce -> store chain, not bandwidth: fusing removes one of the two chains and one launch.

Ladder (add_rmsnorm)
  cpu/loop     rung 1  @njit, row by row: s and the sum of squares in one pass (float64 accumulator), then y
  gpu/smem     rung 1  one block per row, threads stride over it: s written and squared in one pass, a
                       shared-memory tree for the sum, then y from s (each thread re-reads only what it
                       wrote); runs in the simulator
  gpu/shfl     rung 2  the same with the sum done by warp shuffles (one barrier instead of log2 T + 1);
                       real GPU only
"""
import math

import numpy as np

from ..compiler import cuda, float32, njit, prange

from ..device import needs_real_gpu
from ..registry import define_op, exercise_op, register
from .norms import EPS, EPS32, _x, fwd_tol, rms_reference
from .reductions import ONE, ZERO, block_sum_shfl, block_sum_smem, row_jit, row_threads_streaming


# --------------------------------------------------------------------------------------- reference
def reference(a, b, gamma):
    """float64 oracle: s = a + b, then chapter 7's RMSNorm of s. Returns s, y, rstd."""
    s = a + b
    y, rstd = rms_reference(s, gamma)
    return s, y, rstd


def make_inputs(size, dtype, rng):
    """a: rows with their own offset and spread (as chapter 7's norms); b: a smaller update (an attention
    or MLP output added to the stream); gamma ~ 1 + 0.1 N(0,1)."""
    m, c = size
    a = _x(size, dtype, rng)
    b = (0.5 * rng.standard_normal((m, c))).astype(dtype)
    return a, b, (1 + 0.1 * rng.standard_normal(c)).astype(dtype)


def make_edge_inputs(size, dtype, rng):
    """Rows where a + b cancels to exactly 0 (y = 0, rstd = 1/sqrt(eps)), rows of spread 1e-3 (eps
    decides rstd), rows of magnitude 1e15 (squares 1e30, still finite in float32), and ordinary rows."""
    a, b, gamma = make_inputs(size, dtype, rng)
    m, c = size
    for i in range(m):
        k = i % 4
        if k == 0:
            b[i] = -a[i]
        elif k == 1:
            a[i] = (1e-3 * rng.standard_normal(c)).astype(dtype)
            b[i] = 0.0
        elif k == 2:
            a[i] = (1e15 * (3 + rng.standard_normal(c))).astype(dtype)
            b[i] = (1e14 * rng.standard_normal(c)).astype(dtype)
    return a, b, gamma


def tol(size, dtype):
    # y is O(1) as in chapter 7 (fwd_tol); s = a + b is one float32 rounding of values up to ~10, so it
    # meets the same bound: |s - s64| <= eps32 * |s| ~ 6e-7 * 10 < 1e-5
    return fwd_tol(size, dtype)


SIZES = {"check": [(1, 1), (1, 7), (3, 33), (1, 768), (2, 257), (5, 1000), (3, 4099), (1, 12289)],
         "check_sim": [(1, 1), (2, 7), (3, 33), (1, 70)],
         "bench": [(1, 768), (1, 4096), (1024, 4096)],
         "bench_gpu": [(1, 768), (1, 4096), (16384, 4096)],
         "bench_sim": [(2, 33)]}
define_op("add_rmsnorm", reference=reference, make_inputs=make_inputs, edge_inputs=make_edge_inputs, chapter=14,
          title="residual add + RMSNorm, fused", size_names=("M", "C"), kind="memory", tol=tol,
          output_names=("s", "y", "rstd"), sizes=SIZES,
          flops=lambda z: 5 * z[0] * z[1], bytes=lambda z, bb: (4 * z[0] * z[1] + z[1] + z[0]) * bb)


# --------------------------------------------------------------------------------------------- CPU
@njit(cache=True)
def add_rms_rows(s, y, rstd, a, b, gamma):
    c_n = a.shape[1]
    for i in range(a.shape[0]):
        q = 0.0  # float64 accumulator, as chapter 7's CPU rungs
        for j in range(c_n):
            v = a[i, j] + b[i, j]
            s[i, j] = v
            q += v * v
        r = 1.0 / np.sqrt(q / c_n + EPS)
        rstd[i] = r
        for j in range(c_n):
            y[i, j] = s[i, j] * r * gamma[j]


@register("add_rmsnorm", "cpu", "loop", rung=1)
def add_rmsnorm_loop(s, y, rstd, a, b, gamma):
    """Row by row: the sum and its squares in one pass, then y from s (hot in L1). One pass over a and b
    instead of the unfused pair's add pass plus a norm pass that reads s back."""
    add_rms_rows(s, y, rstd, a, b, gamma)


@njit(cache=True, parallel=True, fastmath={"reassoc", "contract", "arcp"})
def add_rms_prange(s, y, rstd, a, b, gamma):
    c_n = a.shape[1]
    for i in prange(a.shape[0]):  # rows over the cores; reassoc lets the float64 sum of squares vectorize
        q = 0.0
        for j in range(c_n):
            v = a[i, j] + b[i, j]
            s[i, j] = v
            q += v * v
        r = 1.0 / np.sqrt(q / c_n + EPS)
        rstd[i] = r
        for j in range(c_n):
            y[i, j] = s[i, j] * r * gamma[j]


@register("add_rmsnorm", "cpu", "prange", rung=2)
def add_rmsnorm_prange(s, y, rstd, a, b, gamma):
    """Rows over the cores (issue 36), and fastmath reassoc/contract/arcp (never nnan/ninf) so the sum of
    squares becomes packed adds: rung 1's strict float64 sum is a serial chain of dependent adds. 16 B per
    element at ~copy speed: predict >= 70 % of copy (rung 1 ~32 %)."""
    add_rms_prange(s, y, rstd, a, b, gamma)


# --------------------------------------------------------------------------------------------- GPU
def make_add_rms_kernel(threads, shuffle):
    nbuf = 32 if shuffle else threads

    @row_jit(threads)
    def add_rmsnorm_kernel(s, y, rstd, a, b, gamma):
        buf = cuda.shared.array(nbuf, float32)
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        n = a.shape[1]
        q = ZERO
        for c in range(tid, n, threads):  # read a and b once: write s, square it
            v = a[row, c] + b[row, c]
            s[row, c] = v
            q += v * v
        q = block_sum_shfl(q, buf) if shuffle else block_sum_smem(q, buf)
        r = ONE / math.sqrt(q / float32(n) + EPS32)
        if tid == 0:
            rstd[row] = r
        for c in range(tid, n, threads):  # the same columns as above: each thread reads back its own s
            y[row, c] = s[row, c] * r * gamma[c]

    return add_rmsnorm_kernel


_kernels: dict = {}


def kernel(threads, shuffle):
    key = (threads, shuffle)
    if key not in _kernels:
        _kernels[key] = make_add_rms_kernel(threads, shuffle)
    return _kernels[key]


SIG = ("void(float32[:, ::1], float32[:, ::1], float32[::1], float32[:, ::1], float32[:, ::1], "
       "float32[::1])")
PTX_THREADS = 256


def _threads(n):
    # 256 threads on a GPU (C = 768: 3 values each); in the simulator at most 32 (a power of two)
    return row_threads_streaming(n, PTX_THREADS)


def _launch(shuffle, s, y, rstd, a, b, gamma):
    m, n = a.shape
    if m == 0:
        return
    t = _threads(n)
    kernel(t, shuffle)[m, t](s, y, rstd, a, b, gamma)


@register("add_rmsnorm", "gpu", "smem", rung=1, ptx=[(kernel(PTX_THREADS, False), SIG)])
def add_rmsnorm_smem(s, y, rstd, a, b, gamma):
    """One block per row: a + b written as s and squared in the same pass, a shared-memory tree for the
    sum, y from s. Against the unfused pair (chapter 1's add, then chapter 7's RMSNorm) it saves a launch
    and the read of s by a second kernel: at decode (one row) predict the pair's time minus one launch
    (~1.5 us in a graph); at 16384 x 4096, 4 instead of 5 passes over M x C floats (~1.25x)."""
    _launch(False, s, y, rstd, a, b, gamma)


@register("add_rmsnorm", "gpu", "shfl", rung=2, ptx=[(kernel(PTX_THREADS, True), SIG)], requires=needs_real_gpu)
def add_rmsnorm_shfl(s, y, rstd, a, b, gamma):
    """Rung 1 with the block sum done by warp shuffles: one barrier instead of log2(256) + 2 = 10, which
    is most of a one-row kernel's critical path at decode. Predict ~1 us less than rung 1 there."""
    _launch(True, s, y, rstd, a, b, gamma)


# ---------------------------------------------------- predict, then measure (chapter 14's exercise)
def reference_step_prediction(bytes_k, launch_us, bw_gbs):
    """The model of a replayed decode step: each kernel costs at least its floor (``launch_us``: launch
    and one block's latency) and at least its bytes at ``bw_gbs`` GB/s; the step is their sum (a graph
    runs them back to back). Returns t (1,) in microseconds."""
    per = np.maximum(launch_us, np.asarray(bytes_k, np.float64) / (bw_gbs * 1e3))
    return np.array([per.sum()])


def make_inputs_step_prediction(size, dtype, rng):
    """bytes_k (k,): log-uniform from 1 KB to 100 MB (norms and adds to the LM head's GEMV); a floor of
    1-5 us; a bandwidth of 0.5-3 TB/s."""
    (k,) = size
    bytes_k = np.exp(rng.uniform(np.log(1e3), np.log(1e8), k)).astype(dtype)
    return bytes_k, float(rng.uniform(1.0, 5.0)), float(rng.uniform(500.0, 3000.0))


exercise_op("decode_step_prediction", reference=reference_step_prediction, make_inputs=make_inputs_step_prediction,
            sizes={"check": [(1,), (7,), (195,)], "check_sim": [(1,)], "bench": [(195,)]},
            flops=lambda z: 2 * z[0], bytes=lambda z, bb: z[0] * bb, kind="memory",
            # a sum of k positive terms; the bytes arrive in float32 and a float32 or float64 sum of up to a few
            # hundred terms is exact to ~k * 6e-8 relative: 1e-6 accepts any order of summation
            tol=(1e-5, 1e-6), size_names=("k",), title="a decode step's time from its kernels' bytes and floor",
            chapter=14, output_names=("t_us",))
