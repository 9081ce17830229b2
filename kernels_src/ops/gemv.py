"""gemv: matrix-vector products, the inner loop of single-token decoding (chapter 4).

Two ops, because the layout of W decides everything:
  gemv     y = x W    x (K,), W (K,N) row-major        -> y (N,)   y[n] = sum_k x[k] W[k,n]
  gemv_wx  y = W x    W (N,K) row-major (nn.Linear)    -> y (N,)   y[n] = sum_k W[n,k] x[k]
Sizes are written (K, N) for both.

Cost: 2*K*N FLOPs; every element of W is read exactly once, so at least (K*N + K + N) * 4 bytes
move. That is 2 FLOPs per 4 bytes, 0.5 FLOP/byte: far below any machine's ridge point, so a GEMV is
memory-bound and judged in GB/s against a plain copy of the same size.

Ladder
  gemv     cpu/numpy          baseline  numpy.dot(x, W): BLAS sgemv
  gemv     cpu/colorder       rung 1    one dot product per y[n], walking W down a column (stride N)
  gemv     cpu/roworder       rung 2    y += x[k] * W[k, :] for each k: every access stride 1
  gemv     cpu/prange         rung 3    row order, rows of W split over cores (a private y each)
  gemv     cpu/rows4_prange   rung 4    4 rows per pass over 2048-column blocks of the partial y
  gemv     cpu/rows8_prange   rung 5    8 rows per pass over whole rows: longer, more streams per core
  gemv_wx  cpu/numpy          baseline  W @ x: BLAS sgemv
  gemv_wx  cpu/rowdot         rung 1    one contiguous dot product per row of W
  gemv_wx  cpu/prange         rung 2    rows split over cores
  gemv_wx  cpu/torch          baseline  torch.mv(W, x, out=y) on the CPU (MKL/oneDNN sgemv), where torch is installed
  gemv_wx  cpu/rows4_prange   rung 3    4 rows per step share each x load; one contiguous half of W per core
  gemv_wx  gpu/torch          baseline  torch.mv(W, x): cuBLAS's GEMV
  gemv_wx  gpu/thread_per_row rung 1    one thread per output: lanes of a warp read addresses K*4 bytes apart
  gemv_wx  gpu/warp_per_row   rung 2    one warp per output, 8 rows per block: lanes read adjacent k, warp
                                        sum by shuffles (real GPU only)
  gemv_wx  gpu/warp_per_row_smem  2     the same loads, warp sum through shared memory (runs in the simulator)
  gemv_wx  gpu/block_per_row  rung 3    one block per output: lanes read adjacent k, tree-sum in shared memory
  gemv_wx  gpu/warp_per_row_vec4  4     rung 2 with 16-byte loads (vec.load4), 4 of them in flight per lane
  gemv     gpu/torch          baseline  torch.matmul(x, W): cuBLAS's GEMV
  gemv     gpu/thread_per_col rung 1    the coalescing-correct layout: W (K,N), lanes take adjacent columns
  gemv     gpu/splitk         rung 2    a block per 32 columns, 16 K-slices each, tree-sum in shared memory
  gemv     gpu/splitk_grid    rung 3    K also split over blocks (512 rows each), partial sums added with atomics

thread_per_row (y = W x) and thread_per_col (y = x W) launch the same N threads; one is uncoalesced, the
other coalesced: they isolate coalescing. thread_per_row and warp_per_row read the same layout; the second
launches 32 times more threads: they isolate parallelism.
"""
import math

import numpy as np
from ..compiler import cuda, float32, get_num_threads, load4, njit, prange

from ..device import ceil_div, needs_real_gpu
from ..registry import define_op, register
from .cpu_baselines import torch_cpu, tviews
from .reductions import torch_gpu, torch_view

EPS32 = float(np.finfo(np.float32).eps)


def ref_xw(x, W):
    """float64 oracle: y = x W."""
    return x @ W


def ref_wx(W, x):
    """float64 oracle: y = W x."""
    return W @ x


def inputs_xw(size, dtype, rng):
    K, N = size
    return rng.standard_normal(K).astype(dtype), rng.standard_normal((K, N)).astype(dtype)


def inputs_wx(size, dtype, rng):
    K, N = size
    return rng.standard_normal((N, K)).astype(dtype), rng.standard_normal(K).astype(dtype)


