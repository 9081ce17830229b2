"""LayerNorm and RMSNorm backward on the GPU (chapter 7).

  gpu/stream      rung 1   any row length: strips of rows per block, two walks per row, partial
                           dgamma/dbeta rows in global memory; the register rungs fall back to it
  gpu/regs        rung 2   kernel 1: blocks own every G-th row, compute dx and keep per-column partial
                           dgamma/dbeta in registers; kernel 2: sums the partials over the blocks
  gpu/regs_shfl   rung 3   rung 2 with warp-shuffle row sums and twice the blocks per SM (real GPU only)
  gpu/vec4        rung 4   strips of consecutive rows, one block per resident slot, 16-byte accesses,
                           the next row loaded before this one is reduced; a column-sum kernel after

BWD_REG_MAX_N (rows longer than it take the streaming kernel) is read at launch: tests set it on this module.
"""
import numpy as np

from ..compiler import cuda, float32, load4, store4
from .. import device
from ..device import ceil_div, needs_real_gpu
from ..registry import register
from .reductions import (row_jit, ONE, ZERO, next_pow2, block_sum2_shfl, block_sum2_smem, block_sum_shfl,
                         block_sum_smem, row_config, row_threads_streaming, warp_sum)
from .norms_fwd import BWD_VEC_PER_THREAD, _aligned16, _num_sms, vec_config


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
