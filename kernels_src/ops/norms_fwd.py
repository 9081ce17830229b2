"""LayerNorm and RMSNorm forward on the GPU (chapter 7): the ladder, its tuning constants and torch's yardstick.

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

Precision: variance is computed around the mean (two passes over values already in registers), never
as E[x^2] - E[x]^2, which cancels catastrophically when |mean| >> std. float32 kernels still overflow
when x^2 does (|x| > ~1.8e19); the reference, in float64, does not. The tuning constants here (also the
backward's BWD_VEC_PER_THREAD, which apply_tuning sets from the same file) are read when a kernel launches:
set them on this module (tests set ROWS_IN_SIM to run several rows per block in the simulator).
"""
import math

from ..compiler import cuda, float32, load4, store4
from .. import device
from ..device import ceil_div, needs_real_gpu
from ..registry import register
from .reductions import (row_jit, ONE, ZERO, torch_view, next_pow2, block_sum_smem, block_welford_smem, row_config,
                         row_threads_streaming, torch_gpu, warp_sum, warp_welford)
from .norms_ref import EPS, EPS32


THREADS = None  # block size of the register rungs (None: from the row length and PER_THREAD)
# Register-rung configuration, chosen by measurement (python -m kernels_src.figures.rowwise bench --explore
# --autotune on the GPU of book/data/bench/; see explore_gpu.json there): LayerNorm is fastest with 32
# values per thread (N = 4096: 128 threads), RMSNorm with 8 values per thread and 2 rows per block.
PER_THREAD = {"ln": 32, "rms": 8}  # target values per thread in the register rungs
ROWS = {"ln": 1, "rms": 2}  # rows per block in the real-GPU register rungs
ROWS_IN_SIM = False  # tests set this to exercise ROWS > 1 in the simulator
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


BWD_VEC_PER_THREAD = {"ln": 8, "rms": 8}  # target values per thread (N = 4096: 512 threads x 2 groups)


apply_tuning()