def gemv_tol(size, dtype):
    """A K-term float32 dot product of unit normals has size ~sqrt(K); its rounding errors add up like a
    random walk to ~eps*K/sqrt(2). atol = 4*eps*K covers that (and results near zero), rtol 1e-5 the
    rest. A skipped block of 8 terms is off by ~sqrt(8): the check can still fail."""
    if np.dtype(dtype) != np.float32:
        return None
    K = size[0]
    return 1e-5 + 4 * EPS32 * math.sqrt(K), 1e-6 + 4 * EPS32 * K


SIZES = {
    "check": [(1, 1), (7, 3), (1, 129), (129, 1), (257, 33), (1000, 999), (4099, 513), (4100, 67)],
    "check_sim": [(1, 1), (7, 3), (33, 17), (1100, 40)],
    "bench": [(1024, 1024), (4096, 4096), (8192, 8192)],
    "bench_gpu": [(4096, 4096), (8192, 8192), (16384, 16384)],
    "bench_sim": [(33, 17)],
}
_flops = lambda s: 2 * s[0] * s[1]  # noqa: E731
_bytes = lambda s, b: (s[0] * s[1] + s[0] + s[1]) * b  # noqa: E731

define_op("gemv", reference=ref_xw, make_inputs=inputs_xw, chapter=4, title="GEMV: y = x W (W is K x N)",
          size_names=("K", "N"), kind="memory", output_names=("y",), tol=gemv_tol,
          flops=_flops, bytes=_bytes, sizes=SIZES)
define_op("gemv_wx", reference=ref_wx, make_inputs=inputs_wx, chapter=4,
          title="GEMV: y = W x (W is N x K, the nn.Linear layout)",
          size_names=("K", "N"), kind="memory", output_names=("y",), tol=gemv_tol,
          flops=_flops, bytes=_bytes, sizes=SIZES)


# ============================================================================= CPU: y = x W
@register("gemv", "cpu", "numpy", baseline=True)
def gemv_numpy(y, x, W):
    """numpy.dot(x, W): OpenBLAS sgemv, vectorised and multi-threaded."""
    np.dot(x, W, out=y)


@register("gemv", "cpu", "torch", baseline=True, requires=torch_cpu)
def gemv_torch_cpu(y, x, W):
    """torch on the CPU: ``torch.matmul(x, W, out=y)`` (its BLAS GEMV)."""
    import torch

    ty, tx, tW = tviews(y, x, W)
    torch.matmul(tx.view(1, -1), tW, out=ty.view(1, -1))  # (1, K) @ (K, N): out has matmul's shape, no resize


@njit(fastmath=True, cache=True)
def _colorder(y, x, W):
    K, N = W.shape
    for n in range(N):
        acc = np.float32(0.0)
        for k in range(K):
            acc += x[k] * W[k, n]  # consecutive k: N*4 bytes apart, a new cache line every time
        y[n] = acc


@register("gemv", "cpu", "colorder", rung=1)
def gemv_colorder(y, x, W):
    """Column order: a dot product down each column of W (stride N).

    Column order: y[n] as a dot product down column n of W. Each load uses 4 bytes of a 64-byte line,
    and the line is gone by the time n+1 wants its neighbour (for large K). Predicted: a few GB/s, a
    small fraction of copy bandwidth."""
    _colorder(y, x, W)


@njit(fastmath=True, cache=True)
def _roworder(y, x, W, n0, n1):
    K = W.shape[0]
    ys = y[n0:n1]  # slices, indexed from 0: Numba can prove every index >= 0 and vectorise
    ys[:] = 0.0
    for k in range(K):
        a = x[k]
        w = W[k, n0:n1]  # row k of W, contiguous
        for j in range(n1 - n0):
            ys[j] += a * w[j]  # stride 1 everywhere: vectorised, whole cache lines


@register("gemv", "cpu", "roworder", rung=2)
def gemv_roworder(y, x, W):
    """Row order: y += x[k] * W[k, :] for each k (stride 1).

    Row order: for each k, y += x[k] * (row k of W). W streams through once, front to back, and y
    (N floats) stays in cache. Predicted: close to one core's streaming bandwidth."""
    _roworder(y, x, W, 0, W.shape[1])


@njit(fastmath=True, parallel=True, cache=True)
def _roworder_par(y, x, W, threads):
    K, N = W.shape
    T = min(threads, max(K, 1))
    parts = np.zeros((T, N), dtype=np.float32)  # one private copy of y per thread: no races
    step = (K + T - 1) // T
    for t in prange(T):  # thread t streams rows t*step .. t*step+step-1 of W, whole rows at a time
        p = parts[t]
        for k in range(t * step, min(t * step + step, K)):
            a = x[k]
            w = W[k]
            for j in range(N):
                p[j] += a * w[j]
    for j in range(N):
        acc = np.float32(0.0)
        for t in range(T):
            acc += parts[t, j]
        y[j] = acc


