"""LayerNorm and RMSNorm over the last axis, forward and backward (chapter 7).

LayerNorm  x (M,N), gamma (N,), beta (N,) -> y (M,N), mean (M,), rstd (M,)
           mean_i = sum_j x_ij / N;  var_i = sum_j (x_ij - mean_i)^2 / N   (biased, as in PyTorch)
           rstd_i = 1 / sqrt(var_i + eps)                                   (eps INSIDE the square root)
           y_ij = (x_ij - mean_i) * rstd_i * gamma_j + beta_j
           backward: dy, x, mean, rstd, gamma -> dx (M,N), dgamma (N,), dbeta (N,)
RMSNorm    x (M,N), gamma (N,) -> y (M,N), rstd (M,)
           rstd_i = 1 / sqrt(sum_j x_ij^2 / N + eps);  y_ij = x_ij * rstd_i * gamma_j
           backward: dy, x, rstd, gamma -> dx (M,N), dgamma (N,)
eps = 1e-5 for both (EPS below). mean and rstd are saved by the forward for the backward, as PyTorch
and llm.c do.

Cost: forward ~7 (LayerNorm) / ~4 (RMSNorm) FLOPs per element; at least 2MN elements move (read x,
write y; gamma, beta, mean and rstd are O(M + N)). Memory-bound, judged against copy bandwidth.

Ladder (forward; RMSNorm has the same rungs)
  cpu/loop        rung 1   @njit, row by row: mean, then variance around it (two passes), then write
  cpu/prange      rung 2   rows split over cores
  gpu/row_smem    rung 1   one block per row, threads stride over it, shared-memory trees; x read 3x
  gpu/regs        rung 2   the row held in registers, one Welford merge: x read once (simulator path)
  gpu/regs_shfl   rung 3   rung 2 with warp-shuffle reductions, optionally several rows per block (real
                           GPU only); values per thread and rows per block were chosen by measurement
                           (PER_THREAD, ROWS below; book/data/bench/rowwise_explore_gpu.json)
  gpu/vec4        rung 4   the row in registers with 16-byte loads and stores (kernels_src.vec), mean and
                           variance as two plain sums over registers; shuffles on a GPU, shared-memory
                           trees in the simulator; rows of length % 4 != 0 use guarded scalar loads
  gpu/torch       baseline torch.native_layer_norm / rms_norm, then copied into our buffers; the
                           same-run torch-eager timing without the copy is in chapter 7's benchmark
Backward
  cpu/loop        rung 1   row by row, dgamma/dbeta accumulated across rows
  gpu/stream      rung 1   any row length: strips of rows per block, two walks per row, partial
                           dgamma/dbeta rows in global memory; the register rungs fall back to it
  gpu/regs        rung 2   kernel 1: blocks own every G-th row, compute dx and keep per-column partial
                           dgamma/dbeta in registers; kernel 2: sums the partials over the blocks
  gpu/regs_shfl   rung 3   rung 2 with warp-shuffle row sums and twice the blocks per SM (real GPU only)
  gpu/vec4        rung 4   strips of consecutive rows, one block per resident slot, 16-byte accesses,
                           the next row loaded before this one is reduced; a column-sum kernel after

Precision: variance is computed around the mean (two passes over values already in registers), never
as E[x^2] - E[x]^2, which cancels catastrophically when |mean| >> std. float32 kernels still overflow
when x^2 does (|x| > ~1.8e19); the reference, in float64, does not.
"""
import math

import numpy as np
from ..compiler import cuda, float32, load4, njit, prange, store4

from .. import device
from ..device import ceil_div, needs_real_gpu
from ..registry import EDGE_INPUTS
from ..registry import define_op, register
from .reductions import (FAST_MATH, row_jit, ONE, ZERO, torch_view, next_pow2, block_sum2_shfl, block_sum2_smem, block_sum_shfl,
                         block_sum_smem, block_welford_smem, row_config, row_threads_streaming, torch_gpu,
                         warp_sum, warp_welford)

EPS = 1e-5
EPS32 = np.float32(EPS)
THREADS = None  # block size of the register rungs (None: from the row length and PER_THREAD)
# Register-rung configuration, chosen by measurement (python -m kernels_src.figures.rowwise bench --explore
# --autotune on the GPU of book/data/bench/; see explore_gpu.json there): LayerNorm is fastest with 32
# values per thread (N = 4096: 128 threads), RMSNorm with 8 values per thread and 2 rows per block.
PER_THREAD = {"ln": 32, "rms": 8}  # target values per thread in the register rungs
ROWS = {"ln": 1, "rms": 2}  # rows per block in the real-GPU register rungs
ROWS_IN_SIM = False  # tests set this to exercise ROWS > 1 in the simulator


# --------------------------------------------------------------------------------------- references
def ln_reference(x, gamma, beta):
    """float64 oracle for LayerNorm: returns y, mean, rstd."""
    mean = x.mean(axis=-1)
    var = ((x - mean[:, None]) ** 2).mean(axis=-1)  # biased variance
    rstd = 1.0 / np.sqrt(var + EPS)  # eps inside the square root
    y = (x - mean[:, None]) * rstd[:, None] * gamma + beta
    return y, mean, rstd


