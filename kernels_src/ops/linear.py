"""The linear layer Y = X W + b, forward and backward (chapter 3).

Shapes (fixed letters: M rows of the batch, K input features, N output features)
  linear_fwd     X (M,K), W (K,N), b (N,)  -> Y  (M,N)    Y[m,n]  = sum_k X[m,k] W[k,n] + b[n]
  linear_bwd_dw  X (M,K), G (M,N)          -> dW (K,N)    dW[k,n] = sum_m X[m,k] G[m,n]   (X^T G)
  linear_bwd_dx  G (M,N), W (K,N)          -> dX (M,K)    dX[m,k] = sum_n G[m,n] W[k,n]   (G W^T)
  linear_bwd_db  G (M,N)                   -> db (N,)     db[n]   = sum_m G[m,n]          (sum over rows)
G = dL/dY is the upstream gradient, the same shape as Y.

Cost: each of the three products is 2MKN FLOPs over 4(MK + KN + MN) bytes at least (float32), so
compute-bound for big layers; db is MN additions over 4MN bytes, memory-bound.

Ladder (the same for the three products; this chapter keeps them naive: tiling is chapter 5)
  cpu/numpy     baseline: numpy.matmul (BLAS), plus a broadcast add for b
  cpu/loop      rung 1  one @njit dot product per output element, float64 accumulator
  cpu/prange    rung 2  the same, output rows split over cores
  cpu/packed    rung 3  chapter 5's packed GEMM (packed_par) on the same operands (transposes as views)
  cpu/regblock  rung 3  chapter 5's rung 6 (regblock_par: 4x4 ymm tile, B transposed once), for AVX2 machines where
                        rung 8's 4x6 tile spills
  cpu/zmm       rung 4  chapter 5's rung 9 (zmm_par: broadcast-FMA 12x32 tile in zmm registers), same views;
                        needs AVX-512, like that rung
  gpu/naive     rung 1  one thread per output element, a 2D grid of 16x16 blocks, float32 dot product
linear_bwd_db
  cpu/numpy     baseline: G.sum(axis=0)
  cpu/loop      rung 1  row by row, adding each row of G into float64 column accumulators
  cpu/prange    rung 2  columns split over cores
  cpu/rows      rung 3  fixed blocks of rows over cores, each added row by row into its own float64
                        column sums (contiguous, SIMD), the blocks' sums added in block order
  gpu/column    rung 1  one thread per column, a loop over the M rows
  gpu/tree      rung 2  a (32 x 8)-thread block per 32 columns: 8 row-lanes each sum every 8th row,
                        then a 3-level tree in shared memory adds the 8 lanes
"""
import math

import numpy as np
from ..compiler import cuda, njit, prange, zmm_kernels

from ..device import ceil_div
from ..registry import EDGE_INPUTS
from ..registry import sprinkle as _sprinkle
from ..registry import define_op, register

EPS32 = float(np.finfo(np.float32).eps)


def dot_tol(length):
    """Tolerance for float32 sums of `length` products of unit-normal numbers. Each result has size
    ~sqrt(length); the rounding errors of a running float32 sum add up to ~eps*length/sqrt(2) in
    absolute terms (sqrt(length) relative to a result of typical size). Allow 4x that as atol (it
    covers results that happen to be near zero), and 4*eps*sqrt(length) as rtol. Tolerance functions
    for float64 inputs keep the float64 default."""
    def tol(size, dtype):
        if np.dtype(dtype) != np.float32:
            return None
        n = length(size)
        return (1e-5 + 4 * EPS32 * math.sqrt(n), 1e-6 + 4 * EPS32 * n)
    return tol