@register("gemv", "cpu", "prange", rung=3)
def gemv_prange(y, x, W):
    """Row order with the rows of W split over cores, each summing into a private copy of y.

    Each core streams whole rows of its share of W (long, prefetch-friendly reads), adding into its own
    y; the copies are added at the end (N*T extra adds, nothing next to K*N). Splitting columns
    instead would make every core read short pieces of every row. Predicted: up to 2x on 2 cores,
    if one core could not saturate memory alone."""
    _roworder_par(y, x, W, get_num_threads())


# ============================================================================= CPU: y = W x
GEMV_NB = 2048  # columns per block of rung 4: 8 KiB of the partial y stays in L1 while 4 rows stream past it


@njit(fastmath={"contract"}, parallel=True, cache=True)
def _rows4_blocked_par(y, x, W, threads):
    K, N = W.shape
    T = min(threads, max(K, 1))
    parts = np.zeros((T, N), dtype=np.float32)  # a private partial y per thread: no races
    step = (K + T - 1) // T
    for t in prange(T):  # thread t owns rows k0..k1-1 of W, a contiguous slab
        k0 = t * step
        k1 = min(K, k0 + step)
        p = parts[t]
        for j0 in range(0, N, GEMV_NB):
            j1 = min(N, j0 + GEMV_NB)
            nb = j1 - j0
            pb = p[j0:j1]  # slices indexed from 0: Numba can prove every index >= 0, so LLVM vectorizes
            k = k0
            while k + 4 <= k1:  # four rows per pass: pb[j] is loaded and stored once for 4 FMAs
                a0 = x[k]
                a1 = x[k + 1]
                a2 = x[k + 2]
                a3 = x[k + 3]
                w0 = W[k, j0:j1]
                w1 = W[k + 1, j0:j1]
                w2 = W[k + 2, j0:j1]
                w3 = W[k + 3, j0:j1]
                for j in range(nb):
                    pb[j] += a0 * w0[j] + a1 * w1[j] + a2 * w2[j] + a3 * w3[j]
                k += 4
            while k < k1:
                a0 = x[k]
                w0 = W[k, j0:j1]
                for j in range(nb):
                    pb[j] += a0 * w0[j]
                k += 1
    for j in range(N):
        acc = np.float32(0.0)
        for t in range(T):
            acc += parts[t, j]
        y[j] = acc


@register("gemv", "cpu", "rows4_prange", rung=4)
def gemv_rows4_prange(y, x, W):
    """Rung 3 with four rows of W per pass over a 2048-column block of the partial y (issue 36).

    Rung 3 loads and stores its partial y[j] once per weight: two memory operations besides the weight for
    each FMA, and a 32 KiB partial row that does not stay in L1 next to the stream. Here each thread walks its
    contiguous slab of rows four at a time over 8 KiB column blocks: 4 weight loads, 1 load and 1 store of
    p[j] per 4 FMAs, with p's block hot in L1. W is still read exactly once. Fastmath is only "contract"
    (FMAs; NaN and inf behave as in the reference). Predict: the 2 cores' share of copy bandwidth on 4 bytes
    per weight, at or above NumPy's BLAS sgemv (rung 3: ~0.75x NumPy)."""
    _rows4_blocked_par(y, x, W, get_num_threads())


GEMV_NB8 = 8192  # columns per block of rung 5: whole rows of W up to N = 8192, a 32 KiB partial y