def ln_bwd_reference(dy, x, mean, rstd, gamma):
    """float64 oracle for the LayerNorm backward: dx, dgamma, dbeta (mean, rstd as saved by forward)."""
    xhat = (x - mean[:, None]) * rstd[:, None]
    g = dy * gamma  # gradient with respect to xhat
    dx = rstd[:, None] * (g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def rms_reference(x, gamma):
    """float64 oracle for RMSNorm: returns y, rstd."""
    rstd = 1.0 / np.sqrt((x * x).mean(axis=-1) + EPS)
    return x * rstd[:, None] * gamma, rstd


def rms_bwd_reference(dy, x, rstd, gamma):
    """float64 oracle for the RMSNorm backward: dx, dgamma."""
    g = dy * gamma
    n = x.shape[-1]
    dx = rstd[:, None] * (g - x * (rstd ** 2)[:, None] * (g * x).sum(axis=-1, keepdims=True) / n)
    return dx, (dy * x * rstd[:, None]).sum(axis=0)


def _x(size, dtype, rng):
    """Rows with their own offset (in [-2, 2]) and spread (in [0.5, 2]), so mean and rstd vary by row."""
    m, n = size
    off = rng.uniform(-2, 2, (m, 1))
    scale = rng.uniform(0.5, 2, (m, 1))
    return (off + scale * rng.standard_normal((m, n))).astype(dtype)


def ln_make_inputs(size, dtype, rng):
    m, n = size
    x = _x(size, dtype, rng)
    gamma = (1 + 0.1 * rng.standard_normal(n)).astype(dtype)
    beta = (0.1 * rng.standard_normal(n)).astype(dtype)
    return x, gamma, beta


def rms_make_inputs(size, dtype, rng):
    m, n = size
    return _x(size, dtype, rng), (1 + 0.1 * rng.standard_normal(n)).astype(dtype)


def ln_bwd_make_inputs(size, dtype, rng):
    x, gamma, _ = ln_make_inputs(size, dtype, rng)
    _, mean, rstd = ln_reference(x.astype(np.float64), gamma.astype(np.float64), 0.0)
    dy = rng.standard_normal(x.shape).astype(dtype)
    return dy, x, mean.astype(dtype), rstd.astype(dtype), gamma


def rms_bwd_make_inputs(size, dtype, rng):
    x, gamma = rms_make_inputs(size, dtype, rng)
    _, rstd = rms_reference(x.astype(np.float64), gamma.astype(np.float64))
    dy = rng.standard_normal(x.shape).astype(dtype)
    return dy, x, rstd.astype(dtype), gamma


# ------------------------------------------------------------------------------------- edge inputs
EDGE_CASES = ("zero rows", "constant rows", "small variance", "huge magnitude", "length-1 rows")


def edge_x(case, size, dtype, rng):
    """x for one edge case: rows of zeros (variance 0: y = beta, rstd = 1/sqrt(eps)), constant rows
    (variance 0 again, any value), rows of spread 1e-3 (variance 1e-6 < eps: eps decides rstd), rows of
    magnitude 1e15 (squares 1e30, still finite in float32), or rows of length 1 (N is ignored)."""
    m, n = size
    if case == "zero rows":
        x = np.zeros((m, n))
    elif case == "constant rows":
        x = np.repeat(rng.uniform(-3, 3, (m, 1)), n, axis=1)
    elif case == "small variance":
        x = 1e-3 * rng.standard_normal((m, n))
    elif case == "huge magnitude":
        x = 1e15 * (3 + rng.standard_normal((m, n)))
    elif case == "length-1 rows":
        x = rng.standard_normal((m, 1))
    else:
        raise ValueError(case)
    return x.astype(dtype)


def edge_tol(case, x, gamma, dy=None):
    """Rows of variance 0 (constant rows, rows of length 1) have rstd = 1/sqrt(eps) ~ 316, which multiplies
    every rounding error of a term that cancels exactly in the reference: a float32 mean off by an ulp in
    y, or, in the backward, dy*gamma minus its own row mean (on the GPU the compiler fuses the product and
    the subtraction into one FMA, which keeps the product's rounding error instead of cancelling it). Allow
    a few ulps of those terms, times rstd, there (``dy``: the backward's upstream gradient); every other
    case uses the op's normal tolerance."""
    if case in ("constant rows", "length-1 rows"):
        amp = 1.0 / math.sqrt(EPS)
        scale = max(float(np.max(np.abs(x))), float(np.max(np.abs(dy))) if dy is not None else 0.0)
        return (1e-5, 1e-5 + amp * 4 * float(np.finfo(np.float32).eps) * scale * float(np.max(np.abs(gamma))))
    return (1e-5, 1e-5)


def edge_inputs(op_name, case, size, dtype, rng):
    """Inputs of ``op_name`` whose x is :func:`edge_x`'s."""
    x = edge_x(case, size, dtype, rng)
    n = x.shape[1]
    gamma = (1 + 0.1 * rng.standard_normal(n)).astype(dtype)
    if op_name == "layernorm":
        return x, gamma, (0.1 * rng.standard_normal(n)).astype(dtype)
    if op_name == "rmsnorm":
        return x, gamma
    dy = rng.standard_normal(x.shape).astype(dtype)
    if op_name == "layernorm_bwd":
        _, mean, rstd = ln_reference(x.astype(np.float64), gamma.astype(np.float64), 0.0)
        return dy, x, mean.astype(dtype), rstd.astype(dtype), gamma
    if op_name == "rmsnorm_bwd":
        _, rstd = rms_reference(x.astype(np.float64), gamma.astype(np.float64))
        return dy, x, rstd.astype(dtype), gamma
    raise ValueError(op_name)


def _mixed_edges(op_name):
    """For the grader (edge=True): rows cycling through zeros, spread 1e-3, magnitude 1e15 and ordinary
    rows, all in one input (the cases whose float32 answers are exact enough for the op's tolerance)."""
    def make(size, dtype, rng):
        m, n = size
        inputs = list(edge_inputs(op_name, "zero rows", size, dtype, rng))
        xi = 0 if op_name in ("layernorm", "rmsnorm") else 1
        x = _x(size, np.float64, rng)
        for i in range(m):
            k = i % 4
            if k == 0:
                x[i] = 0.0
            elif k == 1:
                x[i] = 1e-3 * rng.standard_normal(n)
            elif k == 2:
                x[i] = 1e15 * (3 + rng.standard_normal(n))
        x = x.astype(dtype)
        inputs[xi] = x
        gamma = inputs[-1] if op_name != "layernorm" else inputs[1]
        if op_name == "layernorm_bwd":
            _, mean, rstd = ln_reference(x.astype(np.float64), gamma.astype(np.float64), 0.0)
            inputs[2], inputs[3] = mean.astype(dtype), rstd.astype(dtype)
        elif op_name == "rmsnorm_bwd":
            _, rstd = rms_reference(x.astype(np.float64), gamma.astype(np.float64))
            inputs[2] = rstd.astype(dtype)
        return tuple(inputs)

    return make


for _op in ("layernorm", "rmsnorm", "layernorm_bwd", "rmsnorm_bwd"):
    EDGE_INPUTS[_op] = _mixed_edges(_op)


def fwd_tol(size, dtype):
    """y = (x - mean) * rstd * gamma + beta is O(1): each factor carries a few eps of relative error
    (the mean and variance are tree sums of N terms, error ~log2(N) eps), so absolute errors of a few
    1e-6 on values up to ~5; mean and rstd are compared with the same bound."""
    return (1e-5, 1e-5)


def bwd_tol(size, dtype):
    """dx is O(1) like y. dgamma and dbeta are sums over the M rows of O(1) terms: error ~sqrt(M) eps
    relative to their typical size sqrt(M), so the absolute allowance grows like sqrt(M)."""
    m = size[0]
    return (1e-5, 1e-5 * max(1.0, math.sqrt(m)))


SIZES = {"check": [(1, 1), (3, 7), (5, 33), (2, 257), (64, 1000), (17, 4099), (5, 4096), (3, 12289), (2, 40000)],
         "check_sim": [(1, 1), (3, 7), (5, 33), (3, 36), (2, 257)],
         "bench": [(1024, 1024), (4096, 4096)],
         "bench_gpu": [(16384, 4096)],
         "bench_sim": [(5, 33)]}
define_op("layernorm", reference=ln_reference, make_inputs=ln_make_inputs, chapter=7, title="LayerNorm forward",
          size_names=("M", "N"), kind="memory", tol=fwd_tol, output_names=("y", "mean", "rstd"), sizes=SIZES,
          flops=lambda s: 7 * s[0] * s[1], bytes=lambda s, b: (2 * s[0] * s[1] + 2 * s[1] + 2 * s[0]) * b)
define_op("rmsnorm", reference=rms_reference, make_inputs=rms_make_inputs, chapter=7, title="RMSNorm forward",
          size_names=("M", "N"), kind="memory", tol=fwd_tol, output_names=("y", "rstd"), sizes=SIZES,
          flops=lambda s: 4 * s[0] * s[1], bytes=lambda s, b: (2 * s[0] * s[1] + s[1] + s[0]) * b)
define_op("layernorm_bwd", reference=ln_bwd_reference, make_inputs=ln_bwd_make_inputs, chapter=7,
          title="LayerNorm backward", size_names=("M", "N"), kind="memory", tol=bwd_tol,
          output_names=("dx", "dgamma", "dbeta"), sizes=SIZES,
          flops=lambda s: 12 * s[0] * s[1], bytes=lambda s, b: (3 * s[0] * s[1] + 3 * s[1] + 2 * s[0]) * b)
define_op("rmsnorm_bwd", reference=rms_bwd_reference, make_inputs=rms_bwd_make_inputs, chapter=7,
          title="RMSNorm backward", size_names=("M", "N"), kind="memory", tol=bwd_tol,
          output_names=("dx", "dgamma"), sizes=SIZES,
          flops=lambda s: 9 * s[0] * s[1], bytes=lambda s, b: (3 * s[0] * s[1] + 2 * s[1] + s[0]) * b)


# --------------------------------------------------------------------------------------------- CPU
@njit(cache=True)
def _ln_row(y, mean, rstd, x, gamma, beta, i):
    n = x.shape[1]
    s = 0.0  # float64 accumulators: free on a CPU, and they make the row statistics exact enough
    for j in range(n):
        s += x[i, j]
    mu = s / n
    q = 0.0
    for j in range(n):
        d = x[i, j] - mu
        q += d * d
    r = 1.0 / np.sqrt(q / n + EPS)
    mean[i] = mu
    rstd[i] = r
    for j in range(n):
        y[i, j] = (x[i, j] - mu) * r * gamma[j] + beta[j]


@njit(cache=True)
def layernorm_rows(y, mean, rstd, x, gamma, beta):
    for i in range(x.shape[0]):
        _ln_row(y, mean, rstd, x, gamma, beta, i)


@njit(parallel=True, cache=True)
def layernorm_rows_prange(y, mean, rstd, x, gamma, beta):
    for i in prange(x.shape[0]):
        _ln_row(y, mean, rstd, x, gamma, beta, i)


@register("layernorm", "cpu", "loop", rung=1)
def layernorm_loop(y, mean, rstd, x, gamma, beta):
    """Row by row: sum for the mean, sum of squared deviations for the variance, then the write. Three
    passes over a row that sits in L1/L2 after the first, so DRAM sees x once."""
    layernorm_rows(y, mean, rstd, x, gamma, beta)


@register("layernorm", "cpu", "prange", rung=2)
def layernorm_prange(y, mean, rstd, x, gamma, beta):
    """Rows are independent: split them over the cores. Predict ~cores x until DRAM bandwidth binds."""
    layernorm_rows_prange(y, mean, rstd, x, gamma, beta)


@njit(cache=True)
def _rms_row(y, rstd, x, gamma, i):
    n = x.shape[1]
    q = 0.0
    for j in range(n):
        q += x[i, j] * x[i, j]
    r = 1.0 / np.sqrt(q / n + EPS)
    rstd[i] = r
    for j in range(n):
        y[i, j] = x[i, j] * r * gamma[j]


@njit(cache=True)
def rmsnorm_rows(y, rstd, x, gamma):
    for i in range(x.shape[0]):
        _rms_row(y, rstd, x, gamma, i)


@njit(parallel=True, cache=True)
def rmsnorm_rows_prange(y, rstd, x, gamma):
    for i in prange(x.shape[0]):
        _rms_row(y, rstd, x, gamma, i)


@register("rmsnorm", "cpu", "loop", rung=1)
def rmsnorm_loop(y, rstd, x, gamma):
    """Row by row: one sum of squares (no mean to subtract), then the write."""
    rmsnorm_rows(y, rstd, x, gamma)


@register("rmsnorm", "cpu", "prange", rung=2)
def rmsnorm_prange(y, rstd, x, gamma):
    """Rows split over the cores."""
    rmsnorm_rows_prange(y, rstd, x, gamma)


# Rung 3: the same row code, compiled so that the row sums may be reordered. A sum is a chain of dependent
# additions; IEEE arithmetic forbids the compiler to reorder it, so without permission each add waits for the
# previous one (~4 cycles) and the loop stays scalar. With "reassoc" the compiler keeps 4-16 partial sums in
# vector registers and adds them at the end (what NumPy's pairwise sum does by hand). The flags below never
# include "nnan"/"ninf": NaN and inf still propagate as the reference says.
REASSOC = {"reassoc", "contract", "arcp"}
# cache=False: Numba's on-disk cache names an entry by the Python function (file, name, line) and the argument
# types, not by the fastmath flags, so a cached copy of the same function would hand back rung 2's code here.
_ln_row_simd = njit(cache=False, fastmath=REASSOC)(_ln_row.py_func)
_rms_row_simd = njit(cache=False, fastmath=REASSOC)(_rms_row.py_func)


@njit(parallel=True, cache=True, fastmath=REASSOC)
def layernorm_rows_simd(y, mean, rstd, x, gamma, beta):
    for i in prange(x.shape[0]):
        _ln_row_simd(y, mean, rstd, x, gamma, beta, i)


@njit(parallel=True, cache=True, fastmath=REASSOC)
def rmsnorm_rows_simd(y, rstd, x, gamma):
    for i in prange(x.shape[0]):
        _rms_row_simd(y, rstd, x, gamma, i)


@register("layernorm", "cpu", "simd", rung=3)
def layernorm_simd(y, mean, rstd, x, gamma, beta):
    """Rung 2 with the row sums allowed to be reassociated (fastmath "reassoc"): the sums become SIMD (four
    float64 partial sums per 256-bit register instead of one chain of dependent adds), `kernels asm` shows
    packed adds where rung 2 has scalar ones. Predicted: the two reduction passes ~4x faster, so the row
    (3 passes) becomes memory-bound: >= 70 % of the copy bandwidth on 2 MN floats."""
    layernorm_rows_simd(y, mean, rstd, x, gamma, beta)


@register("rmsnorm", "cpu", "simd", rung=3)
def rmsnorm_simd(y, rstd, x, gamma):
    """Rung 2 with the sum of squares reassociated into SIMD partial sums. Predicted: memory-bound, >= 70 %
    of the copy bandwidth."""
    rmsnorm_rows_simd(y, rstd, x, gamma)


@njit(cache=True)
def layernorm_bwd_rows(dx, dgamma, dbeta, dy, x, mean, rstd, gamma):
    m, n = x.shape
    dgamma[:] = 0.0
    dbeta[:] = 0.0
    for i in range(m):
        mu = mean[i]
        r = rstd[i]
        sg = 0.0
        sgx = 0.0
        for j in range(n):  # pass 1: the two row sums the formula needs
            xhat = (x[i, j] - mu) * r
            g = dy[i, j] * gamma[j]
            sg += g
            sgx += g * xhat
        sg /= n
        sgx /= n
        for j in range(n):  # pass 2: dx, and this row's share of dgamma, dbeta
            xhat = (x[i, j] - mu) * r
            g = dy[i, j] * gamma[j]
            dx[i, j] = r * (g - sg - xhat * sgx)
            dgamma[j] += dy[i, j] * xhat
            dbeta[j] += dy[i, j]


@register("layernorm_bwd", "cpu", "loop", rung=1)
def layernorm_bwd_loop(dx, dgamma, dbeta, dy, x, mean, rstd, gamma):
    """Two passes per row (row sums, then dx) with dgamma/dbeta accumulated across rows. dgamma and dbeta
    are float32 sums over M rows: their error grows like sqrt(M) eps."""
    layernorm_bwd_rows(dx, dgamma, dbeta, dy, x, mean, rstd, gamma)


@njit(cache=True)
def rmsnorm_bwd_rows(dx, dgamma, dy, x, rstd, gamma):
    m, n = x.shape
    dgamma[:] = 0.0
    for i in range(m):
        r = rstd[i]
        sgx = 0.0
        for j in range(n):
            sgx += dy[i, j] * gamma[j] * x[i, j]
        c = r * r * sgx / n
        for j in range(n):
            dx[i, j] = r * (dy[i, j] * gamma[j] - x[i, j] * c)
            dgamma[j] += dy[i, j] * x[i, j] * r


@register("rmsnorm_bwd", "cpu", "loop", rung=1)
def rmsnorm_bwd_loop(dx, dgamma, dy, x, rstd, gamma):
    """One row sum (<dy*gamma, x>), then dx; dgamma accumulated across rows."""
    rmsnorm_bwd_rows(dx, dgamma, dy, x, rstd, gamma)


# The backward ops sum dgamma (and dbeta) over all M rows. In parallel, each of P chunks of rows keeps its
# own partial row of sums (P x N floats, a few KiB), and the partials are added at the end: no two threads
# ever write the same element, and the result does not depend on how the threads were scheduled.
@njit(parallel=True, cache=True, fastmath=REASSOC)
def layernorm_bwd_rows_prange(dx, dgamma, dbeta, dy, x, mean, rstd, gamma, parts):
    m, n = x.shape
    P = parts.shape[1]
    per = (m + P - 1) // P
    for p in prange(P):
        pg = parts[0, p]
        pb = parts[1, p]
        pg[:] = 0.0
        pb[:] = 0.0
        for i in range(p * per, min(m, (p + 1) * per)):
            mu = mean[i]
            r = rstd[i]
            sg = np.float32(0.0)
            sgx = np.float32(0.0)
            for j in range(n):
                xhat = (x[i, j] - mu) * r
                g = dy[i, j] * gamma[j]
                sg += g
                sgx += g * xhat
            sg /= n
            sgx /= n
            for j in range(n):
                xhat = (x[i, j] - mu) * r
                g = dy[i, j] * gamma[j]
                dx[i, j] = r * (g - sg - xhat * sgx)
                pg[j] += dy[i, j] * xhat
                pb[j] += dy[i, j]
    for j in range(n):
        a = np.float32(0.0)
        b = np.float32(0.0)
        for p in range(P):
            a += parts[0, p, j]
            b += parts[1, p, j]
        dgamma[j] = a
        dbeta[j] = b


@njit(parallel=True, cache=True, fastmath=REASSOC)
def rmsnorm_bwd_rows_prange(dx, dgamma, dy, x, rstd, gamma, parts):
    m, n = x.shape
    P = parts.shape[0]
    per = (m + P - 1) // P
    for p in prange(P):
        pg = parts[p]
        pg[:] = 0.0
        for i in range(p * per, min(m, (p + 1) * per)):
            r = rstd[i]
            sgx = np.float32(0.0)
            for j in range(n):
                sgx += dy[i, j] * gamma[j] * x[i, j]
            c = r * r * sgx / n
            for j in range(n):
                dx[i, j] = r * (dy[i, j] * gamma[j] - x[i, j] * c)
                pg[j] += dy[i, j] * x[i, j] * r
    for j in range(n):
        a = np.float32(0.0)
        for p in range(P):
            a += parts[p, j]
        dgamma[j] = a


def _chunks(m):
    from ..compiler import get_num_threads

    return max(1, min(m, get_num_threads()))


@register("layernorm_bwd", "cpu", "prange", rung=2)
def layernorm_bwd_prange(dx, dgamma, dbeta, dy, x, mean, rstd, gamma):
    """Rows split into one chunk per core, each chunk summing its own partial dgamma/dbeta row; the P
    partial rows are added at the end (P x N extra floats, ~P N / (M N) of the traffic). Float32 row sums,
    which the compiler can vectorize (the float64 sums of rung 1 need a conversion per element). Predicted:
    ~cores x rung 1 until the 3 MN floats of traffic meet the copy bandwidth."""
    layernorm_bwd_rows_prange(dx, dgamma, dbeta, dy, x, mean, rstd, gamma,
                              np.empty((2, _chunks(x.shape[0]), x.shape[1]), np.float32))


@register("rmsnorm_bwd", "cpu", "prange", rung=2)
def rmsnorm_bwd_prange(dx, dgamma, dy, x, rstd, gamma):
    """Rows split over the cores, each chunk with its own partial dgamma row, added at the end; the row sum
    reassociated into SIMD partial sums. Predicted: bounded by the copy bandwidth on 3 MN floats."""
    rmsnorm_bwd_rows_prange(dx, dgamma, dy, x, rstd, gamma, np.empty((_chunks(x.shape[0]), x.shape[1]), np.float32))


# -------------------------------------------------------------------- CPU yardsticks (ops/cpu_baselines.py)
def _np_ln(y, mean, rstd, x, gamma, beta):
    mu = x.mean(axis=1, keepdims=True)
    d = x - mu
    r = 1.0 / np.sqrt((d * d).mean(axis=1, keepdims=True) + EPS32)
    np.multiply(d * r, gamma, out=y)
    y += beta
    mean[:] = mu[:, 0]
    rstd[:] = r[:, 0]


@register("layernorm", "cpu", "numpy", baseline=True)
def layernorm_numpy(y, mean, rstd, x, gamma, beta):
    """The NumPy formula a student would write, in float32: mean, centred values, variance, then the scale."""
    _np_ln(y, mean, rstd, x, gamma, beta)


@register("rmsnorm", "cpu", "numpy", baseline=True)
def rmsnorm_numpy(y, rstd, x, gamma):
    """The NumPy formula in float32: rstd from the mean of squares, then x * rstd * gamma."""
    r = 1.0 / np.sqrt((x * x).mean(axis=1, keepdims=True) + EPS32)
    np.multiply(x * r, gamma, out=y)
    rstd[:] = r[:, 0]


@register("layernorm_bwd", "cpu", "numpy", baseline=True)
def layernorm_bwd_numpy(dx, dgamma, dbeta, dy, x, mean, rstd, gamma):
    """The NumPy formula in float32 (the reference's, without float64)."""
    xhat = (x - mean[:, None]) * rstd[:, None]
    g = dy * gamma
    dx[:] = rstd[:, None] * (g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True))
    dgamma[:] = (dy * xhat).sum(axis=0)
    dbeta[:] = dy.sum(axis=0)


