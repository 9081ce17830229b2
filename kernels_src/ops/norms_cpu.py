"""LayerNorm and RMSNorm on the CPU (chapter 7), forward and backward; the ops are defined in norms_ref.

  cpu/loop        rung 1   @njit, row by row: mean, then variance around it (two passes), then write;
                           backward: dgamma/dbeta accumulated across rows
  cpu/prange      rung 2   rows split over cores (backward: per-core partial dgamma/dbeta, then summed)
  cpu/simd        rung 3   rung 2 with the row sums allowed to be reassociated, so they vectorize
  cpu/simd_f32out rung 4   rung 3 with the output pass in float32 (forward): no float64 round trip per element
  cpu/rows4       rung 3   (layernorm_bwd) the dx walk over four rows at once: one dgamma/dbeta update per 4 rows
  cpu/numpy, cpu/torch     the yardsticks a student would reach for (baselines)
"""
import numpy as np

from ..compiler import njit, prange
from ..registry import register
from .norms_ref import EPS, EPS32


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


# Rung 4: rung 3's float64 row sums (cheap: a conversion and an add per 8 elements), but the output pass in float32.
# Rung 3 writes y = (x - mu) r gamma + beta with mu and r in float64, so every element is converted to float64 and
# back, and gamma and beta too: kernels asm counts the vcvtps2pd/vcvtpd2ps pairs and twice the packed arithmetic.
@njit(inline="always", fastmath=REASSOC)
def _ln_row_f32(y, mean, rstd, x, gamma, beta, i):
    n = x.shape[1]
    s = 0.0
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
    mu32 = np.float32(mu)  # |x - mu32| is as exact as the float32 x itself allows
    r32 = np.float32(r)
    for j in range(n):
        y[i, j] = (x[i, j] - mu32) * (r32 * gamma[j]) + beta[j]  # float32: one sub, one mul, one FMA


@njit(inline="always", fastmath=REASSOC)
def _rms_row_f32(y, rstd, x, gamma, i):
    n = x.shape[1]
    q = 0.0
    for j in range(n):
        v = np.float64(x[i, j])
        q += v * v
    r = 1.0 / np.sqrt(q / n + EPS)
    rstd[i] = r
    r32 = np.float32(r)
    for j in range(n):
        y[i, j] = x[i, j] * (r32 * gamma[j])


@njit(parallel=True, cache=True, fastmath=REASSOC)
def layernorm_rows_f32(y, mean, rstd, x, gamma, beta):
    for i in prange(x.shape[0]):
        _ln_row_f32(y, mean, rstd, x, gamma, beta, i)


@njit(parallel=True, cache=True, fastmath=REASSOC)
def rmsnorm_rows_f32(y, rstd, x, gamma):
    for i in prange(x.shape[0]):
        _rms_row_f32(y, rstd, x, gamma, i)


@register("layernorm", "cpu", "simd_f32out", rung=4)
def layernorm_simd_f32out(y, mean, rstd, x, gamma, beta):
    """Rung 3 with the output pass in float32 (issue 36): the row statistics stay float64 sums, then mu and r
    are rounded to float32 once per row and y = (x - mu) (r gamma) + beta is one subtraction, one multiply
    and one FMA per 16 floats, instead of rung 3's conversions of x, gamma and beta to float64 and of y back.
    kernels asm: 40 packed zmm instructions against rung 3's 168. Predict the output pass ~3x cheaper, so the
    row ~1.5x faster in cache, closer to the copy bandwidth at 4096 x 4096."""
    layernorm_rows_f32(y, mean, rstd, x, gamma, beta)


@register("rmsnorm", "cpu", "simd_f32out", rung=4)
def rmsnorm_simd_f32out(y, rstd, x, gamma):
    """Rung 3 with the output pass in float32 (issue 36): the sum of squares stays float64, r is rounded to
    float32 once per row and y = x (r gamma) is two multiplies per 16 floats. kernels asm: 20 packed zmm
    instructions against rung 3's 96. Predict ~1.5x rung 3 in cache."""
    rmsnorm_rows_f32(y, rstd, x, gamma)


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


