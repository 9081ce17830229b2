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
  gpu/regs        rung 2   the row held in registers: x read once from DRAM (simulator path)
  gpu/regs_shfl   rung 3   rung 2 with warp-shuffle reductions (real GPU only)
  gpu/torch       baseline torch.native_layer_norm / rms_norm, then copied into our buffers; the
                           same-run torch-eager timing without the copy is in chapter 7's benchmark
Backward
  cpu/loop        rung 1   row by row, dgamma/dbeta accumulated across rows
  gpu/regs        rung 1   kernel 1: blocks own groups of rows, compute dx and keep per-column partial
                           dgamma/dbeta in registers; kernel 2: sums the partials over the blocks

Precision: variance is computed around the mean (two passes over values already in registers), never
as E[x^2] - E[x]^2, which cancels catastrophically when |mean| >> std. float32 kernels still overflow
when x^2 does (|x| > ~1.8e19); the reference, in float64, does not.
"""
import math

import numpy as np
from numba import float32, njit, prange

from .. import device
from ..device import ceil_div, cuda, needs_real_gpu
from ..registry import define_op, register
from .reductions import (FAST_MATH, ONE, ZERO, as_torch, block_sum_shfl, block_sum_smem, row_config,
                         row_threads_streaming, torch_gpu)

EPS = 1e-5
EPS32 = np.float32(EPS)
THREADS = None  # override the block size of the register rungs (None: chosen from the row length)
PERSIST = 0  # >0: the register rungs launch PERSIST blocks per SM that loop over rows (gamma, beta kept)


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


SIZES = {"check": [(1, 1), (3, 7), (5, 33), (2, 257), (64, 1000), (17, 4099), (3, 12289)],
         "check_sim": [(1, 1), (3, 7), (5, 33), (2, 257)],
         "bench": [(1024, 1024), (4096, 4096)],
         "bench_gpu": [(16384, 1024), (16384, 4096)],
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


# ------------------------------------------------------------------------------ GPU: streaming rung
def make_ln_stream_kernel(threads):
    @cuda.jit(fastmath=FAST_MATH)
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
    @cuda.jit(fastmath=FAST_MATH)
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
def make_ln_regs_kernel(threads, items, shuffle, persist=False):
    """Thread t of the block for row i holds x[i, t + k*threads], k < items, in registers. With
    ``persist`` a block loops over rows i = blockIdx.x, + gridDim.x, ... and loads gamma, beta once."""
    nbuf = 32 if shuffle else threads

    @cuda.jit(fastmath=FAST_MATH)
    def layernorm_regs_kernel(y, mean, rstd, x, gamma, beta):
        b1 = cuda.shared.array(nbuf, float32)
        b2 = cuda.shared.array(nbuf, float32)
        tid = cuda.threadIdx.x
        m = x.shape[0]
        n = x.shape[1]
        full = n == threads * items
        inv_n = ONE / float32(n)
        v = cuda.local.array(items, float32)
        g = cuda.local.array(items, float32)
        b = cuda.local.array(items, float32)
        for k in range(items):
            c = tid + k * threads
            g[k] = gamma[c] if c < n else ZERO
            b[k] = beta[c] if c < n else ZERO
        row = cuda.blockIdx.x
        while row < m:
            s = ZERO
            if full:
                for k in range(items):  # the only DRAM read of the row
                    v[k] = x[row, tid + k * threads]
            else:
                for k in range(items):
                    c = tid + k * threads
                    v[k] = x[row, c] if c < n else ZERO
            for k in range(items):
                s += v[k]
            if shuffle:
                mu = block_sum_shfl(s, b1) * inv_n
            else:
                mu = block_sum_smem(s, b1) * inv_n
            q = ZERO
            for k in range(items):  # deviations, in place: padding must stay exactly 0
                d = v[k] - mu if tid + k * threads < n else ZERO
                v[k] = d
                q += d * d
            if shuffle:
                var = block_sum_shfl(q, b2) * inv_n
            else:
                var = block_sum_smem(q, b2) * inv_n
            r = ONE / math.sqrt(var + EPS32)
            if tid == 0:
                mean[row] = mu
                rstd[row] = r
            for k in range(items):
                c = tid + k * threads
                if c < n:
                    y[row, c] = v[k] * r * g[k] + b[k]
            if not persist:
                break
            if shuffle:
                cuda.syncthreads()  # b1, b2 are rewritten by the next row's reductions
            row += cuda.gridDim.x

    return layernorm_regs_kernel


def make_rms_regs_kernel(threads, items, shuffle, persist=False):
    nbuf = 32 if shuffle else threads

    @cuda.jit(fastmath=FAST_MATH)
    def rmsnorm_regs_kernel(y, rstd, x, gamma):
        b1 = cuda.shared.array(nbuf, float32)
        tid = cuda.threadIdx.x
        m = x.shape[0]
        n = x.shape[1]
        full = n == threads * items
        inv_n = ONE / float32(n)
        v = cuda.local.array(items, float32)
        g = cuda.local.array(items, float32)
        for k in range(items):
            c = tid + k * threads
            g[k] = gamma[c] if c < n else ZERO
        row = cuda.blockIdx.x
        while row < m:
            if full:
                for k in range(items):
                    v[k] = x[row, tid + k * threads]
            else:
                for k in range(items):
                    c = tid + k * threads
                    v[k] = x[row, c] if c < n else ZERO
            q = ZERO
            for k in range(items):
                q += v[k] * v[k]
            if shuffle:
                ms = block_sum_shfl(q, b1) * inv_n
            else:
                ms = block_sum_smem(q, b1) * inv_n
            r = ONE / math.sqrt(ms + EPS32)
            if tid == 0:
                rstd[row] = r
            for k in range(items):
                c = tid + k * threads
                if c < n:
                    y[row, c] = v[k] * r * g[k]
            if not persist:
                break
            if shuffle:
                cuda.syncthreads()
            row += cuda.gridDim.x

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
    return device.cuda.get_current_device().MULTIPROCESSOR_COUNT


def _regs_launch(kind, stream_kind, shuffle, out_args, x, in_args):
    m, n = x.shape
    cfg = row_config(n, THREADS)
    if cfg is None:  # a row too long for registers: stream it
        t = row_threads_streaming(n)
        return kernel(stream_kind, t)[m, t](*out_args, x, *in_args)
    t, e = cfg
    persist = PERSIST > 0 and not device.SIMULATED
    grid = min(m, PERSIST * _num_sms()) if persist else m
    kernel(kind, t, e, shuffle, persist)[grid, t](*out_args, x, *in_args)


@register("layernorm", "gpu", "row_smem", rung=1, ptx=[(kernel("ln_stream", PTX_STREAM), SIG_LN)])
def layernorm_row_smem(y, mean, rstd, x, gamma, beta):
    """One block per row; threads stride over it; shared-memory trees for the mean and the variance.
    x is read three times (mean, variance, write): the second and third reads hit L2 only if the
    row is still there, so predict 50-70 % of copy bandwidth."""
    t = row_threads_streaming(x.shape[1])
    kernel("ln_stream", t)[x.shape[0], t](y, mean, rstd, x, gamma, beta)


@register("layernorm", "gpu", "regs", rung=2, ptx=[(kernel("ln_regs", 512, 8, False, False), SIG_LN)])
def layernorm_regs(y, mean, rstd, x, gamma, beta):
    """The row is loaded into registers once (512 threads x 8 values at N = 4096); mean and variance
    are computed from registers, so DRAM sees x once and y once: predict ~80 % of copy bandwidth, held
    back by two shared-memory trees of 9 barriers each. This is also the simulator's rung 3."""
    _regs_launch("ln_regs", "ln_stream", False, (y, mean, rstd), x, (gamma, beta))