@register("rmsnorm_bwd", "cpu", "numpy", baseline=True)
def rmsnorm_bwd_numpy(dx, dgamma, dy, x, rstd, gamma):
    """The NumPy formula in float32."""
    g = dy * gamma
    r = rstd[:, None]
    dx[:] = r * (g - x * (r * r) * (g * x).sum(axis=1, keepdims=True) / x.shape[1])
    dgamma[:] = (dy * x * r).sum(axis=0)


def _torch_cpu():
    from .cpu_baselines import torch_cpu

    return torch_cpu()


@register("layernorm", "cpu", "torch", baseline=True, requires=_torch_cpu)
def layernorm_torch_cpu(y, mean, rstd, x, gamma, beta):
    """torch's CPU LayerNorm (``aten.native_layer_norm``), writing y, mean and rstd in place (no copy)."""
    from .cpu_baselines import aten_out, tviews

    ty, tm, tr, tx, tg, tb = tviews(y, mean, rstd, x, gamma, beta)
    m = x.shape[0]
    aten_out("native_layer_norm", tx, [x.shape[1]], tg, tb, EPS, out=(ty, tm.view(m, 1), tr.view(m, 1)))


@register("rmsnorm", "cpu", "torch", baseline=True, requires=_torch_cpu)
def rmsnorm_torch_cpu(y, rstd, x, gamma):
    """torch's fused CPU RMSNorm (``aten._fused_rms_norm``, what ``F.rms_norm`` runs), which has no out=
    form: its y and rstd are copied into the outputs (one extra pass over y, counted in its time)."""
    import torch

    from .cpu_baselines import tviews

    ty, tr, tx, tg = tviews(y, rstd, x, gamma)
    yy, rr = torch.ops.aten._fused_rms_norm(tx, [x.shape[1]], tg, EPS)
    ty.copy_(yy)
    tr.copy_(rr.reshape(-1))


@register("layernorm_bwd", "cpu", "torch", baseline=True, requires=_torch_cpu)
def layernorm_bwd_torch_cpu(dx, dgamma, dbeta, dy, x, mean, rstd, gamma):
    """torch's CPU LayerNorm backward (``aten.native_layer_norm_backward``), written in place."""
    from .cpu_baselines import aten_out, tviews

    tdx, tdg, tdb, tdy, tx, tm, tr, tg = tviews(dx, dgamma, dbeta, dy, x, mean, rstd, gamma)
    m = x.shape[0]
    # the bias argument is only read for its shape (dbeta's); torch's CPU kernel refuses None there
    aten_out("native_layer_norm_backward", tdy, tx, [x.shape[1]], tm.view(m, 1), tr.view(m, 1), tg, tg,
             [True, True, True], out=(tdx, tdg, tdb))


@register("rmsnorm_bwd", "cpu", "torch", baseline=True, requires=_torch_cpu)
def rmsnorm_bwd_torch_cpu(dx, dgamma, dy, x, rstd, gamma):
    """What autograd runs for ``F.rms_norm`` on the CPU (torch has no fused CPU RMSNorm backward): the formula
    in torch's tensor ops, dx and dgamma written with out= where the last op allows it."""
    import torch

    from .cpu_baselines import tviews

    tdx, tdg, tdy, tx, tr, tg = tviews(dx, dgamma, dy, x, rstd, gamma)
    r = tr.view(-1, 1)
    g = tdy * tg
    c = (g * tx).sum(dim=1, keepdim=True) * (r * r) / x.shape[1]
    torch.mul(g - tx * c, r, out=tdx)
    torch.sum(tdy * tx * r, dim=0, out=tdg)


# ------------------------------------------------------------------------------ GPU: streaming rung
def make_ln_stream_kernel(threads):
    @row_jit(threads)
    def layernorm_stream_kernel(y, mean, rstd, x, gamma, beta):
        # x (M,N) -> y (M,N), mean (M,), rstd (M,): block = row, threads stride over its columns
        buf = cuda.shared.array(threads, float32)
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        n = x.shape[1]
        inv_n = ONE / float32(n)
        s = ZERO
        for c in range(tid, n, threads):  # read 1: the mean
            s += x[row, c]
        mu = block_sum_smem(s, buf) * inv_n
        q = ZERO
        for c in range(tid, n, threads):  # read 2: the variance around the mean
            d = x[row, c] - mu
            q += d * d
        r = ONE / math.sqrt(block_sum_smem(q, buf) * inv_n + EPS32)
        if tid == 0:
            mean[row] = mu
            rstd[row] = r
        for c in range(tid, n, threads):  # read 3: normalise and write
            y[row, c] = (x[row, c] - mu) * r * gamma[c] + beta[c]

    return layernorm_stream_kernel


def make_rms_stream_kernel(threads):
    @row_jit(threads)
    def rmsnorm_stream_kernel(y, rstd, x, gamma):
        buf = cuda.shared.array(threads, float32)
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        n = x.shape[1]
        q = ZERO
        for c in range(tid, n, threads):  # read 1: the sum of squares
            q += x[row, c] * x[row, c]
        r = ONE / math.sqrt(block_sum_smem(q, buf) / float32(n) + EPS32)
        if tid == 0:
            rstd[row] = r
        for c in range(tid, n, threads):  # read 2: scale and write
            y[row, c] = x[row, c] * r * gamma[c]

    return rmsnorm_stream_kernel


