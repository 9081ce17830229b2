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
  gemv_wx  cpu/numpy          baseline  W @ x: BLAS sgemv
  gemv_wx  cpu/rowdot         rung 1    one contiguous dot product per row of W
  gemv_wx  cpu/prange         rung 2    rows split over cores
  gemv_wx  gpu/thread_per_row rung 1    one thread per output: lanes of a warp read addresses K*4 bytes apart
  gemv_wx  gpu/block_per_row  rung 2    one block per output: lanes read adjacent k, tree-sum in shared memory
  gemv     gpu/thread_per_col rung 3    the coalescing-correct layout: W (K,N), lanes take adjacent columns
  gemv     gpu/splitk         rung 4    a block per 32 columns, 16 K-slices each, tree-sum in shared memory
  gemv     gpu/splitk_grid    rung 5    K also split over blocks (512 rows each), partial sums added with atomics
"""
import math

import numpy as np
from numba import float32, get_num_threads, njit, prange

from ..device import ceil_div, cuda
from ..registry import define_op, register

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
    "check": [(1, 1), (7, 3), (1, 129), (129, 1), (257, 33), (1000, 999), (4099, 513)],
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


@register("gemv_wx", "gpu", "block_per_row", rung=2, ptx=[(block_per_row_kernel, SIG_WX)])
def gemv_wx_block_per_row(y, W, x):
    """One block of 256 threads per output row, tree sum in shared memory (coalesced).

    One block of 256 threads per output row: the threads stride along the row together (coalesced),
    then add their 256 partial sums in shared memory in 8 halving steps. Predicted: near copy
    bandwidth for long rows; for short rows (K < a few thousand) the reduction and the block
    start-up dominate."""
    block_per_row_kernel[y.size, THREADS](y, W, x)


@cuda.jit(fastmath=True)
def thread_per_col_kernel(y, x, W):
    n = cuda.grid(1)
    if n < y.size:
        acc = float32(0.0)
        for k in range(x.size):
            acc += x[k] * W[k, n]  # lanes take adjacent n: one 128-byte load per warp per k
        y[n] = acc


@register("gemv", "gpu", "thread_per_col", rung=3, ptx=[(thread_per_col_kernel, SIG_XW)])
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


@register("gemv", "gpu", "splitk", rung=4, ptx=[(splitk_kernel, SIG_XW)])
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


@register("gemv", "gpu", "splitk_grid", rung=5, ptx=[(zero_kernel, "void(float32[::1])"),
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