@njit(fastmath={"contract"}, parallel=True, cache=True)
def _rows8_par(y, x, W, threads):
    K, N = W.shape
    T = min(threads, max(K, 1))
    parts = np.zeros((T, N), dtype=np.float32)  # a private partial y per thread: no races
    step = (K + T - 1) // T
    for t in prange(T):  # thread t owns rows k0..k1-1 of W, a contiguous slab
        k0 = t * step
        k1 = min(K, k0 + step)
        p = parts[t]
        for j0 in range(0, N, GEMV_NB8):
            j1 = min(N, j0 + GEMV_NB8)
            nb = j1 - j0
            pb = p[j0:j1]
            k = k0
            while k + 8 <= k1:  # eight rows per pass: 8 long streams of W, pb[j] loaded and stored once per 8 FMAs
                a0, a1, a2, a3 = x[k], x[k + 1], x[k + 2], x[k + 3]
                a4, a5, a6, a7 = x[k + 4], x[k + 5], x[k + 6], x[k + 7]
                w0, w1, w2, w3 = W[k, j0:j1], W[k + 1, j0:j1], W[k + 2, j0:j1], W[k + 3, j0:j1]
                w4, w5, w6, w7 = W[k + 4, j0:j1], W[k + 5, j0:j1], W[k + 6, j0:j1], W[k + 7, j0:j1]
                for j in range(nb):
                    pb[j] += (((a0 * w0[j] + a1 * w1[j]) + (a2 * w2[j] + a3 * w3[j]))
                              + ((a4 * w4[j] + a5 * w5[j]) + (a6 * w6[j] + a7 * w7[j])))
                k += 8
            while k < k1:
                a0 = x[k]
                w0 = W[k, j0:j1]
                for j in range(nb):
                    pb[j] += a0 * w0[j]
                k += 1
    for j in range(N):
        acc = np.float32(0.0)
        for t in range(T):
            acc += parts[t, j]
        y[j] = acc


@register("gemv", "cpu", "rows8_prange", rung=5)
def gemv_rows8_prange(y, x, W):
    """Rung 4 with eight rows of W per pass over whole rows (blocks of 8192 columns, not 2048).

    A core's read rate is set by how many cache-line fetches it keeps in flight, and the hardware prefetcher
    fetches ahead along each stream it sees. Rung 4 reads 4 rows in 8 KiB pieces, then jumps to the next
    4 rows: short streams, each restarted 4 times per row. Here each pass reads 8 rows start to end (32 KiB
    each at N = 8192): twice the streams, four times longer, and 1 load + 1 store of the partial y per 8 FMAs
    (rung 4: per 4). The 32 KiB partial y no longer stays in L1 beside the streams; it comes from L2, which
    serves it far faster than DRAM serves W. Measured on one core (CPU time, in one process, alternating):
    rung 4 14.0 GB/s, this rung 15.7, torch 15.8. Predicted: ~1.1x rung 4, level with torch on 2 cores."""
    _rows8_par(y, x, W, get_num_threads())


@register("gemv_wx", "cpu", "numpy", baseline=True)
def gemv_wx_numpy(y, W, x):
    """W @ x: OpenBLAS sgemv (transposed case)."""
    np.dot(W, x, out=y)


@njit(fastmath=True, cache=True)
def _rowdot(y, W, x, n0, n1):
    K = W.shape[1]
    for n in range(n0, n1):
        w = W[n]  # row n, contiguous
        acc = np.float32(0.0)
        for k in range(K):
            acc += w[k] * x[k]  # fastmath lets LLVM split the sum over vector lanes
        y[n] = acc


@register("gemv_wx", "cpu", "rowdot", rung=1)
def gemv_wx_rowdot(y, W, x):
    """One dot product per row of W: in this layout the natural loop order is already stride 1.
    Predicted: close to one core's streaming bandwidth, like gemv/roworder."""
    _rowdot(y, W, x, 0, W.shape[0])