def _normal(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


# ------------------------------------------------------------------------------ references
def ref_fwd(X, W, b):
    with np.errstate(invalid="ignore"):  # inf * 0 in the graders' edge-value inputs is meant to give NaN
        return X @ W + b


def ref_bwd_dw(X, G):
    with np.errstate(invalid="ignore"):
        return X.T @ G


def ref_bwd_dx(G, W):
    with np.errstate(invalid="ignore"):
        return G @ W.T


def ref_bwd_db(G):
    return G.sum(axis=0)


def inputs_fwd(size, dtype, rng):
    M, K, N = size
    return _normal(rng, (M, K), dtype), _normal(rng, (K, N), dtype), _normal(rng, (N,), dtype)


def inputs_bwd_dw(size, dtype, rng):
    M, K, N = size
    return _normal(rng, (M, K), dtype), _normal(rng, (M, N), dtype)


def inputs_bwd_dx(size, dtype, rng):
    M, K, N = size
    return _normal(rng, (M, N), dtype), _normal(rng, (K, N), dtype)


def inputs_bwd_db(size, dtype, rng):
    M, N = size
    return (_normal(rng, (M, N), dtype),)


# Edge values for the graders (edge=True): exact and signed zeros, a subnormal, an infinity and a NaN.
# inf * 0 = NaN and inf + (-inf) = NaN happen alike in float32 and float64, so the reference's pattern
# of non-finite outputs is the one a correct float32 kernel produces.
def _edges(make, spots):
    def edge(size, dtype, rng):
        arrays = list(make(size, dtype, rng))
        for i, values in spots.items():
            _sprinkle(arrays[i], rng, values)
        return tuple(arrays)
    return edge


EDGE_INPUTS["linear_fwd"] = _edges(inputs_fwd, {0: [0.0, -0.0, np.inf, 1e-40], 1: [0.0, -0.0, np.nan], 2: [0.0]})
EDGE_INPUTS["linear_bwd_dw"] = _edges(inputs_bwd_dw, {0: [0.0, -0.0, np.inf, 1e-40], 1: [0.0, np.nan]})
EDGE_INPUTS["linear_bwd_dx"] = _edges(inputs_bwd_dx, {0: [0.0, -0.0, np.inf], 1: [0.0, np.nan, 1e-40]})
EDGE_INPUTS["linear_bwd_db"] = _edges(inputs_bwd_db, {0: [0.0, -0.0, np.inf, np.nan, 1e-40]})


# Awkward shapes: 1s, primes, non-multiples of 16 (the GPU block) and of 32/8 (the db tree), and the
# shapes of the chapter's MLP (K = 2 inputs, N = 3 classes, 64 hidden units, 300 samples).
CHECK_MKN = [(1, 1, 1), (1, 7, 3), (5, 1, 9), (3, 5, 7), (17, 33, 9), (31, 2, 64), (300, 64, 3),
             (127, 65, 33), (257, 130, 17), (1031, 97, 263)]
CHECK_SIM_MKN = [(1, 1, 1), (3, 5, 7), (17, 20, 19), (33, 2, 8)]
BENCH_MKN = [(300, 64, 64), (1024, 128, 128), (2048, 256, 256)]
BENCH_GPU_MKN = [(300, 64, 64), (1024, 128, 128), (2048, 256, 256), (4096, 1024, 1024), (8192, 2048, 2048)]


def _mm_cost(s):
    return 2 * s[0] * s[1] * s[2]


def _mm_bytes(s, b):
    M, K, N = s
    return (M * K + K * N + M * N) * b


define_op("linear_fwd", reference=ref_fwd, make_inputs=inputs_fwd, chapter=3, size_names=("M", "K", "N"),
          title="linear layer forward: Y = X W + b", output_names=("Y",), kind="compute",
          tol=dot_tol(lambda s: s[1]), flops=lambda s: _mm_cost(s) + s[0] * s[2],
          bytes=lambda s, b: _mm_bytes(s, b) + s[2] * b,
          sizes={"check": CHECK_MKN, "check_sim": CHECK_SIM_MKN, "bench": BENCH_MKN, "bench_gpu": BENCH_GPU_MKN,
                 "bench_sim": [(16, 8, 16)]})
define_op("linear_bwd_dw", reference=ref_bwd_dw, make_inputs=inputs_bwd_dw, chapter=3, size_names=("M", "K", "N"),
          title="linear layer backward: dW = X^T G", output_names=("dW",), kind="compute",
          tol=dot_tol(lambda s: s[0]), flops=_mm_cost, bytes=_mm_bytes,
          sizes={"check": CHECK_MKN, "check_sim": CHECK_SIM_MKN, "bench": BENCH_MKN, "bench_gpu": BENCH_GPU_MKN,
                 "bench_sim": [(16, 8, 16)]})
define_op("linear_bwd_dx", reference=ref_bwd_dx, make_inputs=inputs_bwd_dx, chapter=3, size_names=("M", "K", "N"),
          title="linear layer backward: dX = G W^T", output_names=("dX",), kind="compute",
          tol=dot_tol(lambda s: s[2]), flops=_mm_cost, bytes=_mm_bytes,
          sizes={"check": CHECK_MKN, "check_sim": CHECK_SIM_MKN, "bench": BENCH_MKN, "bench_gpu": BENCH_GPU_MKN,
                 "bench_sim": [(16, 8, 16)]})
define_op("linear_bwd_db", reference=ref_bwd_db, make_inputs=inputs_bwd_db, chapter=3, size_names=("M", "N"),
          title="linear layer backward: db = sum_rows(G)", output_names=("db",), kind="memory",
          tol=dot_tol(lambda s: s[0]), flops=lambda s: s[0] * s[1], bytes=lambda s, b: (s[0] + 1) * s[1] * b,
          sizes={"check": [(1, 1), (1, 7), (5, 1), (7, 33), (300, 3), (300, 64), (257, 31), (1031, 263),
                           (65537, 3)],
                 "check_sim": [(1, 1), (7, 33), (20, 3), (9, 40)],
                 "bench": [(300, 64), (4096, 256), (65536, 256)],
                 "bench_gpu": [(300, 64), (4096, 256), (65536, 256), (1 << 20, 64), (1 << 16, 4096)],
                 "bench_sim": [(16, 8)]})


# --------------------------------------------------------------------------------------- CPU
@register("linear_fwd", "cpu", "numpy", baseline=True)
def linear_fwd_numpy(Y, X, W, b):
    """numpy.matmul (a tuned BLAS SGEMM), then b added to every row."""
    np.matmul(X, W, out=Y)
    Y += b


@njit(cache=True)
def _fwd_loop(Y, X, W, b):
    M, K = X.shape
    N = W.shape[1]
    for m in range(M):
        for n in range(N):
            acc = 0.0  # float64
            for k in range(K):
                acc += X[m, k] * W[k, n]
            Y[m, n] = acc + b[n]


@njit(parallel=True, cache=True)
def _fwd_prange(Y, X, W, b):
    M, K = X.shape
    N = W.shape[1]
    for m in prange(M):
        for n in range(N):
            acc = 0.0
            for k in range(K):
                acc += X[m, k] * W[k, n]
            Y[m, n] = acc + b[n]


@register("linear_fwd", "cpu", "loop", rung=1)
def linear_fwd_loop(Y, X, W, b):
    """Y[m,n] = b[n] + (dot product of row m of X with column n of W), exactly the formula. Column n
    of W is strided (N floats apart), so each k touches a new cache line: predicted well below BLAS,
    which reorders and tiles the loops (chapter 5)."""
    _fwd_loop(Y, X, W, b)


@register("linear_fwd", "cpu", "prange", rung=2)
def linear_fwd_prange(Y, X, W, b):
    """The same dot products, rows of Y split over cores: up to cores x faster on large M."""
    _fwd_prange(Y, X, W, b)


@njit(parallel=True, cache=True)
def _add_bias(Y, b):
    for m in prange(Y.shape[0]):
        for n in range(Y.shape[1]):
            Y[m, n] += b[n]


@register("linear_fwd", "cpu", "packed", rung=3)
def linear_fwd_packed(Y, X, W, b):
    """Chapter 5's fastest CPU GEMM (rung 8, ``packed_par``: packed slivers, a 4 x 6 register tile, rows
    over the cores) for X W, then b added in one more pass over Y. Predicted: the GEMM's fraction of BLAS
    (roughly 60-75 % at 1024^3, less on these smaller products), 20-50x rung 2."""
    from .gemm import gemm_packed_par

    gemm_packed_par(Y, X, W)
    _add_bias(Y, b)


@register("linear_fwd", "cpu", "regblock", rung=3)
def linear_fwd_regblock(Y, X, W, b):
    """Chapter 5's rung 6 (``regblock_par``: 4x4 tiles of Y as 16 dot products in ymm registers, W transposed
    once) for X W, then b added in one pass over Y: the AVX2 machine's fastest GEMM, where rung 8's 4x6 tile
    spills. Predicted on the 2-core EPYC: about 1.3x the packed rung, as chapter 5's 1024^3 GEMM measured
    (51 against 39 GFLOP/s)."""
    from .gemm import gemm_regblock_into

    gemm_regblock_into(Y, X, W)
    _add_bias(Y, b)


@register("linear_fwd", "cpu", "zmm", rung=4, requires=zmm_kernels)
def linear_fwd_zmm(Y, X, W, b):
    """Chapter 5's rung 9 (``zmm_par``: W packed in 32-column slivers, a 12 x 32 tile of Y in 24 zmm
    registers, broadcasts of X) for X W, then b added in one pass over Y. Predicted: like that rung, about
    NumPy's BLAS (rung 3 measured 0.55-0.65x of it); the bias pass over Y (2 MiB at 2048 x 256, in L2) adds a
    few percent, as NumPy's separate ``Y += b`` does. Measured A/B at 2048 x 256 x 256 (1 thread, CPU time,
    one process, busy shared machine): 0.86-0.88x NumPy for rung 4, 0.49-0.52x for rung 3; the backward
    products alike (dW 0.83-0.88x, dX 0.81-0.86x, against 0.54-0.58x)."""
    from .gemm import gemm_zmm_into

    gemm_zmm_into(Y, X, W)
    _add_bias(Y, b)


@register("linear_bwd_dw", "cpu", "numpy", baseline=True)
def linear_bwd_dw_numpy(dW, X, G):
    """numpy.matmul of X transposed (a view, no copy) with G."""
    np.matmul(X.T, G, out=dW)


@njit(cache=True)
def _dw_loop(dW, X, G):
    M, K = X.shape
    N = G.shape[1]
    for k in range(K):
        for n in range(N):
            acc = 0.0
            for m in range(M):
                acc += X[m, k] * G[m, n]
            dW[k, n] = acc


@njit(parallel=True, cache=True)
def _dw_prange(dW, X, G):
    M, K = X.shape
    N = G.shape[1]
    for k in prange(K):
        for n in range(N):
            acc = 0.0
            for m in range(M):
                acc += X[m, k] * G[m, n]
            dW[k, n] = acc


@register("linear_bwd_dw", "cpu", "loop", rung=1)
def linear_bwd_dw_loop(dW, X, G):
    """dW[k,n] = dot product of column k of X with column n of G, a sum over the batch. Both columns
    are strided, so predicted slower per FLOP than the forward loop."""
    _dw_loop(dW, X, G)


@register("linear_bwd_dw", "cpu", "prange", rung=2)
def linear_bwd_dw_prange(dW, X, G):
    """Rows of dW (one per input feature k) split over cores."""
    _dw_prange(dW, X, G)


@register("linear_bwd_dw", "cpu", "packed", rung=3)
def linear_bwd_dw_packed(dW, X, G):
    """Chapter 5's packed GEMM on X transposed (a view: the packing reads its columns) and G. Predicted:
    close to the forward's rung 3 (the packing absorbs the stride), far above rung 2."""
    from .gemm import gemm_packed_par

    gemm_packed_par(dW, X.T, G)


@register("linear_bwd_dw", "cpu", "regblock", rung=3)
def linear_bwd_dw_regblock(dW, X, G):
    """Chapter 5's rung 6 on X transposed (copied to contiguous rows first: the tile loads along them) and G.
    Predicted on the 2-core EPYC: faster than the packed rung, whose tile spills on AVX2, by less than the
    GEMM's 1.3x: the copy of X is one more pass, and dW has only 256 rows to share between the cores."""
    from .gemm import gemm_regblock_into

    gemm_regblock_into(dW, X.T, G)


@register("linear_bwd_dw", "cpu", "zmm", rung=4, requires=zmm_kernels)
def linear_bwd_dw_zmm(dW, X, G):
    """Chapter 5's rung 9 on X transposed (a view: packing A reads X along its rows, 12 columns of X = one
    12-row sliver of X^T at a time) and G. Here M = K_in is small (256 rows of dW) and the sum runs over the
    batch (2048): rung 9 cuts dW into 4 row blocks of 60-72 rows on 2 cores so both cores work.
    Predicted: close to the forward's rung 4."""
    from .gemm import gemm_zmm_into

    gemm_zmm_into(dW, X.T, G)


@register("linear_bwd_dx", "cpu", "numpy", baseline=True)
def linear_bwd_dx_numpy(dX, G, W):
    """numpy.matmul of G with W transposed (a view)."""
    np.matmul(G, W.T, out=dX)


@njit(cache=True)
def _dx_loop(dX, G, W):
    M, N = G.shape
    K = W.shape[0]
    for m in range(M):
        for k in range(K):
            acc = 0.0
            for n in range(N):
                acc += G[m, n] * W[k, n]
            dX[m, k] = acc


@njit(parallel=True, cache=True)
def _dx_prange(dX, G, W):
    M, N = G.shape
    K = W.shape[0]
    for m in prange(M):
        for k in range(K):
            acc = 0.0
            for n in range(N):
                acc += G[m, n] * W[k, n]
            dX[m, k] = acc


@register("linear_bwd_dx", "cpu", "loop", rung=1)
def linear_bwd_dx_loop(dX, G, W):
    """dX[m,k] = dot product of row m of G with row k of W: both rows are contiguous, so predicted
    the fastest of the three loops per FLOP (the inner loop streams through memory)."""
    _dx_loop(dX, G, W)


@register("linear_bwd_dx", "cpu", "prange", rung=2)
def linear_bwd_dx_prange(dX, G, W):
    """Rows of dX split over cores."""
    _dx_prange(dX, G, W)


@register("linear_bwd_dx", "cpu", "packed", rung=3)
def linear_bwd_dx_packed(dX, G, W):
    """Chapter 5's packed GEMM on G and W transposed (a view; B is packed once, so its layout costs one pass).
    Predicted: close to the forward's rung 3."""
    from .gemm import gemm_packed_par

    gemm_packed_par(dX, G, W.T)


@register("linear_bwd_dx", "cpu", "regblock", rung=3)
def linear_bwd_dx_regblock(dX, G, W):
    """Chapter 5's rung 6 on G and W transposed: the tile wants B transposed, and W.T transposed is W itself, so
    no copy at all. Predicted on the 2-core EPYC: about the GEMM's 1.3x over the packed rung."""
    from .gemm import gemm_regblock_into

    gemm_regblock_into(dX, G, W.T)


@register("linear_bwd_dx", "cpu", "zmm", rung=4, requires=zmm_kernels)
def linear_bwd_dx_zmm(dX, G, W):
    """Chapter 5's rung 9 on G and W transposed (a view: the packing of B reads W along its rows into 32-wide
    slivers of W^T, once). Predicted: close to the forward's rung 4."""
    from .gemm import gemm_zmm_into

    gemm_zmm_into(dX, G, W.T)


@register("linear_bwd_db", "cpu", "numpy", baseline=True)
def linear_bwd_db_numpy(db, G):
    """G.sum(axis=0): NumPy adds row after row into the output."""
    np.sum(G, axis=0, out=db)


@njit(cache=True)
def _db_loop(db, G):
    M, N = G.shape
    acc = np.zeros(N)  # float64 column accumulators
    for m in range(M):
        for n in range(N):
            acc[n] += G[m, n]
    for n in range(N):
        db[n] = acc[n]


@njit(parallel=True, cache=True)
def _db_prange(db, G):
    M, N = G.shape
    for n in prange(N):
        acc = 0.0
        for m in range(M):
            acc += G[m, n]
        db[n] = acc


DB_CHUNK = 1 << 16  # elements of G per block of rows: the blocks, not the threads, fix the order of the sums


@njit(parallel=True, cache=True)
def _db_rows(db, G, parts, R):
    # G (M,N) -> db (N,); parts (C,N) float64: block c's column sums over rows [cR, cR + R)
    M, N = G.shape
    for c in prange(parts.shape[0]):
        acc = parts[c]
        for n in range(N):
            acc[n] = 0.0
        for m in range(c * R, min(M, (c + 1) * R)):
            g = G[m]
            for n in range(N):  # contiguous row into contiguous sums: SIMD loads, converts and adds
                acc[n] += g[n]
    for n in range(N):
        s = 0.0
        for c in range(parts.shape[0]):  # block order: the same sums whatever the number of threads
            s += parts[c, n]
        db[n] = s


@register("linear_bwd_db", "cpu", "loop", rung=1)
def linear_bwd_db_loop(db, G):
    """Row by row: each row of G is read contiguously and added into N float64 accumulators. One pass
    over G: predicted near memory bandwidth for large M*N."""
    _db_loop(db, G)


@register("linear_bwd_db", "cpu", "prange", rung=2)
def linear_bwd_db_prange(db, G):
    """Columns split over cores; each core walks down its columns (strided reads). Helps only when N
    is large enough to share out, and the strided walk costs bandwidth: predicted slower than the
    loop for the MLP's N = 3 or 64."""
    _db_prange(db, G)


@register("linear_bwd_db", "cpu", "rows", rung=3)
def linear_bwd_db_rows(db, G):
    """Rung 1's row-by-row walk, split over cores by blocks of rows (about 64K elements each) instead of
    rung 2's strided columns: every core streams its rows contiguously into its own N float64 sums
    (in L1 for N up to a few thousand), then the blocks' sums are added in block order (deterministic).
    4MN bytes read once, nothing written but db: predict ~cores x rung 1 until DRAM is the limit, about
    the copy bandwidth or more at 65536 x 256 (a read-only stream; the copy also writes)."""
    M, N = G.shape
    R = max(1, DB_CHUNK // max(N, 1))
    parts = np.empty((max(1, -(-M // R)), N))
    _db_rows(db, G, parts, R)


# --------------------------------------------------------------------------------------- GPU
TILE = 16  # a 16 x 16 block of threads: 256 threads, one per output element
F2 = "float32[:, ::1]"
F1 = "float32[::1]"


@cuda.jit
def linear_fwd_kernel(Y, X, W, b):
    n, m = cuda.grid(2)  # x (fastest-varying) indexes columns, so a warp reads a row of W
    if m < Y.shape[0] and n < Y.shape[1]:
        acc = np.float32(0.0)
        for k in range(X.shape[1]):
            acc += X[m, k] * W[k, n]
        Y[m, n] = acc + b[n]


@cuda.jit
def linear_bwd_dw_kernel(dW, X, G):
    n, k = cuda.grid(2)
    if k < dW.shape[0] and n < dW.shape[1]:
        acc = np.float32(0.0)
        for m in range(X.shape[0]):
            acc += X[m, k] * G[m, n]
        dW[k, n] = acc


@cuda.jit
def linear_bwd_dx_kernel(dX, G, W):
    k, m = cuda.grid(2)
    if m < dX.shape[0] and k < dX.shape[1]:
        acc = np.float32(0.0)
        for n in range(G.shape[1]):
            acc += G[m, n] * W[k, n]
        dX[m, k] = acc


def grid2(rows, cols):
    """Blocks of TILE x TILE threads covering a (rows, cols) output; x runs along columns."""
    return (ceil_div(cols, TILE), ceil_div(rows, TILE)), (TILE, TILE)


@register("linear_fwd", "gpu", "naive", rung=1, ptx=[(linear_fwd_kernel, f"void({F2}, {F2}, {F2}, {F1})")])
def linear_fwd_naive(Y, X, W, b):
    """One thread per element of Y, each a K-long dot product in a float32 register. The 16 threads of
    a block row read 16 neighbouring floats of a row of W (coalesced) and one broadcast X[m,k]; every
    operand comes from global memory (through L1/L2), ~2 loads per FMA: predicted a few % of cuBLAS."""
    grid, block = grid2(Y.shape[0], Y.shape[1])
    linear_fwd_kernel[grid, block](Y, X, W, b)


@register("linear_bwd_dw", "gpu", "naive", rung=1, ptx=[(linear_bwd_dw_kernel, f"void({F2}, {F2}, {F2})")])
def linear_bwd_dw_naive(dW, X, G):
    """One thread per element of dW, an M-long dot product over the batch. Neighbouring threads read
    neighbouring G[m, n] (coalesced) and one broadcast X[m, k]: the same access pattern as the forward."""
    grid, block = grid2(dW.shape[0], dW.shape[1])
    linear_bwd_dw_kernel[grid, block](dW, X, G)


@register("linear_bwd_dx", "gpu", "naive", rung=1, ptx=[(linear_bwd_dx_kernel, f"void({F2}, {F2}, {F2})")])
def linear_bwd_dx_naive(dX, G, W):
    """One thread per element of dX, an N-long dot product. Neighbouring threads (neighbouring k) read
    W[k, n] N floats apart: uncoalesced, each load its own 32-byte sector. Predicted slower than the
    other two at the same FLOPs once N is large (chapter 5's shared-memory tiles fix this)."""
    grid, block = grid2(dX.shape[0], dX.shape[1])
    linear_bwd_dx_kernel[grid, block](dX, G, W)


DB_COLS, DB_LANES = 32, 8  # the tree variant's block: 32 columns x 8 row-lanes = 256 threads


@cuda.jit
def linear_bwd_db_column_kernel(db, G):
    n = cuda.grid(1)
    if n < G.shape[1]:
        acc = np.float32(0.0)
        for m in range(G.shape[0]):  # neighbouring threads read neighbouring G[m, n]: coalesced
            acc += G[m, n]
        db[n] = acc


@register("linear_bwd_db", "gpu", "column", rung=1, ptx=[(linear_bwd_db_column_kernel, f"void({F1}, {F2})")])
def linear_bwd_db_column(db, G):
    """One thread per column: N threads each loop over M rows. Coalesced, but with N = 64 there are only
    64 threads on a GPU that wants ~100,000 in flight: predicted latency-bound, a tiny fraction of
    bandwidth, unless N is in the thousands."""
    linear_bwd_db_column_kernel[ceil_div(G.shape[1], 128), 128](db, G)


@cuda.jit
def linear_bwd_db_tree_kernel(db, G):
    sh = cuda.shared.array((DB_LANES, DB_COLS), dtype=np.float32)
    tx = cuda.threadIdx.x  # column within the block's 32
    ty = cuda.threadIdx.y  # row-lane: this thread sums rows ty, ty + 8, ty + 16, ...
    n = cuda.blockIdx.x * DB_COLS + tx
    acc = np.float32(0.0)
    if n < G.shape[1]:
        for m in range(ty, G.shape[0], DB_LANES):
            acc += G[m, n]
    sh[ty, tx] = acc  # every thread writes, even past the last column, so the tree reads no garbage
    cuda.syncthreads()
    step = DB_LANES // 2
    while step > 0:  # 8 lanes -> 4 -> 2 -> 1
        if ty < step:
            sh[ty, tx] += sh[ty + step, tx]
        cuda.syncthreads()
        step //= 2
    if ty == 0 and n < G.shape[1]:
        db[n] = sh[0, tx]


@register("linear_bwd_db", "gpu", "tree", rung=2, ptx=[(linear_bwd_db_tree_kernel, f"void({F1}, {F2})")])
def linear_bwd_db_tree(db, G):
    """8 row-lanes per column share the M rows, then a 3-step shared-memory tree adds the lanes: 8x the
    threads of `column`, each with 1/8 of the loop. Predicted up to ~8x faster than `column` when N is
    small and M large (latency-bound either way at N = 64, with only 2 blocks)."""
    linear_bwd_db_tree_kernel[ceil_div(G.shape[1], DB_COLS), (DB_COLS, DB_LANES)](db, G)