# Rung 3 of the backward passes: four rows at a time in the dx walk, so the partial dgamma (and dbeta) row is read
# and written once per four rows instead of once per row. Per 16 columns, rung 2's fused walk loads x, dy, gamma,
# pg, pb and stores dx, pg, pb: three stores for one row's 16 results, and the stores are the bound (one 64-byte
# store per cycle); four rows share one load and one store of pg and pb. Row sums stay one row at a time (their
# reads come from L1/L2). The float32 1/N is taken once: `sg /= n` with an integer n would make sg a float64.
@njit(inline="always", fastmath=REASSOC)
def _ln_bwd_row_sums(dyr, xr, gamma, mu, r, inv_n):
    sg = np.float32(0.0)
    sgx = np.float32(0.0)
    for j in range(xr.size):
        g = dyr[j] * gamma[j]
        sg += g
        sgx += g * ((xr[j] - mu) * r)
    return sg * inv_n, sgx * inv_n


@njit(parallel=True, cache=True, fastmath=REASSOC)
def layernorm_bwd_rows4(dx, dgamma, dbeta, dy, x, mean, rstd, gamma, parts):
    m, n = x.shape
    P = parts.shape[1]
    per = (m + P - 1) // P
    inv_n = np.float32(1.0) / np.float32(n)
    for p in prange(P):
        pg = parts[0, p]
        pb = parts[1, p]
        pg[:] = 0.0
        pb[:] = 0.0
        lo = p * per
        hi = min(m, (p + 1) * per)
        i = lo
        while i + 4 <= hi:
            m0, m1, m2, m3 = mean[i], mean[i + 1], mean[i + 2], mean[i + 3]
            r0, r1, r2, r3 = rstd[i], rstd[i + 1], rstd[i + 2], rstd[i + 3]
            a0, b0 = _ln_bwd_row_sums(dy[i], x[i], gamma, m0, r0, inv_n)
            a1, b1 = _ln_bwd_row_sums(dy[i + 1], x[i + 1], gamma, m1, r1, inv_n)
            a2, b2 = _ln_bwd_row_sums(dy[i + 2], x[i + 2], gamma, m2, r2, inv_n)
            a3, b3 = _ln_bwd_row_sums(dy[i + 3], x[i + 3], gamma, m3, r3, inv_n)
            x0, x1, x2, x3 = x[i], x[i + 1], x[i + 2], x[i + 3]
            d0, d1, d2, d3 = dy[i], dy[i + 1], dy[i + 2], dy[i + 3]
            o0, o1, o2, o3 = dx[i], dx[i + 1], dx[i + 2], dx[i + 3]
            for j in range(n):
                gj = gamma[j]
                h0 = (x0[j] - m0) * r0
                h1 = (x1[j] - m1) * r1
                h2 = (x2[j] - m2) * r2
                h3 = (x3[j] - m3) * r3
                o0[j] = r0 * (d0[j] * gj - a0 - h0 * b0)
                o1[j] = r1 * (d1[j] * gj - a1 - h1 * b1)
                o2[j] = r2 * (d2[j] * gj - a2 - h2 * b2)
                o3[j] = r3 * (d3[j] * gj - a3 - h3 * b3)
                pg[j] += (d0[j] * h0 + d1[j] * h1) + (d2[j] * h2 + d3[j] * h3)
                pb[j] += (d0[j] + d1[j]) + (d2[j] + d3[j])
            i += 4
        while i < hi:  # the last rows of the chunk, one at a time
            mu = mean[i]
            r = rstd[i]
            a, b = _ln_bwd_row_sums(dy[i], x[i], gamma, mu, r, inv_n)
            xr, dyr, dxr = x[i], dy[i], dx[i]
            for j in range(n):
                h = (xr[j] - mu) * r
                dxr[j] = r * (dyr[j] * gamma[j] - a - h * b)
                pg[j] += dyr[j] * h
                pb[j] += dyr[j]
            i += 1
    for j in range(n):
        a = np.float32(0.0)
        b = np.float32(0.0)
        for q in range(P):
            a += parts[0, q, j]
            b += parts[1, q, j]
        dgamma[j] = a
        dbeta[j] = b