@njit(fastmath=True, parallel=True, cache=True)
def _rowdot_par(y, W, x):
    N = W.shape[0]
    for b in prange((N + 63) // 64):
        _rowdot(y, W, x, b * 64, min(b * 64 + 64, N))


@register("gemv_wx", "cpu", "prange", rung=2)
def gemv_wx_prange(y, W, x):
    """Blocks of 64 rows spread over cores with prange.

    Rows in blocks of 64 spread over cores. Predicted: up to 2x on 2 cores."""
    _rowdot_par(y, W, x)



@register("gemv_wx", "cpu", "torch", baseline=True, requires=torch_cpu)
def gemv_wx_torch_cpu(y, W, x):
    """torch.mv(W, x, out=y) on the CPU, writing into y without a copy, with Numba's thread count."""
    import torch

    ty, tW, tx = tviews(y, W, x)
    torch.mv(tW, tx, out=ty)


@njit(fastmath=True, cache=True)
def _rows4(y, W, x, n0, n1):
    # rows n0..n1-1 of W (N,K), four at a time: each x[k] loaded once for 4 FMAs, 4 streams of W in flight
    K = W.shape[1]
    n = n0
    while n + 4 <= n1:
        a0 = np.float32(0.0)
        a1 = np.float32(0.0)
        a2 = np.float32(0.0)
        a3 = np.float32(0.0)
        for k in range(K):
            xv = x[k]
            a0 += W[n, k] * xv
            a1 += W[n + 1, k] * xv
            a2 += W[n + 2, k] * xv
            a3 += W[n + 3, k] * xv
        y[n] = a0
        y[n + 1] = a1
        y[n + 2] = a2
        y[n + 3] = a3
        n += 4
    _rowdot(y, W, x, n, n1)


@njit(fastmath=True, parallel=True, cache=True)
def _rows4_par(y, W, x, threads):
    N = W.shape[0]
    step = (N + threads - 1) // threads
    for t in prange(threads):
        _rows4(y, W, x, min(N, t * step), min(N, (t + 1) * step))


@register("gemv_wx", "cpu", "rows4_prange", rung=3)
def gemv_wx_rows4_prange(y, W, x):
    """Four rows per step, and one contiguous slice of rows per core.

    Rung 2 loads x[k] once per weight: 2 loads per FMA, and one stream of W per core. Here each x[k]
    serves 4 rows (1.25 loads per FMA) and each core walks 4 rows at once (4 streams for the hardware
    prefetcher), over one contiguous slice of W instead of interleaved blocks of 64 rows. The work per byte
    is unchanged, so the gain is in how close the loads come to DRAM's rate. Predicted: ~75 % of the copy
    bandwidth (a GEMV only reads; the copy also writes), 1.0-1.1x BLAS."""
    _rows4_par(y, W, x, get_num_threads())

# ============================================================================= GPU
SIG_WX = "void(float32[::1], float32[:, ::1], float32[::1])"
SIG_XW = "void(float32[::1], float32[::1], float32[:, ::1])"
THREADS = 256


@cuda.jit(fastmath=True)
def thread_per_row_kernel(y, W, x):
    n = cuda.grid(1)
    if n < y.size:
        acc = float32(0.0)
        for k in range(x.size):
            acc += W[n, k] * x[k]  # lanes n, n+1, ...: addresses K*4 bytes apart: 32 sectors per load
        y[n] = acc


@register("gemv_wx", "gpu", "thread_per_row", rung=1, ptx=[(thread_per_row_kernel, SIG_WX)])
def gemv_wx_thread_per_row(y, W, x):
    """One thread per output row: a warp reads addresses K*4 bytes apart (uncoalesced).

    One thread per output row. A warp's 32 loads W[n..n+31, k] are K*4 bytes apart: each uses 4 bytes
    of its own 32-byte sector, and the L1 only rescues this while 32 rows' worth of sectors stay cached.
    Predicted: well under half of copy bandwidth."""
    thread_per_row_kernel[ceil_div(y.size, THREADS), THREADS](y, W, x)


@cuda.jit(fastmath=True)
def block_per_row_kernel(y, W, x):
    n = cuda.blockIdx.x
    t = cuda.threadIdx.x
    K = x.size
    part = cuda.shared.array(THREADS, float32)
    acc = float32(0.0)
    for k in range(t, K, THREADS):  # lanes take adjacent k: each warp load is 128 contiguous bytes
        acc += W[n, k] * x[k]
    part[t] = acc
    cuda.syncthreads()
    s = THREADS // 2
    while s > 0:  # tree: 256 partial sums -> 128 -> ... -> 1
        if t < s:
            part[t] += part[t + s]
        cuda.syncthreads()
        s //= 2
    if t == 0:
        y[n] = part[0]


@register("gemv_wx", "gpu", "block_per_row", rung=3, ptx=[(block_per_row_kernel, SIG_WX)])
def gemv_wx_block_per_row(y, W, x):
    """One block of 256 threads per output row, tree sum in shared memory (coalesced).

    One block of 256 threads per output row: the threads stride along the row together (coalesced),
    then add their 256 partial sums in shared memory in 8 halving steps. Predicted: near copy
    bandwidth for long rows; for short rows (K < a few thousand) the reduction and the block
    start-up dominate."""
    block_per_row_kernel[y.size, THREADS](y, W, x)


WPR_WARPS = 8  # warp_per_row: rows (warps) per block of 256 threads


@cuda.jit(device=True, inline=True)
def warp_sum_shfl(acc):
    """The sum of acc over the 32 lanes of a warp, in lane 0: five shuffle-down steps, no shared memory,
    no barrier (lane i adds lane i+16's value, then i+8's, ...)."""
    off = 16
    while off > 0:
        acc += cuda.shfl_down_sync(0xFFFFFFFF, acc, off)
        off //= 2
    return acc


@cuda.jit(fastmath=True)
def warp_per_row_kernel(y, W, x):
    lane = cuda.threadIdx.x % 32
    n = cuda.blockIdx.x * WPR_WARPS + cuda.threadIdx.x // 32  # this warp's row
    if n < y.size:  # the whole warp takes the same branch: the shuffles below see all 32 lanes
        acc = float32(0.0)
        for k in range(lane, x.size, 32):  # lanes take adjacent k: 128 contiguous bytes per warp load
            acc += W[n, k] * x[k]
        acc = warp_sum_shfl(acc)
        if lane == 0:
            y[n] = acc


def _wpr_grid(N, warps):
    return max(1, ceil_div(N, warps)), warps * 32


@register("gemv_wx", "gpu", "warp_per_row", rung=2, ptx=[(warp_per_row_kernel, SIG_WX)], requires=needs_real_gpu)
def gemv_wx_warp_per_row(y, W, x):
    """One warp per output row, 8 rows per block, lanes striding the row (coalesced), a shuffle warp sum.

    One warp per output row, 8 rows per block: the warp's lanes stride along the row together, so
    each warp load is 128 contiguous bytes (coalesced, like block_per_row), and the 32 partial sums are
    added with five warp shuffles. Against thread_per_row this changes the parallelism (32 threads per
    row instead of 1: N/8 blocks, 512 at N = 4096, instead of N/256 = 16) as well as the coalescing;
    against thread_per_col (coalesced, N threads) only the parallelism. Predicted: at 4096x4096
    about 10x thread_per_row and within 20 % of block_per_row (about 60 % of copy), since each lane
    still has one or two 4-byte loads in flight; close to block_per_row at 16384x16384 too."""
    warp_per_row_kernel[_wpr_grid(y.size, WPR_WARPS)](y, W, x)


@cuda.jit(fastmath=True)
def warp_per_row_smem_kernel(y, W, x):
    lane = cuda.threadIdx.x % 32
    w = cuda.threadIdx.x // 32
    n = cuda.blockIdx.x * WPR_WARPS + w
    part = cuda.shared.array((WPR_WARPS, 32), float32)  # one row of 32 partial sums per warp
    acc = float32(0.0)
    if n < y.size:
        for k in range(lane, x.size, 32):
            acc += W[n, k] * x[k]
    part[w, lane] = acc
    cuda.syncthreads()  # every thread of the block reaches every barrier: no early return above
    s = 16
    while s > 0:  # 32 -> 16 -> ... -> 1 partial sums per warp
        if lane < s:
            part[w, lane] += part[w, lane + s]
        cuda.syncthreads()
        s //= 2
    if lane == 0 and n < y.size:
        y[n] = part[w, 0]


@register("gemv_wx", "gpu", "warp_per_row_smem", rung=2, ptx=[(warp_per_row_smem_kernel, SIG_WX)])
def gemv_wx_warp_per_row_smem(y, W, x):
    """warp_per_row with the warp sum done in shared memory (the simulator's twin of the shuffle rung).

    warp_per_row's loads, with the 32 partial sums of each warp added in shared memory (5 halving
    steps, a block barrier after each) instead of by shuffles: this version also runs in the CUDA
    simulator. Predicted: within 5 % of warp_per_row, since the sum is done once per row of K
    elements and the loads dominate."""
    warp_per_row_smem_kernel[_wpr_grid(y.size, WPR_WARPS)](y, W, x)


V4_WARPS = 4  # warp_per_row_vec4: rows (warps) per block of 128 threads


@cuda.jit(device=True, inline=True)
def dot4(a, b):
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2] + a[3] * b[3]