@register("layernorm", "gpu", "regs_shfl", rung=3, ptx=[(kernel("ln_regs", 512, 8, True, False), SIG_LN)],
          requires=needs_real_gpu)
def layernorm_regs_shfl(y, mean, rstd, x, gamma, beta):
    """Rung 2 with warp-shuffle reductions: one barrier per reduction instead of 9. Predict >= 85 % of
    copy bandwidth at 16384 x 4096."""
    _regs_launch("ln_regs", "ln_stream", True, (y, mean, rstd), x, (gamma, beta))


@register("rmsnorm", "gpu", "row_smem", rung=1, ptx=[(kernel("rms_stream", PTX_STREAM), SIG_RMS)])
def rmsnorm_row_smem(y, rstd, x, gamma):
    """One block per row, threads stride over it: sum of squares, then the write. x read twice."""
    t = row_threads_streaming(x.shape[1])
    kernel("rms_stream", t)[x.shape[0], t](y, rstd, x, gamma)


@register("rmsnorm", "gpu", "regs", rung=2, ptx=[(kernel("rms_regs", 512, 8, False, False), SIG_RMS)])
def rmsnorm_regs(y, rstd, x, gamma):
    """Row in registers, one shared-memory tree: x read once. The simulator's version of rung 3."""
    _regs_launch("rms_regs", "rms_stream", False, (y, rstd), x, (gamma,))