# ---------------------------------------------------------------------------- GPU: register rungs
def make_ln_regs_kernel(threads, items, shuffle, rows=1):
    """Thread t of a block holds x[i, t + k*threads], k < items, of each of its ``rows`` rows in
    registers (all compile-time constants, so every loop unrolls and nothing spills to local memory).
    Each thread summarises its values of a row as (count, mean, M2), and one block-wide Welford merge
    per row gives the row's mean and variance. With rows > 1 a block normalises several rows at once:
    more loads in flight per thread, and each gamma/beta value read once serves all of them."""
    nbuf = (32 if shuffle else threads) * rows
    nv = items * rows  # a compile-time constant, as cuda.local.array needs

    @row_jit(threads)
    def layernorm_regs_kernel(y, mean, rstd, x, gamma, beta):
        bn = cuda.shared.array(nbuf, float32)
        bm = cuda.shared.array(nbuf, float32)
        bq = cuda.shared.array(nbuf, float32)
        tid = cuda.threadIdx.x
        m = x.shape[0]
        n = x.shape[1]
        row0 = cuda.blockIdx.x * rows
        v = cuda.local.array(nv, float32)
        cnt = cuda.local.array(rows, float32)
        mu = cuda.local.array(rows, float32)
        q = cuda.local.array(rows, float32)
        full = n == threads * items
        for rr in range(rows):  # the only DRAM read: items * rows loads in flight per thread
            row = row0 + rr
            if full and row < m:  # the common case: no per-element bounds tests between the loads
                for k in range(items):
                    v[rr * items + k] = x[row, tid + k * threads]
                cnt[rr] = float32(items)
            else:
                cnt[rr] = ZERO
                for k in range(items):
                    c = tid + k * threads
                    if c < n and row < m:
                        v[rr * items + k] = x[row, c]
                        cnt[rr] += ONE
                    else:
                        v[rr * items + k] = ZERO
        for rr in range(rows):  # this thread's (count, mean, M2) per row, from registers
            s = ZERO
            for k in range(items):
                s += v[rr * items + k]
            mu[rr] = s / cnt[rr] if cnt[rr] > ZERO else ZERO
            qq = ZERO
            for k in range(items):
                ok = full or tid + k * threads < n
                d = v[rr * items + k] - mu[rr] if ok else ZERO
                qq += d * d
            q[rr] = qq
        if shuffle:  # per row: shuffles inside each warp, one value per warp to shared memory, ...
            lane = tid % 32
            w = tid // 32
            nw = (threads + 31) // 32
            for rr in range(rows):
                a, b, c = warp_welford(cnt[rr], mu[rr], q[rr])
                if lane == 0:
                    bn[rr * 32 + w] = a
                    bm[rr * 32 + w] = b
                    bq[rr * 32 + w] = c
            cuda.syncthreads()  # ... ONE barrier for all rows, then shuffles again
            for rr in range(rows):
                if lane < nw:
                    a, b, c = warp_welford(bn[rr * 32 + lane], bm[rr * 32 + lane], bq[rr * 32 + lane])
                else:
                    a, b, c = warp_welford(ZERO, ZERO, ZERO)
                mu[rr] = b
                q[rr] = c
        else:
            for rr in range(rows):
                a, b, c = block_welford_smem(cnt[rr], mu[rr], q[rr], bn, bm, bq)
                mu[rr] = b
                q[rr] = c
        for rr in range(rows):
            q[rr] = ONE / math.sqrt(q[rr] / float32(n) + EPS32)  # now rstd: eps inside the square root
            row = row0 + rr
            if tid == 0 and row < m:
                mean[row] = mu[rr]
                rstd[row] = q[rr]
        for k in range(items):  # gamma and beta are read here, from L1/L2, once for all rows
            c = tid + k * threads
            if full or c < n:
                g = gamma[c]
                b0 = beta[c]
                for rr in range(rows):
                    row = row0 + rr
                    if row < m:
                        y[row, c] = (v[rr * items + k] - mu[rr]) * q[rr] * g + b0

    return layernorm_regs_kernel