_V4_KERNELS: dict = {}


def vec4_kernel(shfl: bool = True, warps: int = V4_WARPS):
    """The warp-per-row kernel with 16-byte loads, ``warps`` rows per block. shfl=True sums each warp with
    shuffles (real GPU); shfl=False through shared memory, which the simulator runs (the tests use it to
    check the indexing). Needs K % 4 == 0 (each row then starts on a 16-byte boundary); the launcher
    falls back to scalar loads otherwise."""
    key = (shfl, warps)
    if key in _V4_KERNELS:
        return _V4_KERNELS[key]

    @cuda.jit(fastmath=True)
    def warp_per_row_vec4_kernel(y, W, x):
        lane = cuda.threadIdx.x % 32
        w = cuda.threadIdx.x // 32
        n = cuda.blockIdx.x * warps + w
        K4 = x.size // 4  # groups of 4 floats in a row (K % 4 == 0)
        acc = float32(0.0)
        if n < y.size:
            r = n * K4  # row n of W, counted in groups of 4 floats from the start of the buffer
            g = lane
            while g + 96 < K4:  # groups g, g+32, g+64, g+96 of the row: a warp reads 4 x 512 bytes
                w0 = load4(W, r + g)  # four 16-byte loads issued before the first multiply needs one:
                w1 = load4(W, r + g + 32)  # 64 bytes in flight per lane
                w2 = load4(W, r + g + 64)
                w3 = load4(W, r + g + 96)
                acc += dot4(w0, load4(x, g)) + dot4(w1, load4(x, g + 32))  # x: re-read by every row, from L1/L2
                acc += dot4(w2, load4(x, g + 64)) + dot4(w3, load4(x, g + 96))
                g += 128
            while g < K4:  # the row's last groups (fewer than 128 left)
                acc += dot4(load4(W, r + g), load4(x, g))
                g += 32
        if shfl:
            acc = warp_sum_shfl(acc)
            if lane == 0 and n < y.size:
                y[n] = acc
        else:  # the simulator's path: the warp sum through shared memory, every thread at every barrier
            part = cuda.shared.array((warps, 32), float32)
            part[w, lane] = acc
            cuda.syncthreads()
            s = 16
            while s > 0:
                if lane < s:
                    part[w, lane] += part[w, lane + s]
                cuda.syncthreads()
                s //= 2
            if lane == 0 and n < y.size:
                y[n] = part[w, 0]

    _V4_KERNELS[key] = warp_per_row_vec4_kernel
    return warp_per_row_vec4_kernel