@register("layernorm_bwd", "cpu", "rows4", rung=3)
def layernorm_bwd_rows4_cpu(dx, dgamma, dbeta, dy, x, mean, rstd, gamma):
    """Rung 2 with the dx walk over four rows at once (issue 36): the partial dgamma/dbeta rows are loaded and
    stored once per four rows, not once per row, so per 16 columns and 4 rows the walk stores 6 vectors (4 dx,
    pg, pb) instead of 12; and the float32 1/N is a float32 (rung 2's sg /= n with an integer n promotes the row
    sums to float64). Rung 2 measured ~0.6 ns per element on one core in cache against ~0.15 for a walk that
    only writes dx; predicted ~1.5x rung 2 in cache. Measured (one core, in cache, 32 x 4096 and 64 x 1024):
    1.1-1.2x, so the stores were only part of rung 2's cost; kernels asm: the 4-row walk is packed zmm."""
    layernorm_bwd_rows4(dx, dgamma, dbeta, dy, x, mean, rstd, gamma,
                        np.empty((2, _chunks(x.shape[0]), x.shape[1]), np.float32))


# Rungs "pipe" of both backward passes (issue 36): the row sums of the NEXT row are computed inside this row's dx
# walk. Rung 2 walks each row twice, the sums pass then the dx pass, and at N = 4096 a row's working set (x, dy,
# dx, gamma and the partial dgamma rows: 16 KiB each) is larger than L1, so the dx pass re-reads x and dy from L2.
# Fused, one walk per row reads this row's x and dy (from L2, loaded by the previous walk), the next row's x and dy
# (from memory) and gamma once for both: per 16 columns the loads of gamma drop from two to one, the loop overhead
# of the second walk goes, and the next row's memory reads are in flight while this row's arithmetic runs. The
# last row of a chunk "pre-sums" itself (k = i), one extra walk per chunk. The float32 1/N multiplies the sums
# (rung 2's `/ n` with an integer n makes them float64, and the whole dx walk with them).
@njit(inline="always", fastmath=REASSOC)
def _rms_bwd_row_sum(dyr, xr, gamma):
    s = np.float32(0.0)
    for j in range(xr.size):
        s += dyr[j] * gamma[j] * xr[j]
    return s


@njit(parallel=True, cache=True, fastmath=REASSOC)
def rmsnorm_bwd_rows_pipe(dx, dgamma, dy, x, rstd, gamma, parts):
    m, n = x.shape
    P = parts.shape[0]
    per = (m + P - 1) // P
    inv_n = np.float32(1.0) / np.float32(n)
    for p in prange(P):
        pg = parts[p]
        pg[:] = 0.0
        lo = p * per
        hi = min(m, (p + 1) * per)
        if lo >= hi:
            continue
        s = _rms_bwd_row_sum(dy[lo], x[lo], gamma)
        for i in range(lo, hi):
            r = rstd[i]
            xr, dyr, dxr = x[i], dy[i], dx[i]
            k = i + 1 if i + 1 < hi else i
            xn, dyn = x[k], dy[k]
            c = r * r * s * inv_n
            s = np.float32(0.0)
            for j in range(n):
                gj = gamma[j]
                dxr[j] = r * (dyr[j] * gj - xr[j] * c)
                pg[j] += dyr[j] * xr[j] * r
                s += dyn[j] * gj * xn[j]  # the next row's <dy*gamma, x>
    for j in range(n):
        a = np.float32(0.0)
        for q in range(P):
            a += parts[q, j]
        dgamma[j] = a