@register("rmsnorm", "gpu", "regs_shfl", rung=3, ptx=[(kernel("rms_regs", 512, 8, True, False), SIG_RMS)],
          requires=needs_real_gpu)
def rmsnorm_regs_shfl(y, rstd, x, gamma):
    """Row in registers, warp-shuffle reduction: predict >= 85 % of copy bandwidth at 16384 x 4096."""
    _regs_launch("rms_regs", "rms_stream", True, (y, rstd), x, (gamma,))


# torch baselines (real GPU with torch): zero-copy views of our device arrays, cached across calls
_views: dict = {}


def _tv(a):
    hit = _views.get(id(a))
    if hit is None or hit[0] is not a:
        hit = _views[id(a)] = (a, as_torch(a))
    return hit[1]


@register("layernorm", "gpu", "torch", baseline=True, requires=torch_gpu)
def layernorm_torch(y, mean, rstd, x, gamma, beta):
    """torch.native_layer_norm, then copied into our y, mean, rstd (torch has no out= for it). The
    copy costs about as much as the norm itself; the fair torch time is `eager_layernorm`'s."""
    import torch

    yt, mt, rt = torch.native_layer_norm(_tv(x), (x.shape[1],), _tv(gamma), _tv(beta), EPS)
    _tv(y).copy_(yt)
    _tv(mean).copy_(mt.view(-1))
    _tv(rstd).copy_(rt.view(-1))


@register("rmsnorm", "gpu", "torch", baseline=True, requires=torch_gpu)
def rmsnorm_torch(y, rstd, x, gamma):
    """torch.nn.functional.rms_norm, copied into our y; rstd computed with two more torch ops."""
    import torch

    xt = _tv(x)
    _tv(y).copy_(torch.nn.functional.rms_norm(xt, (x.shape[1],), _tv(gamma), EPS))
    _tv(rstd).copy_(torch.rsqrt(xt.pow(2).mean(-1) + EPS))


def eager_layernorm(x, gamma, beta):
    """torch eager as a user calls it (allocates y): the fair same-run yardstick."""
    import torch

    return torch.nn.functional.layer_norm(x, (x.shape[1],), gamma, beta, EPS)


def eager_rmsnorm(x, gamma):
    import torch

    return torch.nn.functional.rms_norm(x, (x.shape[1],), gamma, EPS)


# ---------------------------------------------------------------------------------- GPU: backward
def make_ln_bwd_kernel(threads, items):
    @cuda.jit(fastmath=FAST_MATH)
    def layernorm_bwd_kernel(dx, pg, pb, dy, x, mean, rstd, gamma):
        # dy, x (M,N), mean, rstd (M,), gamma (N,) -> dx (M,N); pg, pb (gridDim.x, N): this block's
        # partial dgamma, dbeta over the rows it handled (rows blockIdx.x, + gridDim.x, ...)
        b1 = cuda.shared.array(threads, float32)
        b2 = cuda.shared.array(threads, float32)
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
            sg = block_sum_smem(sg, b1) * inv_n
            sgx = block_sum_smem(sgx, b2) * inv_n
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