def _aligned16(a) -> bool:
    """Whether an array's data starts on a 16-byte boundary (device arrays: 256-byte aligned)."""
    iface = getattr(a, "__cuda_array_interface__", None)
    ptr = iface["data"][0] if iface is not None else a.__array_interface__["data"][0]
    return ptr % 16 == 0


def launch_vec4(y, W, x, shfl: bool = True, warps: int = V4_WARPS):
    """warp_per_row_vec4, or its scalar-load twin when 16-byte loads would be misaligned (K % 4 != 0, or
    an array not starting on a 16-byte boundary)."""
    K = x.size
    if K % 4 or not (_aligned16(W) and _aligned16(x)):
        kern = warp_per_row_kernel if shfl else warp_per_row_smem_kernel
        kern[_wpr_grid(y.size, WPR_WARPS)](y, W, x)
        return
    vec4_kernel(shfl, warps)[_wpr_grid(y.size, warps)](y, W, x)


@register("gemv_wx", "gpu", "warp_per_row_vec4", rung=4, requires=needs_real_gpu,
          ptx=[(vec4_kernel(True), SIG_WX)])
def gemv_wx_warp_per_row_vec4(y, W, x):
    """warp_per_row with 16-byte loads (vec.load4), 4 in flight per lane, 4 rows per block.

    warp_per_row with 16-byte loads: each lane loads 4 adjacent floats at once (ld.global.v4.f32), so
    a warp load covers 512 contiguous bytes, and each lane issues 4 such loads before it needs the
    first, 64 bytes in flight per lane instead of 4-8. Blocks of 4 rows give 1024 blocks at
    N = 4096, all resident at once on 132 SMs. K % 4 != 0 (rows not on 16-byte boundaries) falls back
    to warp_per_row. Predicted: at least 85 % of copy at 4096x4096 and at 16384x16384: about 4096 x 32
    x 64 bytes = 8 MB in flight, more than the ~3 MB that Little's law asks for (3 TB/s x ~1 us)."""
    launch_vec4(y, W, x, shfl=True)


@register("gemv_wx", "gpu", "torch", baseline=True, requires=torch_gpu)
def gemv_wx_torch(y, W, x):
    """torch.mv(W, x, out=y): cuBLAS's single-precision GEMV, writing into our output buffer."""
    import torch

    torch.mv(torch_view(W), torch_view(x), out=torch_view(y))



@cuda.jit(fastmath=True)
def thread_per_col_kernel(y, x, W):
    n = cuda.grid(1)
    if n < y.size:
        acc = float32(0.0)
        for k in range(x.size):
            acc += x[k] * W[k, n]  # lanes take adjacent n: one 128-byte load per warp per k
        y[n] = acc