@njit(parallel=True, cache=True, fastmath=REASSOC)
def layernorm_bwd_rows_pipe(dx, dgamma, dbeta, dy, x, mean, rstd, gamma, parts):
    m, n = x.shape
    P = parts.shape[1]
    per = (m + P - 1) // P
    inv_n = np.float32(1.0) / np.float32(n)
    for p in prange(P):
        pg = parts[0, p]
        pb = parts[1, p]
        pg[:] = 0.0
        pb[:] = 0.0
        lo = p * per
        hi = min(m, (p + 1) * per)
        if lo >= hi:
            continue
        a, b = _ln_bwd_row_sums(dy[lo], x[lo], gamma, mean[lo], rstd[lo], inv_n)
        for i in range(lo, hi):
            mu = mean[i]
            r = rstd[i]
            xr, dyr, dxr = x[i], dy[i], dx[i]
            k = i + 1 if i + 1 < hi else i
            xn, dyn = x[k], dy[k]
            mn = mean[k]
            rn = rstd[k]
            sg = np.float32(0.0)
            sgx = np.float32(0.0)
            for j in range(n):
                gj = gamma[j]
                h = (xr[j] - mu) * r
                dxr[j] = r * (dyr[j] * gj - a - h * b)
                pg[j] += dyr[j] * h
                pb[j] += dyr[j]
                g = dyn[j] * gj  # the next row's two sums
                sg += g
                sgx += g * ((xn[j] - mn) * rn)
            a = sg * inv_n
            b = sgx * inv_n
    for j in range(n):
        a = np.float32(0.0)
        b = np.float32(0.0)
        for q in range(P):
            a += parts[0, q, j]
            b += parts[1, q, j]
        dgamma[j] = a
        dbeta[j] = b


@register("rmsnorm_bwd", "cpu", "pipe", rung=3)
def rmsnorm_bwd_pipe(dx, dgamma, dy, x, rstd, gamma):
    """Rung 2 with one walk per row instead of two (issue 36): the next row's sum <dy*gamma, x> is accumulated in
    this row's dx walk, and the sum is scaled by a float32 1/N (rung 2's `/ n` promotes the dx walk to float64).
    Rung 2 re-reads x and dy from L2 in its second walk (a row's five 16 KiB streams do not fit L1 at N = 4096).
    Predicted ~1.3x rung 2 in cache, and at 4096 x 4096 the next row's loads overlap this row's arithmetic.
    Measured (indicative, one core, in cache, alternating in one process, min of 200): 32 x 4096 1.3x,
    64 x 1024 1.4x rung 2; 512 x 4096 on 2 threads (from L3, min of 40, two runs) 1.25x rung 2. At 4096 x 4096
    the shared machine's DRAM times were too noisy to tell (the scoreboard's re-measure decides). kernels asm:
    the fused walk is packed zmm."""
    rmsnorm_bwd_rows_pipe(dx, dgamma, dy, x, rstd, gamma,
                          np.empty((_chunks(x.shape[0]), x.shape[1]), np.float32))


@register("layernorm_bwd", "cpu", "pipe", rung=4)
def layernorm_bwd_pipe(dx, dgamma, dbeta, dy, x, mean, rstd, gamma):
    """Rung 2 with one walk per row instead of two (issue 36): the next row's sums (of dy gamma and dy gamma xhat)
    are accumulated in this row's dx walk, so x and dy of a row are read from memory once and from L2 once, gamma
    once per row for both jobs, and the next row's loads are in flight while this row's arithmetic runs. Predicted
    ~1.3x rung 2 in cache. Measured (indicative, one core, in cache, alternating in one process, min of 200):
    32 x 4096 1.26x rung 2 and 1.14x rung 3; 64 x 1024 1.45x rung 2 and 1.1x rung 3 (whose 4-row walk saves the
    partial-row traffic instead); 512 x 4096 on 2 threads (from L3, min of 40, two runs) 1.34x rung 2 and 1.05x
    rung 3. kernels asm: the fused walk is packed zmm."""
    layernorm_bwd_rows_pipe(dx, dgamma, dbeta, dy, x, mean, rstd, gamma,
                            np.empty((2, _chunks(x.shape[0]), x.shape[1]), np.float32))


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