def make_rms_bwd_kernel(threads, items):
    @cuda.jit(fastmath=FAST_MATH)
    def rmsnorm_bwd_kernel(dx, pg, dy, x, rstd, gamma):
        b1 = cuda.shared.array(threads, float32)
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
            coef = r * r * block_sum_smem(sgx, b1) * inv_n
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


def _bwd_kernel(kind, t, e):
    key = (kind, t, e)
    if key not in _bwd_kernels:
        _bwd_kernels[key] = (make_ln_bwd_kernel if kind == "ln" else make_rms_bwd_kernel)(t, e)
    return _bwd_kernels[key]


_scratch: dict = {}


def _partials(g, n, which):
    key = (g, n, which)
    if key not in _scratch:
        _scratch[key] = cuda.device_array((g, n), dtype=np.float32)
    return _scratch[key]


def _bwd_config(m, n):
    cfg = row_config(n, THREADS)
    if cfg is None:
        raise NotImplementedError(f"the GPU norm backward keeps a row in registers: N <= {1024 * 16}, got {n}")
    g = min(m, 4 if device.SIMULATED else 2 * _num_sms())  # blocks; each owns every g-th row
    return cfg[0], cfg[1], g


SIG_LN_BWD = ("void(float32[:, ::1], float32[:, ::1], float32[:, ::1], float32[:, ::1], float32[:, ::1], "
              "float32[::1], float32[::1], float32[::1])")
SIG_RMS_BWD = ("void(float32[:, ::1], float32[:, ::1], float32[:, ::1], float32[:, ::1], float32[::1], "
               "float32[::1])")
SIG_COLSUM = "void(float32[::1], float32[:, ::1])"


@register("layernorm_bwd", "gpu", "regs", rung=1,
          ptx=[(_bwd_kernel("ln", 512, 8), SIG_LN_BWD), (column_sum_kernel, SIG_COLSUM)])
def layernorm_bwd_gpu(dx, dgamma, dbeta, dy, x, mean, rstd, gamma):
    """Kernel 1: 2 x SMs blocks, each taking every G-th row: two block sums give dx, and each thread keeps
    its columns' partial dgamma, dbeta in registers across the rows, writing them once. Kernel 2: one
    thread per column sums the G partials. No atomics, so the result is deterministic. Reads dy, x once
    and writes dx once: predict ~70-80 % of copy bandwidth."""
    m, n = x.shape
    t, e, g = _bwd_config(m, n)
    pg, pb = _partials(g, n, "g"), _partials(g, n, "b")
    _bwd_kernel("ln", t, e)[g, t](dx, pg, pb, dy, x, mean, rstd, gamma)
    tc = 32 if device.SIMULATED else 256
    column_sum_kernel[ceil_div(n, tc), tc](dgamma, pg)
    column_sum_kernel[ceil_div(n, tc), tc](dbeta, pb)


@register("rmsnorm_bwd", "gpu", "regs", rung=1,
          ptx=[(_bwd_kernel("rms", 512, 8), SIG_RMS_BWD), (column_sum_kernel, SIG_COLSUM)])
def rmsnorm_bwd_gpu(dx, dgamma, dy, x, rstd, gamma):
    """Same structure as the LayerNorm backward, with one row sum instead of two and no dbeta."""
    m, n = x.shape
    t, e, g = _bwd_config(m, n)
    pg = _partials(g, n, "g")
    _bwd_kernel("rms", t, e)[g, t](dx, pg, dy, x, rstd, gamma)
    tc = 32 if device.SIMULATED else 256
    column_sum_kernel[ceil_div(n, tc), tc](dgamma, pg)