@register("gemv", "gpu", "thread_per_col", rung=1, ptx=[(thread_per_col_kernel, SIG_XW)])
def gemv_thread_per_col(y, x, W):
    """The coalescing-correct layout: W (K,N), one thread per column.

    The coalescing-correct layout: store W as (K, N) and give each thread one column. Now a warp
    reads W[k, n..n+31], 128 contiguous bytes, and no reduction is needed. Predicted: near copy
    bandwidth when N is large; with N = 4096 there are only 4096 threads (~1 warp per SM
    scheduler), too few loads in flight to cover DRAM latency."""
    thread_per_col_kernel[ceil_div(y.size, THREADS), THREADS](y, x, W)


SK_COLS, SK_SLICES = 32, 16  # a block: 32 adjacent columns x 16 slices of K (512 threads)


@cuda.jit(fastmath=True)
def splitk_kernel(y, x, W):
    tx = cuda.threadIdx.x  # column within the block's 32
    ty = cuda.threadIdx.y  # which K-slice
    n = cuda.blockIdx.x * SK_COLS + tx
    K = x.size
    part = cuda.shared.array((SK_SLICES, SK_COLS), float32)
    acc = float32(0.0)
    if n < y.size:
        for k in range(ty, K, SK_SLICES):
            acc += x[k] * W[k, n]  # still 128 contiguous bytes per warp
    part[ty, tx] = acc
    cuda.syncthreads()
    s = SK_SLICES // 2
    while s > 0:
        if ty < s:
            part[ty, tx] += part[ty + s, tx]
        cuda.syncthreads()
        s //= 2
    if ty == 0 and n < y.size:
        y[n] = part[0, tx]


@register("gemv", "gpu", "splitk", rung=2, ptx=[(splitk_kernel, SIG_XW)])
def gemv_splitk(y, x, W):
    """Split K 16 ways inside a block of 32 columns, partial sums added in shared memory.

    16x more threads: each block takes 32 columns and splits K 16 ways, then sums the 16 partial
    results in shared memory. Same coalesced loads, 16x more of them in flight. Predicted: near copy
    bandwidth even for N = 4096."""
    splitk_kernel[ceil_div(y.size, SK_COLS), (SK_COLS, SK_SLICES)](y, x, W)


SKG_CHUNK = 512  # K rows per block in the split-K grid


@cuda.jit
def zero_kernel(y):
    i = cuda.grid(1)
    if i < y.size:
        y[i] = 0.0


@cuda.jit(fastmath=True)
def splitk_grid_kernel(y, x, W):
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    n = cuda.blockIdx.x * SK_COLS + tx
    k0 = cuda.blockIdx.y * SKG_CHUNK  # this block's slice of K
    k1 = min(k0 + SKG_CHUNK, x.size)
    part = cuda.shared.array((SK_SLICES, SK_COLS), float32)
    acc = float32(0.0)
    if n < y.size:
        for k in range(k0 + ty, k1, SK_SLICES):
            acc += x[k] * W[k, n]
    part[ty, tx] = acc
    cuda.syncthreads()
    s = SK_SLICES // 2
    while s > 0:
        if ty < s:
            part[ty, tx] += part[ty + s, tx]
        cuda.syncthreads()
        s //= 2
    if ty == 0 and n < y.size:
        cuda.atomic.add(y, n, part[0, tx])  # several blocks add into the same y[n]


@register("gemv", "gpu", "splitk_grid", rung=3, ptx=[(zero_kernel, "void(float32[::1])"),
                                                      (splitk_grid_kernel, SIG_XW)])
def gemv_splitk_grid(y, x, W):
    """Split K across blocks too (512 rows each), partial sums added with atomics.

    Split K across blocks as well: a 2D grid of (N/32) x (K/512) blocks, each summing 512 rows of
    its 32 columns and adding the result into y with one atomic add per column (y is zeroed first,
    by a second tiny kernel). At K = N = 4096 that is 1024 blocks instead of 128, enough to fill
    every SM several times. Predicted: close to copy bandwidth at every size; the float sums now
    happen in a run-to-run varying order (still within tolerance)."""
    zero_kernel[ceil_div(y.size, THREADS), THREADS](y)
    splitk_grid_kernel[(ceil_div(y.size, SK_COLS), ceil_div(x.size, SKG_CHUNK)), (SK_COLS, SK_SLICES)](y, x, W)


@register("gemv", "gpu", "torch", baseline=True, requires=torch_gpu)
def gemv_torch(y, x, W):
    """torch.matmul(x, W, out=y): cuBLAS's single-precision GEMV (transposed case), into our buffer."""
    import torch

    torch.matmul(torch_view(x), torch_view(W), out=torch_view(y))