def make_rms_regs_kernel(threads, items, shuffle, rows=1):
    nbuf = (32 if shuffle else threads) * rows
    nv = items * rows

    @row_jit(threads)
    def rmsnorm_regs_kernel(y, rstd, x, gamma):
        b1 = cuda.shared.array(nbuf, float32)
        tid = cuda.threadIdx.x
        m = x.shape[0]
        n = x.shape[1]
        row0 = cuda.blockIdx.x * rows
        v = cuda.local.array(nv, float32)
        q = cuda.local.array(rows, float32)
        full = n == threads * items
        for rr in range(rows):
            row = row0 + rr
            if full and row < m:
                for k in range(items):
                    v[rr * items + k] = x[row, tid + k * threads]
            else:
                for k in range(items):
                    c = tid + k * threads
                    v[rr * items + k] = x[row, c] if (c < n and row < m) else ZERO
        for rr in range(rows):
            qq = ZERO
            for k in range(items):
                qq += v[rr * items + k] * v[rr * items + k]
            q[rr] = qq
        if shuffle:
            lane = tid % 32
            nw = (threads + 31) // 32
            for rr in range(rows):
                a = warp_sum(q[rr])
                if lane == 0:
                    b1[rr * 32 + tid // 32] = a
            cuda.syncthreads()
            for rr in range(rows):
                q[rr] = warp_sum(b1[rr * 32 + lane] if lane < nw else ZERO)
        else:
            for rr in range(rows):
                q[rr] = block_sum_smem(q[rr], b1)
        for rr in range(rows):
            q[rr] = ONE / math.sqrt(q[rr] / float32(n) + EPS32)
            row = row0 + rr
            if tid == 0 and row < m:
                rstd[row] = q[rr]
        for k in range(items):
            c = tid + k * threads
            if full or c < n:
                g = gamma[c]
                for rr in range(rows):
                    row = row0 + rr
                    if row < m:
                        y[row, c] = v[rr * items + k] * q[rr] * g

    return rmsnorm_regs_kernel


_kernels: dict = {}
_MAKERS = {"ln_stream": make_ln_stream_kernel, "rms_stream": make_rms_stream_kernel,
           "ln_regs": make_ln_regs_kernel, "rms_regs": make_rms_regs_kernel}


def kernel(kind, *cfg):
    key = (kind, *cfg)
    if key not in _kernels:
        _kernels[key] = _MAKERS[kind](*cfg)
    return _kernels[key]


SIG_LN = "void(float32[:, ::1], float32[::1], float32[::1], float32[:, ::1], float32[::1], float32[::1])"
SIG_RMS = "void(float32[:, ::1], float32[::1], float32[:, ::1], float32[::1])"
PTX_STREAM = 256


def _num_sms() -> int:
    return cuda.get_current_device().MULTIPROCESSOR_COUNT


def _regs_launch(kind, stream_kind, shuffle, out_args, x, in_args):
    m, n = x.shape
    fam = kind.split("_")[0]
    cfg = row_config(n, THREADS, PER_THREAD[fam])
    if cfg is None:  # a row too long for registers: stream it
        t = row_threads_streaming(n)
        return kernel(stream_kind, t)[m, t](*out_args, x, *in_args)
    t, e = cfg
    rows = ROWS[fam] if (shuffle or (device.SIMULATED and ROWS_IN_SIM)) else 1
    kernel(kind, t, e, shuffle, rows)[ceil_div(m, rows), t](*out_args, x, *in_args)


@register("layernorm", "gpu", "row_smem", rung=1, ptx=[(kernel("ln_stream", PTX_STREAM), SIG_LN)])
def layernorm_row_smem(y, mean, rstd, x, gamma, beta):
    """One block per row; threads stride over it; shared-memory trees for the mean and the variance.
    x is read three times (mean, variance, write): the second and third reads hit L2 only if the
    row is still there, so predict 50-70 % of copy bandwidth."""
    t = row_threads_streaming(x.shape[1])
    kernel("ln_stream", t)[x.shape[0], t](y, mean, rstd, x, gamma, beta)


@register("layernorm", "gpu", "regs", rung=2, ptx=[(kernel("ln_regs", 128, 32, False, 1), SIG_LN)])
def layernorm_regs(y, mean, rstd, x, gamma, beta):
    """The row is loaded into registers once (128 threads x 32 values at N = 4096, the measured best);
    each thread reduces its values to (count, mean, M2) and one Welford merge over the block gives mean
    and variance, so DRAM sees x once and y once. The merge is a shared-memory tree of 7 barriers:
    predict ~80 % of copy bandwidth. This is also the simulator's version of rung 3."""
    _regs_launch("ln_regs", "ln_stream", False, (y, mean, rstd), x, (gamma, beta))


@register("layernorm", "gpu", "regs_shfl", rung=3, ptx=[(kernel("ln_regs", 128, 32, True, 1), SIG_LN)],
          requires=needs_real_gpu)
def layernorm_regs_shfl(y, mean, rstd, x, gamma, beta):
    """Rung 2 with the Welford merge done by warp shuffles: one barrier per row instead of 8. Predict
    >= 85 % of copy bandwidth at 16384 x 4096."""
    _regs_launch("ln_regs", "ln_stream", True, (y, mean, rstd), x, (gamma, beta))


@register("rmsnorm", "gpu", "row_smem", rung=1, ptx=[(kernel("rms_stream", PTX_STREAM), SIG_RMS)])
def rmsnorm_row_smem(y, rstd, x, gamma):
    """One block per row, threads stride over it: sum of squares, then the write. x read twice."""
    t = row_threads_streaming(x.shape[1])
    kernel("rms_stream", t)[x.shape[0], t](y, rstd, x, gamma)


@register("rmsnorm", "gpu", "regs", rung=2, ptx=[(kernel("rms_regs", 512, 8, False, 1), SIG_RMS)])
def rmsnorm_regs(y, rstd, x, gamma):
    """Row in registers, one shared-memory tree: x read once. The simulator's version of rung 3."""
    _regs_launch("rms_regs", "rms_stream", False, (y, rstd), x, (gamma,))


@register("rmsnorm", "gpu", "regs_shfl", rung=3, ptx=[(kernel("rms_regs", 512, 8, True, 2), SIG_RMS)],
          requires=needs_real_gpu)
def rmsnorm_regs_shfl(y, rstd, x, gamma):
    """Row in registers, warp-shuffle reduction, and two rows per block (512 threads x 8 values each at
    N = 4096, the measured best): each gamma value loaded serves two rows. Predict >= 85 % of copy
    bandwidth at 16384 x 4096."""
    _regs_launch("rms_regs", "rms_stream", True, (y, rstd), x, (gamma,))


# ------------------------------------------------------------------- GPU: 16-byte rungs (forward)
# Thread t of a block holds float4 groups t, t + T, t + 2T, ... of its row: a warp's load instruction
# asks for 512 contiguous bytes (ld.global.v4.f32), a quarter of the instructions of the scalar rungs.
VEC_PER_THREAD = {"ln": 16, "rms": 16}  # target values per thread (N = 4096: 256 threads x 4 float4 groups)
VEC_ROWS = {"ln": 1, "rms": 1}  # rows per block
VEC_MAX_GROUPS = 8  # at most 32 values of a row per thread; longer rows stream


def apply_tuning(path=None):
    """Override the tuning constants of the 16-byte rungs (VEC_PER_THREAD, VEC_ROWS, BWD_VEC_PER_THREAD)
    from a JSON file, {"VEC_PER_THREAD": {"ln": 16}, ...}, named by ``path`` or the environment variable
    KERNELS_NORMS_TUNING. A GPU run that times the candidates first writes such a file, so the benchmark
    after it uses the fastest; the committed defaults are what that run chose."""
    import json
    import os

    path = path or os.environ.get("KERNELS_NORMS_TUNING")
    if not path:
        return {}
    with open(path) as f:
        cfg = json.load(f)
    for name in ("VEC_PER_THREAD", "VEC_ROWS", "BWD_VEC_PER_THREAD"):
        globals()[name].update(cfg.get(name, {}))
    return cfg


def vec_config(n, per_thread):
    """(T, groups) of the 16-byte rungs for a row of n elements, or None when it does not fit registers.
    GPU: T = n/per_thread rounded up to a power of two in [32, 1024]; groups = ceil(n/4/T) float4 groups
    per thread. Simulator: T <= 32 (one Python thread per CUDA thread)."""
    g4 = ceil_div(n, 4)
    if device.SIMULATED:
        t = min(32, next_pow2(g4))
        return t, ceil_div(g4, t)
    t = min(1024, max(32, next_pow2(ceil_div(n, per_thread))))
    groups = ceil_div(g4, t)
    return (t, groups) if groups <= VEC_MAX_GROUPS else None


def _aligned16(*arrays) -> bool:
    """True when every array's data starts on a 16-byte boundary (load4/store4 need it)."""
    if device.SIMULATED:
        return True
    for a in arrays:
        cai = getattr(a, "__cuda_array_interface__", None)
        if cai is None or cai["data"][0] % 16:
            return False
    return True


def make_ln_vec_kernel(threads, groups, aligned, shuffle, rows=1):
    """LayerNorm with 16-byte loads and stores. ``aligned`` (compile time): N % 4 == 0 and every array
    16-byte aligned, so group j of row i is x.flat[4(i*N/4 + j) ...] and load4 applies; otherwise the same
    layout with four guarded scalar loads. The statistics are two plain sums over registers (the mean,
    then the squared deviations from it), each one warp-shuffle reduction and one barrier on a GPU."""
    ne = 4 * groups
    nv = ne * rows
    nb = 32 * rows if shuffle else threads

    @row_jit(threads)
    def layernorm_vec_kernel(y, mean, rstd, x, gamma, beta):
        b1 = cuda.shared.array(nb, float32)
        b2 = cuda.shared.array(nb, float32)
        tid = cuda.threadIdx.x
        m = x.shape[0]
        n = x.shape[1]
        n4 = n // 4
        inv_n = ONE / float32(n)
        row0 = cuda.blockIdx.x * rows
        v = cuda.local.array(nv, float32)
        mu = cuda.local.array(rows, float32)
        q = cuda.local.array(rows, float32)
        for rr in range(rows):  # the only DRAM read of x
            row = row0 + rr
            for k in range(groups):
                j = tid + k * threads
                o = rr * ne + 4 * k
                if aligned:
                    if j < n4 and row < m:
                        a0, a1, a2, a3 = load4(x, row * n4 + j)
                    else:
                        a0, a1, a2, a3 = ZERO, ZERO, ZERO, ZERO
                    v[o] = a0
                    v[o + 1] = a1
                    v[o + 2] = a2
                    v[o + 3] = a3
                else:
                    for i in range(4):
                        c = 4 * j + i
                        v[o + i] = x[row, c] if (c < n and row < m) else ZERO
        for rr in range(rows):  # pass 1 over registers: the sum (out-of-row slots hold 0)
            s = ZERO
            for e in range(ne):
                s += v[rr * ne + e]
            mu[rr] = s
        if shuffle:
            lane = tid % 32
            w = tid // 32
            nw = (threads + 31) // 32
            for rr in range(rows):
                a = warp_sum(mu[rr])
                if lane == 0:
                    b1[rr * 32 + w] = a
            cuda.syncthreads()
            for rr in range(rows):
                mu[rr] = warp_sum(b1[rr * 32 + lane] if lane < nw else ZERO) * inv_n
        else:
            for rr in range(rows):
                mu[rr] = block_sum_smem(mu[rr], b1) * inv_n
        for rr in range(rows):  # pass 2 over registers: squared deviations from the mean
            qq = ZERO
            for k in range(groups):
                for i in range(4):
                    c = 4 * (tid + k * threads) + i
                    if c < n:
                        d = v[rr * ne + 4 * k + i] - mu[rr]
                        qq += d * d
            q[rr] = qq
        if shuffle:
            lane = tid % 32
            w = tid // 32
            nw = (threads + 31) // 32
            for rr in range(rows):
                a = warp_sum(q[rr])
                if lane == 0:
                    b2[rr * 32 + w] = a
            cuda.syncthreads()
            for rr in range(rows):
                q[rr] = warp_sum(b2[rr * 32 + lane] if lane < nw else ZERO)
        else:
            for rr in range(rows):
                q[rr] = block_sum_smem(q[rr], b2)
        for rr in range(rows):
            q[rr] = ONE / math.sqrt(q[rr] * inv_n + EPS32)  # now rstd
            row = row0 + rr
            if tid == 0 and row < m:
                mean[row] = mu[rr]
                rstd[row] = q[rr]
        for k in range(groups):  # gamma, beta: one 16-byte load each per group, shared by the block's rows
            j = tid + k * threads
            if aligned:
                if j < n4:
                    g0, g1, g2, g3 = load4(gamma, j)
                    c0, c1, c2, c3 = load4(beta, j)
                    for rr in range(rows):
                        row = row0 + rr
                        if row < m:
                            o = rr * ne + 4 * k
                            r = q[rr]
                            u = mu[rr]
                            store4(y, row * n4 + j, (v[o] - u) * r * g0 + c0, (v[o + 1] - u) * r * g1 + c1,
                                   (v[o + 2] - u) * r * g2 + c2, (v[o + 3] - u) * r * g3 + c3)
            else:
                for i in range(4):
                    c = 4 * j + i
                    if c < n:
                        g = gamma[c]
                        b0 = beta[c]
                        for rr in range(rows):
                            row = row0 + rr
                            if row < m:
                                y[row, c] = (v[rr * ne + 4 * k + i] - mu[rr]) * q[rr] * g + b0

    return layernorm_vec_kernel


def make_rms_vec_kernel(threads, groups, aligned, shuffle, rows=1):
    """RMSNorm with 16-byte loads and stores: one sum of squares per row (one barrier on a GPU)."""
    ne = 4 * groups
    nv = ne * rows
    nb = 32 * rows if shuffle else threads

    @row_jit(threads)
    def rmsnorm_vec_kernel(y, rstd, x, gamma):
        b1 = cuda.shared.array(nb, float32)
        tid = cuda.threadIdx.x
        m = x.shape[0]
        n = x.shape[1]
        n4 = n // 4
        inv_n = ONE / float32(n)
        row0 = cuda.blockIdx.x * rows
        v = cuda.local.array(nv, float32)
        q = cuda.local.array(rows, float32)
        for rr in range(rows):
            row = row0 + rr
            for k in range(groups):
                j = tid + k * threads
                o = rr * ne + 4 * k
                if aligned:
                    if j < n4 and row < m:
                        a0, a1, a2, a3 = load4(x, row * n4 + j)
                    else:
                        a0, a1, a2, a3 = ZERO, ZERO, ZERO, ZERO
                    v[o] = a0
                    v[o + 1] = a1
                    v[o + 2] = a2
                    v[o + 3] = a3
                else:
                    for i in range(4):
                        c = 4 * j + i
                        v[o + i] = x[row, c] if (c < n and row < m) else ZERO
        for rr in range(rows):
            qq = ZERO
            for e in range(ne):
                qq += v[rr * ne + e] * v[rr * ne + e]
            q[rr] = qq
        if shuffle:
            lane = tid % 32
            w = tid // 32
            nw = (threads + 31) // 32
            for rr in range(rows):
                a = warp_sum(q[rr])
                if lane == 0:
                    b1[rr * 32 + w] = a
            cuda.syncthreads()
            for rr in range(rows):
                q[rr] = warp_sum(b1[rr * 32 + lane] if lane < nw else ZERO)
        else:
            for rr in range(rows):
                q[rr] = block_sum_smem(q[rr], b1)
        for rr in range(rows):
            q[rr] = ONE / math.sqrt(q[rr] * inv_n + EPS32)
            row = row0 + rr
            if tid == 0 and row < m:
                rstd[row] = q[rr]
        for k in range(groups):
            j = tid + k * threads
            if aligned:
                if j < n4:
                    g0, g1, g2, g3 = load4(gamma, j)
                    for rr in range(rows):
                        row = row0 + rr
                        if row < m:
                            o = rr * ne + 4 * k
                            r = q[rr]
                            store4(y, row * n4 + j, v[o] * r * g0, v[o + 1] * r * g1, v[o + 2] * r * g2,
                                   v[o + 3] * r * g3)
            else:
                for i in range(4):
                    c = 4 * j + i
                    if c < n:
                        g = gamma[c]
                        for rr in range(rows):
                            row = row0 + rr
                            if row < m:
                                y[row, c] = v[rr * ne + 4 * k + i] * q[rr] * g

    return rmsnorm_vec_kernel


_MAKERS.update({"ln_vec": make_ln_vec_kernel, "rms_vec": make_rms_vec_kernel})


def _vec_launch(fam, out_args, x, in_args, fallback):
    m, n = x.shape
    cfg = vec_config(n, VEC_PER_THREAD[fam])
    if cfg is None:  # a row too long for registers: the scalar register rung streams it
        return fallback()
    t, groups = cfg
    aligned = n % 4 == 0 and _aligned16(*out_args[:1], x, *in_args)
    shuffle = not device.SIMULATED
    rows = VEC_ROWS[fam] if (shuffle or ROWS_IN_SIM) else 1
    kernel(f"{fam}_vec", t, groups, aligned, shuffle, rows)[ceil_div(m, rows), t](*out_args, x, *in_args)


@register("layernorm", "gpu", "vec4", rung=4, ptx=[(kernel("ln_vec", 256, 4, True, True, 1), SIG_LN)])
def layernorm_vec4(y, mean, rstd, x, gamma, beta):
    """16-byte loads and stores (256 threads x 4 float4 groups at N = 4096), a two-pass mean and
    variance over registers with two shuffle reductions, and gamma/beta read as float4 too. Predict:
    about 97 % of copy at 16384 x 4096, most of the way to the compiled PyTorch baseline, with a quarter
    of the load/store instructions of `regs` (Triton makes the same 16-byte accesses). In the simulator it runs with shared-memory trees."""
    _vec_launch("ln", (y, mean, rstd), x, (gamma, beta),
                lambda: _regs_launch("ln_regs", "ln_stream", not device.SIMULATED, (y, mean, rstd), x, (gamma, beta)))


@register("rmsnorm", "gpu", "vec4", rung=4, ptx=[(kernel("rms_vec", 256, 4, True, True, 1), SIG_RMS)])
def rmsnorm_vec4(y, rstd, x, gamma):
    """16-byte loads and stores and one shuffle reduction per row. Predict: about 97 % of copy at
    16384 x 4096, level with the compiled PyTorch baseline."""
    _vec_launch("rms", (y, rstd), x, (gamma,),
                lambda: _regs_launch("rms_regs", "rms_stream", not device.SIMULATED, (y, rstd), x, (gamma,)))


@register("layernorm", "gpu", "torch", baseline=True, requires=torch_gpu)
def layernorm_torch(y, mean, rstd, x, gamma, beta):
    """torch.native_layer_norm, then copied into our y, mean, rstd (torch has no out= for it). The
    copy costs about as much as the norm itself; the fair torch time is `eager_layernorm`'s."""
    import torch

    yt, mt, rt = torch.native_layer_norm(torch_view(x), (x.shape[1],), torch_view(gamma), torch_view(beta), EPS)
    torch_view(y).copy_(yt)
    torch_view(mean).copy_(mt.view(-1))
    torch_view(rstd).copy_(rt.view(-1))


@register("rmsnorm", "gpu", "torch", baseline=True, requires=torch_gpu)
def rmsnorm_torch(y, rstd, x, gamma):
    """torch.nn.functional.rms_norm, copied into our y; rstd computed with two more torch ops."""
    import torch

    xt = torch_view(x)
    torch_view(y).copy_(torch.nn.functional.rms_norm(xt, (x.shape[1],), torch_view(gamma), EPS))
    torch_view(rstd).copy_(torch.rsqrt(xt.pow(2).mean(-1) + EPS))


def eager_layernorm(x, gamma, beta):
    """torch eager as a user calls it (allocates y): the fair same-run yardstick."""
    import torch

    return torch.nn.functional.layer_norm(x, (x.shape[1],), gamma, beta, EPS)


def eager_rmsnorm(x, gamma):
    import torch

    return torch.nn.functional.rms_norm(x, (x.shape[1],), gamma, EPS)


def eager_bwd(kind: str):
    """torch's backward as a user gets it: ``torch.autograd.grad`` through ``F.layer_norm`` (``kind`` =
    "layernorm") or ``F.rms_norm``, allocating dx, dgamma (and dbeta). The forward runs once per input set
    (graph kept), so each call times only the backward kernels autograd launches. Called with the inputs of
    layernorm_bwd (dy, x, mean, rstd, gamma) or rmsnorm_bwd (dy, x, rstd, gamma)."""
    import torch

    F = torch.nn.functional
    graphs = {}

    def run(dy, x, *rest):
        key = (dy.data_ptr(), x.data_ptr())
        if key not in graphs:
            xs = x.detach().clone().requires_grad_(True)
            g = rest[-1].detach().clone().requires_grad_(True)
            if kind == "layernorm":
                b = torch.zeros_like(g, requires_grad=True)
                graphs[key] = (F.layer_norm(xs, (x.shape[1],), g, b, EPS), (xs, g, b))
            else:
                graphs[key] = (F.rms_norm(xs, (x.shape[1],), g, EPS), (xs, g))
        y, leaves = graphs[key]
        return torch.autograd.grad(y, leaves, dy, retain_graph=True)

    return run


# ---------------------------------------------------------------------------------- GPU: backward
def make_ln_bwd_kernel(threads, items, shuffle=False):
    nbuf = 32 if shuffle else threads

    @row_jit(threads)
    def layernorm_bwd_kernel(dx, pg, pb, dy, x, mean, rstd, gamma):
        # dy, x (M,N), mean, rstd (M,), gamma (N,) -> dx (M,N); pg, pb (gridDim.x, N): this block's
        # partial dgamma, dbeta over the rows it handled (rows blockIdx.x, + gridDim.x, ...)
        b1 = cuda.shared.array(nbuf, float32)
        b2 = cuda.shared.array(nbuf, float32)
        tid = cuda.threadIdx.x
        m = x.shape[0]
        n = x.shape[1]
        inv_n = ONE / float32(n)
        xh = cuda.local.array(items, float32)
        gg = cuda.local.array(items, float32)
        acc_g = cuda.local.array(items, float32)
        acc_b = cuda.local.array(items, float32)
        for k in range(items):
            acc_g[k] = ZERO
            acc_b[k] = ZERO
        row = cuda.blockIdx.x
        while row < m:
            mu = mean[row]
            r = rstd[row]
            sg = ZERO
            sgx = ZERO
            for k in range(items):
                c = tid + k * threads
                if c < n:
                    d = dy[row, c]
                    xhat = (x[row, c] - mu) * r
                    g = d * gamma[c]
                    acc_g[k] += d * xhat
                    acc_b[k] += d
                else:
                    xhat = ZERO
                    g = ZERO
                xh[k] = xhat
                gg[k] = g
                sg += g
                sgx += g * xhat
            if shuffle:  # both row sums in one reduction (one barrier)
                sg, sgx = block_sum2_shfl(sg, sgx, b1, b2)
                cuda.syncthreads()  # b1, b2 are reused by the next row
            else:
                sg, sgx = block_sum2_smem(sg, sgx, b1, b2)
            sg *= inv_n
            sgx *= inv_n
            for k in range(items):
                c = tid + k * threads
                if c < n:
                    dx[row, c] = r * (gg[k] - sg - xh[k] * sgx)
            row += cuda.gridDim.x
        for k in range(items):
            c = tid + k * threads
            if c < n:
                pg[cuda.blockIdx.x, c] = acc_g[k]
                pb[cuda.blockIdx.x, c] = acc_b[k]

    return layernorm_bwd_kernel


def make_rms_bwd_kernel(threads, items, shuffle=False):
    nbuf = 32 if shuffle else threads

    @row_jit(threads)
    def rmsnorm_bwd_kernel(dx, pg, dy, x, rstd, gamma):
        b1 = cuda.shared.array(nbuf, float32)
        tid = cuda.threadIdx.x
        m = x.shape[0]
        n = x.shape[1]
        inv_n = ONE / float32(n)
        xv = cuda.local.array(items, float32)
        gg = cuda.local.array(items, float32)
        acc_g = cuda.local.array(items, float32)
        for k in range(items):
            acc_g[k] = ZERO
        row = cuda.blockIdx.x
        while row < m:
            r = rstd[row]
            sgx = ZERO
            for k in range(items):
                c = tid + k * threads
                if c < n:
                    d = dy[row, c]
                    xx = x[row, c]
                    g = d * gamma[c]
                    acc_g[k] += d * xx * r
                else:
                    xx = ZERO
                    g = ZERO
                xv[k] = xx
                gg[k] = g
                sgx += g * xx
            if shuffle:
                tot = block_sum_shfl(sgx, b1)
                cuda.syncthreads()  # b1 is reused by the next row
            else:
                tot = block_sum_smem(sgx, b1)
            coef = r * r * tot * inv_n
            for k in range(items):
                c = tid + k * threads
                if c < n:
                    dx[row, c] = r * (gg[k] - xv[k] * coef)
            row += cuda.gridDim.x
        for k in range(items):
            c = tid + k * threads
            if c < n:
                pg[cuda.blockIdx.x, c] = acc_g[k]

    return rmsnorm_bwd_kernel


@cuda.jit
def column_sum_kernel(out, part):
    # part (G,N) -> out (N,): thread per column, a loop down the G partial rows (coalesced across threads)
    c = cuda.grid(1)
    if c < out.size:
        s = ZERO
        for i in range(part.shape[0]):
            s += part[i, c]
        out[c] = s


_bwd_kernels: dict = {}


def _bwd_kernel(kind, t, e, shuffle=False):
    key = (kind, t, e, shuffle)
    if key not in _bwd_kernels:
        _bwd_kernels[key] = (make_ln_bwd_kernel if kind == "ln" else make_rms_bwd_kernel)(t, e, shuffle)
    return _bwd_kernels[key]


_scratch: dict = {}


def _partials(g, n, which):
    key = (g, n, which)
    if key not in _scratch:
        _scratch[key] = cuda.device_array((g, n), dtype=np.float32)
    return _scratch[key]


BWD_BLOCKS_PER_SM = {False: 2, True: 4}  # rung 1, rung 2


BWD_MAX_THREADS = 256  # 4 register arrays per thread: more threads would not fit the register file
BWD_MAX_ITEMS = 64


def _bwd_config(m, n, shuffle):
    if device.SIMULATED:
        cfg = row_config(n)
    else:
        t = min(BWD_MAX_THREADS, max(32, next_pow2(ceil_div(n, 8))))
        e = next_pow2(ceil_div(n, t))
        cfg = (t, e) if e <= BWD_MAX_ITEMS else None
    if cfg is None or (BWD_REG_MAX_N is not None and n > BWD_REG_MAX_N):
        return None  # the caller hands the row to the streaming kernel, which takes any length
    g = min(m, 4 if device.SIMULATED else BWD_BLOCKS_PER_SM[shuffle] * _num_sms())  # each owns every g-th row
    return cfg[0], cfg[1], g


SIG_LN_BWD = ("void(float32[:, ::1], float32[:, ::1], float32[:, ::1], float32[:, ::1], float32[:, ::1], "
              "float32[::1], float32[::1], float32[::1])")
SIG_RMS_BWD = ("void(float32[:, ::1], float32[:, ::1], float32[:, ::1], float32[:, ::1], float32[::1], "
               "float32[::1])")
SIG_COLSUM = "void(float32[::1], float32[:, ::1])"


def _ln_bwd(shuffle, dx, dgamma, dbeta, dy, x, mean, rstd, gamma):
    m, n = x.shape
    cfg = _bwd_config(m, n, shuffle)
    if cfg is None:
        return _bwd_stream("ln", (dgamma, dbeta), dx, dy, x, (mean, rstd, gamma))
    t, e, g = cfg
    pg, pb = _partials(g, n, "g"), _partials(g, n, "b")
    _bwd_kernel("ln", t, e, shuffle)[g, t](dx, pg, pb, dy, x, mean, rstd, gamma)
    tc = 32 if device.SIMULATED else 256
    column_sum_kernel[ceil_div(n, tc), tc](dgamma, pg)
    column_sum_kernel[ceil_div(n, tc), tc](dbeta, pb)


def _rms_bwd(shuffle, dx, dgamma, dy, x, rstd, gamma):
    m, n = x.shape
    cfg = _bwd_config(m, n, shuffle)
    if cfg is None:
        return _bwd_stream("rms", (dgamma,), dx, dy, x, (rstd, gamma))
    t, e, g = cfg
    pg = _partials(g, n, "g")
    _bwd_kernel("rms", t, e, shuffle)[g, t](dx, pg, dy, x, rstd, gamma)
    tc = 32 if device.SIMULATED else 256
    column_sum_kernel[ceil_div(n, tc), tc](dgamma, pg)


@register("layernorm_bwd", "gpu", "regs", rung=2,
          ptx=[(_bwd_kernel("ln", 256, 16), SIG_LN_BWD), (column_sum_kernel, SIG_COLSUM)])
def layernorm_bwd_gpu(dx, dgamma, dbeta, dy, x, mean, rstd, gamma):
    """Kernel 1: 2 x SMs blocks, each taking every G-th row: one shared-memory tree for the two row sums
    gives dx, and each thread keeps its columns' partial dgamma, dbeta in registers across the rows,
    writing them once. Kernel 2: one thread per column sums the G partials. No atomics, so the result
    is deterministic. Reads dy, x once and writes dx once; but each block walks its rows one after the
    other, waiting at every barrier, with only 2 blocks per SM to cover the wait: predict well under
    half of copy bandwidth."""
    _ln_bwd(False, dx, dgamma, dbeta, dy, x, mean, rstd, gamma)


@register("layernorm_bwd", "gpu", "regs_shfl", rung=3, requires=needs_real_gpu,
          ptx=[(_bwd_kernel("ln", 256, 16, True), SIG_LN_BWD), (column_sum_kernel, SIG_COLSUM)])
def layernorm_bwd_shfl(dx, dgamma, dbeta, dy, x, mean, rstd, gamma):
    """`regs` with warp shuffles for the row sums (two barriers per row instead of 9) and 4 blocks per
    SM instead of 2, so more rows are in flight: predict about twice the bandwidth of `regs`."""
    _ln_bwd(True, dx, dgamma, dbeta, dy, x, mean, rstd, gamma)


@register("rmsnorm_bwd", "gpu", "regs", rung=2,
          ptx=[(_bwd_kernel("rms", 256, 16), SIG_RMS_BWD), (column_sum_kernel, SIG_COLSUM)])
def rmsnorm_bwd_gpu(dx, dgamma, dy, x, rstd, gamma):
    """Same structure as the LayerNorm backward, with one row sum instead of two and no dbeta."""
    _rms_bwd(False, dx, dgamma, dy, x, rstd, gamma)


@register("rmsnorm_bwd", "gpu", "regs_shfl", rung=3, requires=needs_real_gpu,
          ptx=[(_bwd_kernel("rms", 256, 16, True), SIG_RMS_BWD), (column_sum_kernel, SIG_COLSUM)])
def rmsnorm_bwd_shfl(dx, dgamma, dy, x, rstd, gamma):
    """Warp-shuffle row sum and 4 blocks per SM."""
    _rms_bwd(True, dx, dgamma, dy, x, rstd, gamma)


# ------------------------------------------------------- GPU backward: 16-byte strips, and any length
BWD_VEC_PER_THREAD = {"ln": 8, "rms": 8}  # target values per thread (N = 4096: 512 threads x 2 groups)
VEC_BWD_BLOCKS_PER_SM = None  # None: as many blocks as fit on an SM at once (the occupancy calculator)
BWD_REG_MAX_N = None  # rows longer than this take the streaming kernel (tests set it small)
STREAM_THREADS = 256


def make_ln_bwd_vec_kernel(threads, groups, aligned, shuffle):
    """The LayerNorm backward over a strip of consecutive rows per block, with 16-byte loads. Thread t
    holds float4 groups t, t + T, ... of a row: its gamma values (loaded once per block) and its running
    partial dgamma, dbeta stay in registers across the strip; each row's dy and x are read once, the two
    row sums take one shuffle reduction and one barrier (the warp sums alternate between two shared
    buffers, so no second barrier is needed before the next row reuses one), and dx is written once. At
    the end the block writes its partials to part[0, b], part[1, b]. The blocks of one wave start
    together and do identical work, so they would all load at once and then all reduce at once, leaving
    DRAM idle half the time; each thread therefore loads the next row (xn, dn) before it reduces this
    one (software pipelining), and DRAM always has a row per block to fetch."""
    ne = 4 * groups
    nb = 64 if shuffle else threads

    @row_jit(threads)
    def layernorm_bwd_vec_kernel(dx, part, dy, x, mean, rstd, gamma, strip):
        # dy, x (M,N), mean, rstd (M,), gamma (N,) -> dx (M,N); part (2, G, N): partial dgamma, dbeta
        wa = cuda.shared.array(nb, float32)
        wb = cuda.shared.array(nb, float32)
        tid = cuda.threadIdx.x
        b = cuda.blockIdx.x
        m = x.shape[0]
        n = x.shape[1]
        n4 = n // 4
        nblk = part.shape[1]
        inv_n = ONE / float32(n)
        gv = cuda.local.array(ne, float32)
        xv = cuda.local.array(ne, float32)
        dv = cuda.local.array(ne, float32)
        xn = cuda.local.array(ne, float32)  # the next row, loaded one row ahead
        dn = cuda.local.array(ne, float32)
        ag = cuda.local.array(ne, float32)
        ab = cuda.local.array(ne, float32)
        for k in range(groups):
            j = tid + k * threads
            if aligned:
                if j < n4:
                    a0, a1, a2, a3 = load4(gamma, j)
                else:
                    a0, a1, a2, a3 = ZERO, ZERO, ZERO, ZERO
                gv[4 * k] = a0
                gv[4 * k + 1] = a1
                gv[4 * k + 2] = a2
                gv[4 * k + 3] = a3
            else:
                for i in range(4):
                    c = 4 * j + i
                    gv[4 * k + i] = gamma[c] if c < n else ZERO
        for e in range(ne):
            ag[e] = ZERO
            ab[e] = ZERO
        lane = tid % 32
        w = tid // 32
        nw = (threads + 31) // 32
        par = 0
        r0 = b * strip
        r1 = min(m, r0 + strip)
        nxt = r0
        if nxt < r1:  # the first row of the strip
            for k in range(groups):
                j = tid + k * threads
                if aligned:
                    if j < n4:
                        a0, a1, a2, a3 = load4(dy, nxt * n4 + j)
                        c0, c1, c2, c3 = load4(x, nxt * n4 + j)
                    else:  # outside the row: dy = 0 (so g = 0 and nothing is accumulated)
                        a0, a1, a2, a3 = ZERO, ZERO, ZERO, ZERO
                        c0, c1, c2, c3 = ZERO, ZERO, ZERO, ZERO
                    dn[4 * k] = a0
                    dn[4 * k + 1] = a1
                    dn[4 * k + 2] = a2
                    dn[4 * k + 3] = a3
                    xn[4 * k] = c0
                    xn[4 * k + 1] = c1
                    xn[4 * k + 2] = c2
                    xn[4 * k + 3] = c3
                else:
                    for i in range(4):
                        c = 4 * j + i
                        if c < n:
                            dn[4 * k + i] = dy[nxt, c]
                            xn[4 * k + i] = x[nxt, c]
                        else:
                            dn[4 * k + i] = ZERO
                            xn[4 * k + i] = ZERO
        for row in range(r0, r1):
            mu = mean[row]
            r = rstd[row]
            for e in range(ne):
                dv[e] = dn[e]
                xv[e] = xn[e]
            nxt = row + 1
            if nxt < r1:  # issue the next row's loads now: they fly while this row is reduced
                for k in range(groups):
                    j = tid + k * threads
                    if aligned:
                        if j < n4:
                            a0, a1, a2, a3 = load4(dy, nxt * n4 + j)
                            c0, c1, c2, c3 = load4(x, nxt * n4 + j)
                        else:  # outside the row: dy = 0 (so g = 0 and nothing is accumulated)
                            a0, a1, a2, a3 = ZERO, ZERO, ZERO, ZERO
                            c0, c1, c2, c3 = ZERO, ZERO, ZERO, ZERO
                        dn[4 * k] = a0
                        dn[4 * k + 1] = a1
                        dn[4 * k + 2] = a2
                        dn[4 * k + 3] = a3
                        xn[4 * k] = c0
                        xn[4 * k + 1] = c1
                        xn[4 * k + 2] = c2
                        xn[4 * k + 3] = c3
                    else:
                        for i in range(4):
                            c = 4 * j + i
                            if c < n:
                                dn[4 * k + i] = dy[nxt, c]
                                xn[4 * k + i] = x[nxt, c]
                            else:
                                dn[4 * k + i] = ZERO
                                xn[4 * k + i] = ZERO
            sg = ZERO
            sgx = ZERO
            for e in range(ne):
                xh = (xv[e] - mu) * r
                d = dv[e]
                g = d * gv[e]
                ag[e] += d * xh
                ab[e] += d
                xv[e] = xh
                dv[e] = g
                sg += g
                sgx += g * xh
            if shuffle:
                sg = warp_sum(sg)
                sgx = warp_sum(sgx)
                if lane == 0:
                    wa[par * 32 + w] = sg
                    wb[par * 32 + w] = sgx
                cuda.syncthreads()
                sg = warp_sum(wa[par * 32 + lane] if lane < nw else ZERO)
                sgx = warp_sum(wb[par * 32 + lane] if lane < nw else ZERO)
                par = 1 - par
            else:
                sg, sgx = block_sum2_smem(sg, sgx, wa, wb)
            sg *= inv_n
            sgx *= inv_n
            for k in range(groups):
                j = tid + k * threads
                if aligned:
                    if j < n4:
                        o = 4 * k
                        store4(dx, row * n4 + j, r * (dv[o] - sg - xv[o] * sgx), r * (dv[o + 1] - sg - xv[o + 1] * sgx),
                               r * (dv[o + 2] - sg - xv[o + 2] * sgx), r * (dv[o + 3] - sg - xv[o + 3] * sgx))
                else:
                    for i in range(4):
                        c = 4 * j + i
                        if c < n:
                            dx[row, c] = r * (dv[4 * k + i] - sg - xv[4 * k + i] * sgx)
        for k in range(groups):  # this block's partial column sums, written once
            j = tid + k * threads
            if aligned:
                if j < n4:
                    store4(part, b * n4 + j, ag[4 * k], ag[4 * k + 1], ag[4 * k + 2], ag[4 * k + 3])
                    store4(part, (nblk + b) * n4 + j, ab[4 * k], ab[4 * k + 1], ab[4 * k + 2], ab[4 * k + 3])
            else:
                for i in range(4):
                    c = 4 * j + i
                    if c < n:
                        part[0, b, c] = ag[4 * k + i]
                        part[1, b, c] = ab[4 * k + i]

    return layernorm_bwd_vec_kernel


def make_rms_bwd_vec_kernel(threads, groups, aligned, shuffle):
    """The RMSNorm backward over a strip of rows per block, 16-byte loads: one row sum, no dbeta."""
    ne = 4 * groups
    nb = 64 if shuffle else threads

    @row_jit(threads)
    def rmsnorm_bwd_vec_kernel(dx, part, dy, x, rstd, gamma, strip):
        wa = cuda.shared.array(nb, float32)
        tid = cuda.threadIdx.x
        b = cuda.blockIdx.x
        m = x.shape[0]
        n = x.shape[1]
        n4 = n // 4
        inv_n = ONE / float32(n)
        gv = cuda.local.array(ne, float32)
        xv = cuda.local.array(ne, float32)
        dv = cuda.local.array(ne, float32)
        xn = cuda.local.array(ne, float32)
        dn = cuda.local.array(ne, float32)
        ag = cuda.local.array(ne, float32)
        for k in range(groups):
            j = tid + k * threads
            if aligned:
                if j < n4:
                    a0, a1, a2, a3 = load4(gamma, j)
                else:
                    a0, a1, a2, a3 = ZERO, ZERO, ZERO, ZERO
                gv[4 * k] = a0
                gv[4 * k + 1] = a1
                gv[4 * k + 2] = a2
                gv[4 * k + 3] = a3
            else:
                for i in range(4):
                    c = 4 * j + i
                    gv[4 * k + i] = gamma[c] if c < n else ZERO
        for e in range(ne):
            ag[e] = ZERO
        lane = tid % 32
        w = tid // 32
        nw = (threads + 31) // 32
        par = 0
        r0 = b * strip
        r1 = min(m, r0 + strip)
        nxt = r0
        if nxt < r1:
            for k in range(groups):
                j = tid + k * threads
                if aligned:
                    if j < n4:
                        a0, a1, a2, a3 = load4(dy, nxt * n4 + j)
                        c0, c1, c2, c3 = load4(x, nxt * n4 + j)
                    else:  # outside the row: dy = 0 (so g = 0 and nothing is accumulated)
                        a0, a1, a2, a3 = ZERO, ZERO, ZERO, ZERO
                        c0, c1, c2, c3 = ZERO, ZERO, ZERO, ZERO
                    dn[4 * k] = a0
                    dn[4 * k + 1] = a1
                    dn[4 * k + 2] = a2
                    dn[4 * k + 3] = a3
                    xn[4 * k] = c0
                    xn[4 * k + 1] = c1
                    xn[4 * k + 2] = c2
                    xn[4 * k + 3] = c3
                else:
                    for i in range(4):
                        c = 4 * j + i
                        if c < n:
                            dn[4 * k + i] = dy[nxt, c]
                            xn[4 * k + i] = x[nxt, c]
                        else:
                            dn[4 * k + i] = ZERO
                            xn[4 * k + i] = ZERO
        for row in range(r0, r1):
            r = rstd[row]
            for e in range(ne):
                dv[e] = dn[e]
                xv[e] = xn[e]
            nxt = row + 1
            if nxt < r1:
                for k in range(groups):
                    j = tid + k * threads
                    if aligned:
                        if j < n4:
                            a0, a1, a2, a3 = load4(dy, nxt * n4 + j)
                            c0, c1, c2, c3 = load4(x, nxt * n4 + j)
                        else:  # outside the row: dy = 0 (so g = 0 and nothing is accumulated)
                            a0, a1, a2, a3 = ZERO, ZERO, ZERO, ZERO
                            c0, c1, c2, c3 = ZERO, ZERO, ZERO, ZERO
                        dn[4 * k] = a0
                        dn[4 * k + 1] = a1
                        dn[4 * k + 2] = a2
                        dn[4 * k + 3] = a3
                        xn[4 * k] = c0
                        xn[4 * k + 1] = c1
                        xn[4 * k + 2] = c2
                        xn[4 * k + 3] = c3
                    else:
                        for i in range(4):
                            c = 4 * j + i
                            if c < n:
                                dn[4 * k + i] = dy[nxt, c]
                                xn[4 * k + i] = x[nxt, c]
                            else:
                                dn[4 * k + i] = ZERO
                                xn[4 * k + i] = ZERO
            sgx = ZERO
            for e in range(ne):
                d = dv[e]
                xx = xv[e]
                g = d * gv[e]
                ag[e] += d * xx * r
                dv[e] = g
                sgx += g * xx
            if shuffle:
                sgx = warp_sum(sgx)
                if lane == 0:
                    wa[par * 32 + w] = sgx
                cuda.syncthreads()
                sgx = warp_sum(wa[par * 32 + lane] if lane < nw else ZERO)
                par = 1 - par
            else:
                sgx = block_sum_smem(sgx, wa)
            coef = r * r * sgx * inv_n
            for k in range(groups):
                j = tid + k * threads
                if aligned:
                    if j < n4:
                        o = 4 * k
                        store4(dx, row * n4 + j, r * (dv[o] - xv[o] * coef), r * (dv[o + 1] - xv[o + 1] * coef),
                               r * (dv[o + 2] - xv[o + 2] * coef), r * (dv[o + 3] - xv[o + 3] * coef))
                else:
                    for i in range(4):
                        c = 4 * j + i
                        if c < n:
                            dx[row, c] = r * (dv[4 * k + i] - xv[4 * k + i] * coef)
        for k in range(groups):
            j = tid + k * threads
            if aligned:
                if j < n4:
                    store4(part, b * n4 + j, ag[4 * k], ag[4 * k + 1], ag[4 * k + 2], ag[4 * k + 3])
            else:
                for i in range(4):
                    c = 4 * j + i
                    if c < n:
                        part[0, b, c] = ag[4 * k + i]

    return rmsnorm_bwd_vec_kernel


def make_ln_bwd_stream_kernel(threads):
    """The LayerNorm backward for rows of any length: nothing of a row is kept in registers. Per row,
    one walk over dy, x, gamma for the two row sums, a shared-memory tree, then a second walk that writes
    dx and adds into this block's partial dgamma, dbeta rows part[0, b], part[1, b] in global memory
    (thread t always owns columns t, t + T, ...: no races, no atomics)."""

    @row_jit(threads)
    def layernorm_bwd_stream_kernel(dx, part, dy, x, mean, rstd, gamma, strip):
        sa = cuda.shared.array(threads, float32)
        sb = cuda.shared.array(threads, float32)
        tid = cuda.threadIdx.x
        b = cuda.blockIdx.x
        m = x.shape[0]
        n = x.shape[1]
        inv_n = ONE / float32(n)
        for c in range(tid, n, threads):
            part[0, b, c] = ZERO
            part[1, b, c] = ZERO
        r0 = b * strip
        r1 = min(m, r0 + strip)
        for row in range(r0, r1):
            mu = mean[row]
            r = rstd[row]
            sg = ZERO
            sgx = ZERO
            for c in range(tid, n, threads):  # walk 1: the two row sums
                g = dy[row, c] * gamma[c]
                sg += g
                sgx += g * ((x[row, c] - mu) * r)
            sg, sgx = block_sum2_smem(sg, sgx, sa, sb)
            sg *= inv_n
            sgx *= inv_n
            for c in range(tid, n, threads):  # walk 2 (dy, x again, from L2 if the row is still there)
                d = dy[row, c]
                xh = (x[row, c] - mu) * r
                dx[row, c] = r * (d * gamma[c] - sg - xh * sgx)
                part[0, b, c] += d * xh
                part[1, b, c] += d

    return layernorm_bwd_stream_kernel


def make_rms_bwd_stream_kernel(threads):
    """The RMSNorm backward for rows of any length (see make_ln_bwd_stream_kernel)."""

    @row_jit(threads)
    def rmsnorm_bwd_stream_kernel(dx, part, dy, x, rstd, gamma, strip):
        sa = cuda.shared.array(threads, float32)
        tid = cuda.threadIdx.x
        b = cuda.blockIdx.x
        m = x.shape[0]
        n = x.shape[1]
        inv_n = ONE / float32(n)
        for c in range(tid, n, threads):
            part[0, b, c] = ZERO
        r0 = b * strip
        r1 = min(m, r0 + strip)
        for row in range(r0, r1):
            r = rstd[row]
            s = ZERO
            for c in range(tid, n, threads):
                s += dy[row, c] * gamma[c] * x[row, c]
            coef = r * r * block_sum_smem(s, sa) * inv_n
            for c in range(tid, n, threads):
                d = dy[row, c]
                xx = x[row, c]
                dx[row, c] = r * (d * gamma[c] - xx * coef)
                part[0, b, c] += d * xx * r

    return rmsnorm_bwd_stream_kernel


def make_colsum_kernel(width, lanes):
    """part (K, G, N) -> out_k (N,) = sum over the G partial rows, for k = blockIdx.y (out0 or out1).
    A block covers ``width`` columns with ``lanes`` threads each striding down the G rows (coalesced
    across threadIdx.x), then adds its lanes through shared memory."""

    @cuda.jit
    def column_sums_kernel(out0, out1, part):
        buf = cuda.shared.array((lanes, width), float32)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        c = cuda.blockIdx.x * width + tx
        kk = cuda.blockIdx.y
        n = part.shape[2]
        s = ZERO
        if c < n:
            for i in range(ty, part.shape[1], lanes):
                s += part[kk, i, c]
        buf[ty, tx] = s
        cuda.syncthreads()
        if ty == 0 and c < n:
            t = ZERO
            for i in range(lanes):
                t += buf[i, tx]
            if kk == 0:
                out0[c] = t
            else:
                out1[c] = t

    return column_sums_kernel


COLSUM = (8, 2) if device.SIMULATED else (32, 8)  # (columns, lanes) per block
colsum_kernel = make_colsum_kernel(*COLSUM)
_vbwd: dict = {}


def _vbwd_kernel(kind, *cfg):
    key = (kind, *cfg)
    if key not in _vbwd:
        _vbwd[key] = {"ln_vec": make_ln_bwd_vec_kernel, "rms_vec": make_rms_bwd_vec_kernel,
                      "ln_stream": make_ln_bwd_stream_kernel, "rms_stream": make_rms_bwd_stream_kernel}[kind](*cfg)
    return _vbwd[key]


SIG_LN_BWD_V = ("void(float32[:, ::1], float32[:, :, ::1], float32[:, ::1], float32[:, ::1], float32[::1], "
                "float32[::1], float32[::1], int64)")
SIG_RMS_BWD_V = ("void(float32[:, ::1], float32[:, :, ::1], float32[:, ::1], float32[:, ::1], float32[::1], "
                 "float32[::1], int64)")
SIG_COLSUM2 = "void(float32[::1], float32[::1], float32[:, :, ::1])"


_slots: dict = {}  # (kernel, threads) -> blocks resident on the whole GPU at once


def _strips(m, kern, sig, threads):
    """(G, rows per block): one block per resident slot of the GPU (all blocks in one wave, each with
    the same number of rows within one), from the occupancy calculator unless VEC_BWD_BLOCKS_PER_SM is set."""
    if device.SIMULATED:
        g = min(m, 3)
    else:
        if VEC_BWD_BLOCKS_PER_SM is not None:
            slots = VEC_BWD_BLOCKS_PER_SM * _num_sms()
        else:
            slots = _slots.get((id(kern), threads))
            if slots is None:  # asked once per kernel: parsing ``sig`` alone costs ~100 us of host time
                try:
                    slots = kern.compile(sig).max_cooperative_grid_blocks(threads)
                except Exception:  # noqa: BLE001  (an older numba-cuda: assume two blocks per SM)
                    slots = 2 * _num_sms()
                _slots[(id(kern), threads)] = slots
        g = max(1, min(m, slots))
    strip = ceil_div(m, g)
    return ceil_div(m, strip), strip


def _part(k, g, n):
    key = ("part", k, g, n)
    if key not in _scratch:
        _scratch[key] = cuda.device_array((k, g, n), dtype=np.float32)
    return _scratch[key]


def _colsums(out0, out1, part):
    w, lanes = COLSUM
    colsum_kernel[(ceil_div(part.shape[2], w), part.shape[0]), (w, lanes)](out0, out1, part)


def _bwd_stream(fam, outs, dx, dy, x, in_args):
    """The any-length path: LayerNorm outs = (dgamma, dbeta), RMSNorm outs = (dgamma,)."""
    m, n = x.shape
    t = row_threads_streaming(n, STREAM_THREADS)
    sig = SIG_LN_BWD_V if fam == "ln" else SIG_RMS_BWD_V
    kern = _vbwd_kernel(f"{fam}_stream", t)
    g, strip = _strips(m, kern, sig, t)
    part = _part(len(outs), g, n)
    kern[g, t](dx, part, dy, x, *in_args, strip)
    _colsums(outs[0], outs[-1], part)


def _bwd_vec(fam, outs, dx, dy, x, in_args):
    m, n = x.shape
    cfg = vec_config(n, BWD_VEC_PER_THREAD[fam])
    if cfg is None or (BWD_REG_MAX_N is not None and n > BWD_REG_MAX_N):
        return _bwd_stream(fam, outs, dx, dy, x, in_args)
    t, groups = cfg
    aligned = n % 4 == 0 and _aligned16(dx, dy, x, in_args[-1])
    shuffle = not device.SIMULATED
    sig = SIG_LN_BWD_V if fam == "ln" else SIG_RMS_BWD_V
    kern = _vbwd_kernel(f"{fam}_vec", t, groups, aligned, shuffle)
    g, strip = _strips(m, kern, sig, t)
    part = _part(len(outs), g, n)
    kern[g, t](dx, part, dy, x, *in_args, strip)
    _colsums(outs[0], outs[-1], part)


@register("layernorm_bwd", "gpu", "stream", rung=1,
          ptx=[(_vbwd_kernel("ln_stream", 256), SIG_LN_BWD_V), (colsum_kernel, SIG_COLSUM2)])
def layernorm_bwd_stream(dx, dgamma, dbeta, dy, x, mean, rstd, gamma):
    """The fallback for rows of any length (the register rungs hand rows too long for registers to it):
    blocks own strips of rows, walk each row twice (sums, then dx) and keep their partial dgamma, dbeta
    in a global row of their own. Predict: under half of copy at 16384 x 4096 (dy and x read twice, the
    partials read and written once per row, from L2)."""
    _bwd_stream("ln", (dgamma, dbeta), dx, dy, x, (mean, rstd, gamma))


@register("layernorm_bwd", "gpu", "vec4", rung=4,
          ptx=[(_vbwd_kernel("ln_vec", 512, 2, True, True), SIG_LN_BWD_V), (colsum_kernel, SIG_COLSUM2)])
def layernorm_bwd_vec4(dx, dgamma, dbeta, dy, x, mean, rstd, gamma):
    """Strips of consecutive rows, one block per resident slot (one wave), 16-byte loads and stores,
    gamma in registers for the whole strip, one barrier per row, and the next row's dy and x loaded
    before this row is reduced, so a block always has a row of loads in flight; then a column-sum kernel
    over the partials. DRAM traffic: dy and x read once, dx written once, plus 2 x G x N partials (about
    2 %). Predict: about 85 % of copy at 16384 x 4096 and about 1.5x torch's backward, which reads dy
    and x a second time for dgamma, dbeta."""
    _bwd_vec("ln", (dgamma, dbeta), dx, dy, x, (mean, rstd, gamma))


@register("rmsnorm_bwd", "gpu", "stream", rung=1,
          ptx=[(_vbwd_kernel("rms_stream", 256), SIG_RMS_BWD_V), (colsum_kernel, SIG_COLSUM2)])
def rmsnorm_bwd_stream(dx, dgamma, dy, x, rstd, gamma):
    """The any-length fallback of the RMSNorm backward. Predict: under half of copy at 16384 x 4096."""
    _bwd_stream("rms", (dgamma,), dx, dy, x, (rstd, gamma))


@register("rmsnorm_bwd", "gpu", "vec4", rung=4,
          ptx=[(_vbwd_kernel("rms_vec", 512, 2, True, True), SIG_RMS_BWD_V), (colsum_kernel, SIG_COLSUM2)])
def rmsnorm_bwd_vec4(dx, dgamma, dy, x, rstd, gamma):
    """Strips of rows, 16-byte accesses, one barrier per row, the next row loaded one row ahead,
    partial dgamma in registers. Predict: about 85 % of copy at 16384 x 4096 and about 1.5x torch's
    backward."""
    _bwd_vec("rms", (dgamma,), dx, dy, x, (rstd, gamma))


apply_tuning()
