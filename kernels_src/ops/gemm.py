"""gemm: C = A @ B, the matrix multiply (chapter 5).

Shapes: A (M,K) @ B (K,N) -> C (M,N), all float32, row-major (C-contiguous). Sizes are written
        (M, N, K), so ``1024x1024x1024`` on the command line.
Cost:   2*M*N*K FLOPs. At least (M*K + K*N + M*N) elements must move once, so a square n^3 GEMM does
        2n^3 FLOPs on 3n^2 * 4 bytes: n/6 FLOP per byte, compute-bound for any n worth measuring. How
        close a kernel gets to that ideal depends on how often it re-reads A and B: each rung's
        ``bytes=`` model below counts the global-memory traffic its blocking implies.

Ladder (each rung changes one thing)
  cpu/numpy          baseline  numpy.matmul (OpenBLAS on the course machines)
  cpu/ijk            rung 1    three loops, dot-product order: B is walked down a column (stride N)
  cpu/ikj            rung 2    loop interchange: the inner loop runs along rows of B and C (stride 1)
  cpu/blocked        rung 3    ikj over cache-sized tiles, so a tile of B is re-used from L1/L2
  cpu/blocked_par    rung 4    the same tiles, row blocks spread over cores with prange
  cpu/regblock       rung 5    B transposed once, 4x4 register tile of dot products (16 accumulators)
  cpu/regblock_par   rung 6    rung 5 with row blocks spread over cores with prange
  cpu/packed         rung 7    A and B packed into 4-row / 6-column slivers, 4x6 micro-kernel (24 sums in ymm registers)
  cpu/packed_par     rung 8    rung 7 with 64-row blocks of C spread over cores with prange
  cpu/zmm_par        rung 9    the BLAS form: broadcast A, 12x32 tile of C in 24 zmm registers (16-float vectors from
                               the compiler door), 1024-deep packed slivers, row blocks over cores (needs AVX-512)
  cpu/torch          baseline  torch.matmul on the CPU, same thread count (needs torch)
  gpu/cublas         baseline  cuBLAS SGEMM through torch, TF32 off (needs torch and a GPU)
  gpu/naive          rung 1    one thread per C element, threadIdx.x -> row: a warp reads 32 rows of A
  gpu/coalesced      rung 2    threadIdx.x -> column: a warp reads 128 contiguous bytes of B
  gpu/smem           rung 3    32x32 tiles of A and B staged in shared memory
  gpu/blocktile1d    rung 4    64x64 block tile, each thread computes 8 outputs of a column
  gpu/blocktile2d    rung 5    128x128 block tile, each thread computes an 8x8 register tile
  gpu/hinted         rung 6    rung 5 plus two compiler hints: tid >= 0 and 16-byte aligned shared arrays
  gpu/conflictfree   rung 7    padded A tile and a warp-aware thread layout: no shared-memory bank conflicts
  gpu/dbuf           rung 8    double-buffered shared memory: the next tile loads while this one computes
  gpu/tuned          rung 9    rung 8 with the tile shape that won a sweep on the GPU (128x256, 8x16 per thread)
  gpu/vec            rung 10   rung 8 with 16-byte global loads/stores (kernels_src.vec.load4) and unguarded full tiles
  gpu/warptile       rung 11   rung 10 with warp tiles (each warp a contiguous 64x32 tile of C) and BK = 16
  gpu/splitk         rung 12   rung 11 with K split over S blocks per tile and a second pass adding the S partials
                               (for long K and few output tiles: training's dW = X^T G; chapter 14 dispatches to it)

Numba-specific lessons, each visible in the PTX (see ``kernels_src.tools.gemm.ptx_report``): a signed index makes Numba emit
a negative-index ("wraparound") fix-up for every array access, which blocks vectorised shared-memory
loads; shared arrays are only 4-byte aligned unless asked; ``cuda.local.array`` with constant indices
stays in registers.
"""
from __future__ import annotations

import numpy as np
from ..compiler import (cuda, float32, get_num_threads, load4, njit, prange, prefetchw, store4, vadd16, vfma16,
                        vload16, vsplat16, vstore16, vzero16, zmm_kernels)

from .. import device
from ..device import ceil_div
from ..registry import define_op, exercise_op, register
from .cpu_baselines import torch_cpu, tviews

ITEM = 4  # bytes per float32


def reference(A, B):
    """float64 oracle: C = A @ B."""
    return A @ B


def make_inputs(size, dtype, rng):
    M, N, K = size
    A = rng.standard_normal((M, K)).astype(dtype)
    B = rng.standard_normal((K, N)).astype(dtype)
    return A, B


def gemm_tol(size, dtype):
    """Tolerance for float32 GEMM with standard-normal inputs.

    Each output is a K-term dot product whose value has typical size sqrt(K). Every one of the K
    float32 additions rounds with relative error <= eps/2 of a partial sum of size ~sqrt(K), and
    those errors add like a random walk: typical error ~ sqrt(K) * eps * sqrt(K). We allow 4x that
    (atol = 4 * sqrt(K) * eps * sqrt(K)), plus rtol 1e-5. A kernel that drops one 8-wide K tile is
    off by ~sqrt(8) ~ 2.8, thousands of times more, so the check can still fail.
    """
    K = size[2]
    eps = float(np.finfo(np.float32).eps)
    if np.dtype(dtype) == np.float64:
        return 1e-10, 1e-12 * K
    return 1e-5, 4.0 * np.sqrt(K) * eps * np.sqrt(K) + 1e-6


def min_bytes(s, b):
    M, N, K = s
    return (M * K + K * N + M * N) * b


define_op(
    "gemm", reference=reference, make_inputs=make_inputs, chapter=5, title="GEMM: C = A @ B",
    size_names=("M", "N", "K"), kind="compute", output_names=("C",), tol=gemm_tol,
    flops=lambda s: 2 * s[0] * s[1] * s[2], bytes=min_bytes,
    sizes={
        # 1, primes, non-multiples of every tile (8, 32, 64, 128), and one that spans several 128-tiles
        "check": [(1, 1, 1), (7, 5, 3), (1, 33, 17), (33, 17, 9), (64, 64, 64), (129, 131, 17),
                  (257, 383, 129), (517, 389, 263)],
        # the simulator runs one Python thread per CUDA thread: keep these tiny
        "check_sim": [(1, 1, 1), (7, 5, 3), (33, 17, 9)],
        "bench": [(256, 256, 256), (512, 512, 512), (1024, 1024, 1024)],
        "bench_gpu": [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096)],
        "bench_sim": [(33, 17, 9)],
    },
)


def tile_bytes(BM, BN):
    """Global-memory traffic of a kernel whose blocks own BM x BN tiles of C.

    A block reads a BM x K strip of A and a K x BN strip of B, so A is read ceil(N/BN) times and B
    ceil(M/BM) times; C is written once. Arithmetic intensity ~ 1 / (2 * (1/BM + 1/BN)) FLOP/byte.
    """
    def nbytes(s, b):
        M, N, K = s
        return (M * K * ceil_div(N, BN) + K * N * ceil_div(M, BM) + M * N) * b
    nbytes.tile = (BM, BN)
    return nbytes


# ================================================================================================ CPU
@register("gemm", "cpu", "numpy", baseline=True)
def gemm_numpy(C, A, B):
    """numpy.matmul: the machine's BLAS (OpenBLAS here), hand-written assembly micro-kernels."""
    np.matmul(A, B, out=C)


@njit(fastmath=True, cache=True)
def _gemm_ijk(C, A, B):
    M, K = A.shape
    N = B.shape[1]
    for i in range(M):
        for j in range(N):
            acc = np.float32(0.0)
            for k in range(K):
                acc += A[i, k] * B[k, j]  # B[k, j] for k = 0, 1, ...: N*4 bytes apart
            C[i, j] = acc


@register("gemm", "cpu", "ijk", rung=1, bytes=lambda s, b: (2 * s[0] * s[1] * s[2] + s[0] * s[1]) * b)
def gemm_ijk(C, A, B):
    """Three loops in textbook order: each C[i, j] is a dot product of a row of A and a column of B.
    The inner loop walks B down a column, one float per 64-byte cache line (and, for N = 1024, one
    page every 4 rows), so nearly every load misses: predicted ~1 GFLOP/s, hundreds of times below BLAS."""
    _gemm_ijk(C, A, B)


@njit(fastmath=True, cache=True)
def _gemm_ikj(C, A, B):
    M, K = A.shape
    N = B.shape[1]
    for i in range(M):
        c = C[i]  # row i of C (N,)
        c[:] = 0.0
        for k in range(K):
            a = A[i, k]
            b = B[k]  # row k of B (N,), contiguous
            for j in range(N):
                c[j] += a * b[j]  # stride-1 in both: the compiler vectorises this loop (AVX)


@register("gemm", "cpu", "ikj", rung=2)
def gemm_ikj(C, A, B):
    """Loop interchange (ikj): the inner loop runs along rows of B and C, stride 1.

    Loop interchange: for each (i, k), add A[i, k] * (row k of B) into row i of C. Every access in
    the inner loop is stride 1, so it vectorises and uses whole cache lines. Predicted: ~10x faster
    than ijk; now limited by streaming all of B through the caches once per row of C."""
    _gemm_ikj(C, A, B)


CPU_BI, CPU_BK, CPU_BJ = 64, 256, 512  # rows of C, depth, columns of C per tile (B tile: 512 KiB)


@njit(fastmath=True, cache=True)
def _blocked_rows(C, A, B, i0, i1):
    """C[i0:i1] = A[i0:i1] @ B, over BK x BJ tiles of B that stay in L2 while BI rows use them."""
    K = A.shape[1]
    N = B.shape[1]
    for i in range(i0, i1):
        C[i, :] = 0.0
    for k0 in range(0, K, CPU_BK):
        k1 = min(k0 + CPU_BK, K)
        for j0 in range(0, N, CPU_BJ):
            j1 = min(j0 + CPU_BJ, N)
            for i in range(i0, i1):
                c = C[i, j0:j1]
                for k in range(k0, k1):
                    a = A[i, k]
                    b = B[k, j0:j1]
                    for j in range(j1 - j0):
                        c[j] += a * b[j]


@njit(fastmath=True, cache=True)
def _gemm_blocked(C, A, B):
    M = A.shape[0]
    for i0 in range(0, M, CPU_BI):
        _blocked_rows(C, A, B, i0, min(i0 + CPU_BI, M))


@register("gemm", "cpu", "blocked", rung=3)
def gemm_blocked(C, A, B):
    """Cache blocking: ikj over 256 x 512 tiles of B that stay in L2 while 64 rows of C use them.

    Cache blocking: the ikj loops run over a BK x BJ tile of B (256 x 512 floats = 512 KiB, sized for
    this CPU's 1 MiB L2) while 64 rows of C use it, so each element of B is fetched from memory
    M/64 times instead of M times. Predicted: 1.5-2x over ikj at 1024^3, where B (4 MiB) no longer fits
    in L2; no gain at 256^3, where it already did."""
    _gemm_blocked(C, A, B)


@njit(fastmath=True, parallel=True, cache=True)
def _gemm_blocked_par(C, A, B):
    M = A.shape[0]
    nb = (M + CPU_BI - 1) // CPU_BI
    for ib in prange(nb):  # row blocks are independent: each core owns whole rows of C
        i0 = ib * CPU_BI
        _blocked_rows(C, A, B, i0, min(i0 + CPU_BI, M))


@register("gemm", "cpu", "blocked_par", rung=4)
def gemm_blocked_par(C, A, B):
    """Rung 3 with 64-row blocks of C spread over cores with prange.

    Rung 3 with prange over 64-row blocks of C: blocks write disjoint rows, so no locking. Predicted:
    ~2x on this 2-core machine (each core has its own L2)."""
    _gemm_blocked_par(C, A, B)


MR, NR = 4, 4  # register tile: 4 rows of A x 4 rows of B^T -> 16 dot products in flight
CPU_KC = 1024  # depth of one pass over the register tiles (4 rows of A + 4 of B^T = 32 KiB: L1-sized)
CPU_MC = 64  # rows of C per parallel task


@njit(fastmath=True, cache=True)
def _micro_4x4(C, A, Bt, i, j, k0, k1):
    """C[i:i+4, j:j+4] += A[i:i+4, k0:k1] @ Bt[j:j+4, k0:k1].T with 16 scalar accumulators.

    LLVM vectorises the k loop (16 floats per AVX-512 register), keeping the 16 sums in 16 vector
    registers: each step loads 8 vectors and does 16 fused multiply-adds. Slicing rows first and
    looping k from 0 matters: the index is then provably >= 0, so Numba's negative-index fix-up folds
    away and the loads stay contiguous (with ``A[i, k]`` and k from k0, LLVM emits gathers instead).
    """
    a0 = A[i, k0:k1]
    a1 = A[i + 1, k0:k1]
    a2 = A[i + 2, k0:k1]
    a3 = A[i + 3, k0:k1]
    b0 = Bt[j, k0:k1]
    b1 = Bt[j + 1, k0:k1]
    b2 = Bt[j + 2, k0:k1]
    b3 = Bt[j + 3, k0:k1]
    s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = np.float32(0.0)
    s20 = s21 = s22 = s23 = s30 = s31 = s32 = s33 = np.float32(0.0)
    for k in range(k1 - k0):
        x0 = a0[k]
        x1 = a1[k]
        x2 = a2[k]
        x3 = a3[k]
        y0 = b0[k]
        y1 = b1[k]
        y2 = b2[k]
        y3 = b3[k]
        s00 += x0 * y0
        s01 += x0 * y1
        s02 += x0 * y2
        s03 += x0 * y3
        s10 += x1 * y0
        s11 += x1 * y1
        s12 += x1 * y2
        s13 += x1 * y3
        s20 += x2 * y0
        s21 += x2 * y1
        s22 += x2 * y2
        s23 += x2 * y3
        s30 += x3 * y0
        s31 += x3 * y1
        s32 += x3 * y2
        s33 += x3 * y3
    C[i, j] += s00
    C[i, j + 1] += s01
    C[i, j + 2] += s02
    C[i, j + 3] += s03
    C[i + 1, j] += s10
    C[i + 1, j + 1] += s11
    C[i + 1, j + 2] += s12
    C[i + 1, j + 3] += s13
    C[i + 2, j] += s20
    C[i + 2, j + 1] += s21
    C[i + 2, j + 2] += s22
    C[i + 2, j + 3] += s23
    C[i + 3, j] += s30
    C[i + 3, j + 1] += s31
    C[i + 3, j + 2] += s32
    C[i + 3, j + 3] += s33


@njit(fastmath=True, cache=True)
def _edge(C, A, Bt, i0, i1, j0, j1, k0, k1):
    """The leftover rows/columns (M or N not a multiple of 4): plain dot products."""
    for i in range(i0, i1):
        a = A[i, k0:k1]
        for j in range(j0, j1):
            b = Bt[j, k0:k1]
            s = np.float32(0.0)
            for k in range(k1 - k0):
                s += a[k] * b[k]
            C[i, j] += s


@njit(fastmath=True, cache=True)
def _regblock_rows(C, A, Bt, i0, i1):
    K = A.shape[1]
    N = Bt.shape[0]
    C[i0:i1, :] = 0.0
    i4 = i0 + (i1 - i0) // MR * MR  # rows handled by full 4x4 tiles
    n4 = N // NR * NR
    for k0 in range(0, K, CPU_KC):
        k1 = min(k0 + CPU_KC, K)
        for j in range(0, n4, NR):
            for i in range(i0, i4, MR):
                _micro_4x4(C, A, Bt, i, j, k0, k1)
        _edge(C, A, Bt, i0, i1, n4, N, k0, k1)  # right edge, all rows
        _edge(C, A, Bt, i4, i1, 0, n4, k0, k1)  # bottom edge


@njit(fastmath=True, parallel=True, cache=True)
def _transpose(Bt, B):
    K, N = B.shape
    for j0 in prange((N + 7) // 8):  # 8 x 8 blocks: a block's 8 source rows stay in L1 (fastest here)
        for k0 in range(0, K, 8):
            for j in range(j0 * 8, min(j0 * 8 + 8, N)):
                for k in range(k0, min(k0 + 8, K)):
                    Bt[j, k] = B[k, j]


@njit(fastmath=True, cache=True)
def _gemm_regblock(C, A, Bt):
    M = A.shape[0]
    for i0 in range(0, M, CPU_MC):
        _regblock_rows(C, A, Bt, i0, min(i0 + CPU_MC, M))


@register("gemm", "cpu", "regblock", rung=5)
def gemm_regblock(C, A, B):
    """Register blocking: B transposed once, then 4x4 tiles of C as 16 dot products in registers.

    Register blocking: copy B^T once (K x N floats, ~2 % of the work at 1024^3), then compute 4x4 tiles
    of C as 16 dot products at a time. Per 16 floats of k the core loads 8 vectors and does 16 vector
    FMAs, instead of 1 load + 1 store per FMA in ikj. Predicted: 3-5x over blocked on one core."""
    Bt = np.empty((B.shape[1], B.shape[0]), dtype=B.dtype)
    _transpose(Bt, B)
    _gemm_regblock(C, A, Bt)


@njit(fastmath=True, parallel=True, cache=True)
def _gemm_regblock_par(C, A, Bt):
    M = A.shape[0]
    nb = (M + CPU_MC - 1) // CPU_MC
    for ib in prange(nb):
        i0 = ib * CPU_MC
        _regblock_rows(C, A, Bt, i0, min(i0 + CPU_MC, M))


@register("gemm", "cpu", "regblock_par", rung=6)
def gemm_regblock_par(C, A, B):
    """Rung 5 with 64-row blocks of C spread over cores with prange.

    Rung 5 with prange over 64-row blocks of C (and a parallel transpose). Predicted: ~2x rung 5 on 2
    cores, which should put it within reach of OpenBLAS (goal: >= 70 % of numpy.matmul at 1024^3)."""
    Bt = np.empty((B.shape[1], B.shape[0]), dtype=B.dtype)
    _transpose(Bt, B)
    _gemm_regblock_par(C, A, Bt)


# ---------------------------------------------------------------- rungs 7-8: packed panels, a 4x6 micro-kernel
# Numba can keep an accumulator in a register only as a scalar that a vectorised loop reduces into (a local
# array stays in memory: LLVM cannot prove it is not aliased by A or B). So the micro-kernel is rung 5's dot
# products grown to the register file: MR x NR = 4 x 6 = 24 running sums, each a 256-bit ymm register of 8
# partial sums along k. AVX-512 gives 32 ymm registers: 24 sums + 6 vectors of B + 1 of A at a time = 31, and
# each step of 8 k-values does 24 FMAs for 10 loads (rung 5: 16 for 8). 4 x 7 (28 sums) runs out of registers
# and measured slower. Why not 512-bit zmm registers (16 floats)? LLVM's vectorisers cap themselves at 256 bits on
# this Intel core (its tuning flag prefer-256-bit), and Numba offers no per-function way to lift that.
PMR, PNR = 4, 6  # register tile of C: PMR rows of A x PNR columns of B, 24 accumulators
PKC = 1024  # depth of a packed block: a B sliver (6 x 1024 floats = 24 KiB) + an A sliver (16 KiB) fit L1 (48 KiB)
PMC = 64  # rows of C per task: the packed A block (64 x 1024 floats = 256 KiB) stays in L2 (2 MiB)
PPAD = 16  # floats added to each packed row: rows 4 KiB apart would all fall in the same L1 sets


@njit(fastmath=True, cache=True)
def _pack_b_sliver(Bp, B, kb, s):
    """Bp[kb, s] (PNR, PKC) <- B[k0:k0+kc, j0:j0+PNR].T: one PKC-deep block of one PNR-column sliver of B as
    PNR contiguous rows of k; columns past N are zeros. B is read along its rows (PNR floats per row of B)."""
    K, N = B.shape
    k0 = kb * PKC
    kc = min(PKC, K - k0)
    j0 = s * PNR
    dst = Bp[kb, s]
    if j0 + PNR <= N:
        for p in range(kc):
            row = B[k0 + p, j0:j0 + PNR]
            for r in range(PNR):
                dst[r, p] = row[r]
    else:
        dst[:, :kc] = 0.0
        for p in range(kc):
            for r in range(N - j0):
                dst[r, p] = B[k0 + p, j0 + r]


@njit(fastmath=True, cache=True)
def _pack_b(Bp, B):
    """Bp (nkb, ns, PNR, PKC) <- B (K, N), one sliver block after another."""
    for kb in range(Bp.shape[0]):
        for s in range(Bp.shape[1]):
            _pack_b_sliver(Bp, B, kb, s)


@njit(fastmath=True, parallel=True, cache=True)
def _pack_b_par(Bp, B):
    """_pack_b with the sliver blocks spread over cores."""
    ns = Bp.shape[1]
    for t in prange(Bp.shape[0] * ns):
        kb = t // ns
        _pack_b_sliver(Bp, B, kb, t - kb * ns)


@njit(fastmath=True, cache=True)
def _micro_4x6(C, a, b, kc, i, j, add):
    """C[i:i+4, j:j+6] (+)= a[:, :kc] @ b[:, :kc].T, a (PMR, PKC) and b (PNR, PKC) packed slivers.

    24 scalar sums; LLVM vectorises the k loop, so each sum becomes one ymm register of 8 partial sums
    and each step of 8 k-values is 10 vector loads (all stride 1, from two contiguous 16 + 24 KiB blocks) and
    24 FMAs. The 24 sums are reduced (8 lanes -> 1) once per call, which PKC = 1024 makes ~3 % of the work.
    The first K block stores (``add`` False: C needs no zeroing), later ones add. Rows/columns of the tile
    beyond C (zero padding in the slivers) are not written back.
    """
    a0 = a[0, :kc]
    a1 = a[1, :kc]
    a2 = a[2, :kc]
    a3 = a[3, :kc]
    b0 = b[0, :kc]
    b1 = b[1, :kc]
    b2 = b[2, :kc]
    b3 = b[3, :kc]
    b4 = b[4, :kc]
    b5 = b[5, :kc]
    s00 = s01 = s02 = s03 = s04 = s05 = np.float32(0.0)
    s10 = s11 = s12 = s13 = s14 = s15 = np.float32(0.0)
    s20 = s21 = s22 = s23 = s24 = s25 = np.float32(0.0)
    s30 = s31 = s32 = s33 = s34 = s35 = np.float32(0.0)
    for k in range(kc):
        x0 = a0[k]
        x1 = a1[k]
        x2 = a2[k]
        x3 = a3[k]
        y0 = b0[k]
        y1 = b1[k]
        y2 = b2[k]
        y3 = b3[k]
        y4 = b4[k]
        y5 = b5[k]
        s00 += x0 * y0
        s01 += x0 * y1
        s02 += x0 * y2
        s03 += x0 * y3
        s04 += x0 * y4
        s05 += x0 * y5
        s10 += x1 * y0
        s11 += x1 * y1
        s12 += x1 * y2
        s13 += x1 * y3
        s14 += x1 * y4
        s15 += x1 * y5
        s20 += x2 * y0
        s21 += x2 * y1
        s22 += x2 * y2
        s23 += x2 * y3
        s24 += x2 * y4
        s25 += x2 * y5
        s30 += x3 * y0
        s31 += x3 * y1
        s32 += x3 * y2
        s33 += x3 * y3
        s34 += x3 * y4
        s35 += x3 * y5
    M, N = C.shape
    if not add:  # the first K block: C needs no zeroing beforehand
        C[i:i + PMR, j:j + PNR] = 0.0  # (a view: clipped at C's edges)
    if i + PMR <= M and j + PNR <= N:  # a whole tile: 24 adds
        C[i, j] += s00
        C[i, j + 1] += s01
        C[i, j + 2] += s02
        C[i, j + 3] += s03
        C[i, j + 4] += s04
        C[i, j + 5] += s05
        C[i + 1, j] += s10
        C[i + 1, j + 1] += s11
        C[i + 1, j + 2] += s12
        C[i + 1, j + 3] += s13
        C[i + 1, j + 4] += s14
        C[i + 1, j + 5] += s15
        C[i + 2, j] += s20
        C[i + 2, j + 1] += s21
        C[i + 2, j + 2] += s22
        C[i + 2, j + 3] += s23
        C[i + 2, j + 4] += s24
        C[i + 2, j + 5] += s25
        C[i + 3, j] += s30
        C[i + 3, j + 1] += s31
        C[i + 3, j + 2] += s32
        C[i + 3, j + 3] += s33
        C[i + 3, j + 4] += s34
        C[i + 3, j + 5] += s35
    else:  # the bottom/right edge: only the part of the tile inside C
        t = ((s00, s01, s02, s03, s04, s05), (s10, s11, s12, s13, s14, s15),
             (s20, s21, s22, s23, s24, s25), (s30, s31, s32, s33, s34, s35))
        for r in range(min(PMR, M - i)):
            for c in range(min(PNR, N - j)):
                C[i + r, j + c] += t[r][c]


@njit(fastmath=True, cache=True)
def _packed_rows(C, A, Bp, Ap, i0, i1):
    """C[i0:i1] = A[i0:i1] @ B, with B already packed (Bp) and Ap a scratch block for this task's A."""
    K = A.shape[1]
    na = (i1 - i0 + PMR - 1) // PMR  # A slivers in this block
    for kb in range(Bp.shape[0]):
        k0 = kb * PKC
        kc = min(PKC, K - k0)
        # pack A[i0:i1, k0:k0+kc] into PMR-row slivers, one contiguous (PMR, PKC) block each, rows past i1 zero
        for s in range(na):
            for r in range(PMR):
                i = i0 + s * PMR + r
                dst = Ap[s, r]
                if i < i1:
                    src = A[i, k0:k0 + kc]
                    for p in range(kc):
                        dst[p] = src[p]
                else:
                    dst[:kc] = 0.0
        for sj in range(Bp.shape[1]):  # one B sliver (24 KiB) stays in L1 ...
            b = Bp[kb, sj]
            for si in range(na):  # ... while the A slivers stream past it from L2
                _micro_4x6(C, Ap[si], b, kc, i0 + si * PMR, sj * PNR, kb > 0)


def _packed_buffers(A, B):
    K, N = B.shape
    nkb = (K + PKC - 1) // PKC
    return np.empty((nkb, (N + PNR - 1) // PNR, PNR, PKC + PPAD), dtype=B.dtype)


@njit(fastmath=True, cache=True)
def _gemm_packed(C, A, Bp):
    M = A.shape[0]
    Ap = np.empty((PMC // PMR, PMR, PKC + PPAD), dtype=A.dtype)
    for i0 in range(0, M, PMC):
        _packed_rows(C, A, Bp, Ap, i0, min(i0 + PMC, M))


@register("gemm", "cpu", "packed", rung=7)
def gemm_packed(C, A, B):
    """Packing and a 4x6 micro-kernel: A and B copied into the order the micro-kernel reads them.

    B is copied once into 6-column slivers (each 1024-deep block of a sliver is 6 contiguous rows of k,
    zero-padded past N), and each 64 x 1024 block of A into 4-row slivers just before use. The micro-kernel
    then reads two contiguous blocks (16 KiB of A from L2, 24 KiB of B kept in L1) and keeps a 4x6 tile of C
    in 24 ymm registers: 24 FMAs per 10 loads instead of rung 5's 16 per 8, and no scalar edge code (zero
    padding). Predicted: ~1.3x rung 5 on one core, ~90 % of the core's 256-bit FMA peak (2 FMA x 8 floats x
    2 FLOPs per cycle: ~115 GFLOP/s at 3.6 GHz)."""
    Bp = _packed_buffers(A, B)
    _pack_b(Bp, B)
    _gemm_packed(C, A, Bp)


@njit(fastmath=True, parallel=True, cache=True)
def _gemm_packed_par(C, A, Bp):
    M = A.shape[0]
    nb = (M + PMC - 1) // PMC
    for ib in prange(nb):  # each task owns PMC rows of C and packs its own block of A
        Ap = np.empty((PMC // PMR, PMR, PKC + PPAD), dtype=A.dtype)
        i0 = ib * PMC
        _packed_rows(C, A, Bp, Ap, i0, min(i0 + PMC, M))


@register("gemm", "cpu", "packed_par", rung=8)
def gemm_packed_par(C, A, B):
    """Rung 7 with 64-row blocks of C spread over cores with prange (B packed in parallel too).

    Rung 7 with prange over 64-row blocks of C; each task packs its own A block, all share the packed B.
    Predicted: ~2x rung 7 on 2 cores, about 200 GFLOP/s: ~65 % of OpenBLAS, whose hand-written kernel
    uses 512-bit zmm registers, twice the 256-bit width LLVM gives Numba's loops on this CPU."""
    Bp = _packed_buffers(A, B)
    _pack_b_par(Bp, B)
    _gemm_packed_par(C, A, Bp)


# ------------------------------------------------------- rung 9: the BLAS form, a broadcast-FMA micro-kernel in zmm
# Rungs 5-8 are dot products along k: each register holds 16 partial sums that are folded into one number at
# the end of every K block, and a tile of C can only be as large as the number of sums LLVM keeps apart. BLAS
# kernels turn it around: each step of k broadcasts one element of A (vbroadcastss) and multiplies it by a
# 16-float vector of a row of B, adding into a tile of C held in registers as whole vectors. Nothing is folded,
# and the tile grows in the direction of the vector. Numba's scalar code cannot say "a tile of C in registers"
# (a local array lives in memory), so this rung takes 16-float vectors from the compiler door (cpusimd.py:
# vload16, vsplat16, vfma16, the intrinsics of C's <immintrin.h> in Numba form).
ZMR, ZNR = 12, 32  # register tile of C: 12 rows x 32 columns = 24 zmm accumulators (+ 2 of B + 1 broadcast)
ZKC = 1024  # depth of a packed block: a B sliver (1024 x 32 floats = 128 KiB) and the task's A block stay in L2
ZMC = 72  # rows of C per task at most: the packed A block (72 x 1024 floats = 288 KiB) stays in L2 (2 MiB)
# Why so deep, when BLIS sizes KC for a B sliver in L1? Measured (1 thread, CPU time, 1024^3, vs NumPy in the same
# process, with the 8 x 32 tile rung 9 had first): KC = 256 / 512 / 1024 / 2048 gave 0.75 / 0.79 / 0.82 / 0.82 of OpenBLAS. Each K block ends with a
# read-add-write of C, whose rows are 4 KiB apart (same L1 sets) and had left L2 by the next block; the broadcast
# form's loads (2 vectors of B + 8 floats of A per 16 FMAs) are few enough to come from L2 instead of L1.


@njit(fastmath=True, cache=True)
def _zpack_b_sliver(Bp, B, kb, s):
    """Bp[kb, s] (ZKC * ZNR,) <- B[k0:k0+kc, j0:j0+ZNR], row p of k at p * ZNR; columns past N are zeros.
    B may be any strided view (a transpose): this copy is where its layout is paid for, once."""
    K, N = B.shape
    k0 = kb * ZKC
    kc = min(ZKC, K - k0)
    j0 = s * ZNR
    dst = Bp[kb, s]
    w = min(ZNR, N - j0)
    if w == ZNR:  # a whole sliver: one 128-byte row piece of B per step of k (a vector copy when B is row-major)
        for p in range(kc):
            dst[p * ZNR:(p + 1) * ZNR] = B[k0 + p, j0:j0 + ZNR]
    else:
        for p in range(kc):
            for c in range(w):
                dst[p * ZNR + c] = B[k0 + p, j0 + c]
            for c in range(w, ZNR):
                dst[p * ZNR + c] = 0.0


@njit(fastmath=True, parallel=True, cache=True)
def _zpack_b_par(Bp, B):
    ns = Bp.shape[1]
    for t in prange(Bp.shape[0] * ns):
        kb = t // ns
        _zpack_b_sliver(Bp, B, kb, t - kb * ns)


@njit(fastmath=True, cache=True)
def _micro_12x32(C, a, b, kc, i, j, add, tile):
    """C[i:i+12, j:j+32] (+)= a @ b over kc steps of k: a (kc * 12,) and b (kc * 32,) packed slivers.

    Each step loads two vectors of B (32 floats), broadcasts 12 elements of A, and does 24 vector FMAs into
    24 zmm accumulators (row r of the tile is cr0, cr1; 24 + 2 of B + 1 broadcast = 27 of the 32 registers):
    24 x 16 x 2 = 768 FLOPs per step for 14 loads. The first K block stores (``add`` False), later ones add.
    A tile that sticks out of C goes through ``tile`` and only its inside is written.
    """
    M, N = C.shape
    whole = i + ZMR <= M and j + ZNR <= N
    if whole:  # the 24 cache lines of this C tile start on their way now, not at the stores (rows 4 KiB apart
        for r in range(ZMR):  # share L1 sets and miss): prefetchw is a hint, it never faults
            prefetchw(C[i + r], j)
            prefetchw(C[i + r], j + 16)
    c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = vzero16()
    c60 = c61 = c70 = c71 = c80 = c81 = c90 = c91 = ca0 = ca1 = cb0 = cb1 = vzero16()
    for k in range(kc):
        b0 = vload16(b, k * ZNR)
        b1 = vload16(b, k * ZNR + 16)
        x = vsplat16(a[k * ZMR])
        c00 = vfma16(x, b0, c00)
        c01 = vfma16(x, b1, c01)
        x = vsplat16(a[k * ZMR + 1])
        c10 = vfma16(x, b0, c10)
        c11 = vfma16(x, b1, c11)
        x = vsplat16(a[k * ZMR + 2])
        c20 = vfma16(x, b0, c20)
        c21 = vfma16(x, b1, c21)
        x = vsplat16(a[k * ZMR + 3])
        c30 = vfma16(x, b0, c30)
        c31 = vfma16(x, b1, c31)
        x = vsplat16(a[k * ZMR + 4])
        c40 = vfma16(x, b0, c40)
        c41 = vfma16(x, b1, c41)
        x = vsplat16(a[k * ZMR + 5])
        c50 = vfma16(x, b0, c50)
        c51 = vfma16(x, b1, c51)
        x = vsplat16(a[k * ZMR + 6])
        c60 = vfma16(x, b0, c60)
        c61 = vfma16(x, b1, c61)
        x = vsplat16(a[k * ZMR + 7])
        c70 = vfma16(x, b0, c70)
        c71 = vfma16(x, b1, c71)
        x = vsplat16(a[k * ZMR + 8])
        c80 = vfma16(x, b0, c80)
        c81 = vfma16(x, b1, c81)
        x = vsplat16(a[k * ZMR + 9])
        c90 = vfma16(x, b0, c90)
        c91 = vfma16(x, b1, c91)
        x = vsplat16(a[k * ZMR + 10])
        ca0 = vfma16(x, b0, ca0)
        ca1 = vfma16(x, b1, ca1)
        x = vsplat16(a[k * ZMR + 11])
        cb0 = vfma16(x, b0, cb0)
        cb1 = vfma16(x, b1, cb1)
    if whole:  # a whole tile: 24 vector stores (or load-add-stores) straight into C
        if add:
            c00 = vadd16(c00, vload16(C[i], j))
            c01 = vadd16(c01, vload16(C[i], j + 16))
            c10 = vadd16(c10, vload16(C[i + 1], j))
            c11 = vadd16(c11, vload16(C[i + 1], j + 16))
            c20 = vadd16(c20, vload16(C[i + 2], j))
            c21 = vadd16(c21, vload16(C[i + 2], j + 16))
            c30 = vadd16(c30, vload16(C[i + 3], j))
            c31 = vadd16(c31, vload16(C[i + 3], j + 16))
            c40 = vadd16(c40, vload16(C[i + 4], j))
            c41 = vadd16(c41, vload16(C[i + 4], j + 16))
            c50 = vadd16(c50, vload16(C[i + 5], j))
            c51 = vadd16(c51, vload16(C[i + 5], j + 16))
            c60 = vadd16(c60, vload16(C[i + 6], j))
            c61 = vadd16(c61, vload16(C[i + 6], j + 16))
            c70 = vadd16(c70, vload16(C[i + 7], j))
            c71 = vadd16(c71, vload16(C[i + 7], j + 16))
            c80 = vadd16(c80, vload16(C[i + 8], j))
            c81 = vadd16(c81, vload16(C[i + 8], j + 16))
            c90 = vadd16(c90, vload16(C[i + 9], j))
            c91 = vadd16(c91, vload16(C[i + 9], j + 16))
            ca0 = vadd16(ca0, vload16(C[i + 10], j))
            ca1 = vadd16(ca1, vload16(C[i + 10], j + 16))
            cb0 = vadd16(cb0, vload16(C[i + 11], j))
            cb1 = vadd16(cb1, vload16(C[i + 11], j + 16))
        vstore16(C[i], j, c00)
        vstore16(C[i], j + 16, c01)
        vstore16(C[i + 1], j, c10)
        vstore16(C[i + 1], j + 16, c11)
        vstore16(C[i + 2], j, c20)
        vstore16(C[i + 2], j + 16, c21)
        vstore16(C[i + 3], j, c30)
        vstore16(C[i + 3], j + 16, c31)
        vstore16(C[i + 4], j, c40)
        vstore16(C[i + 4], j + 16, c41)
        vstore16(C[i + 5], j, c50)
        vstore16(C[i + 5], j + 16, c51)
        vstore16(C[i + 6], j, c60)
        vstore16(C[i + 6], j + 16, c61)
        vstore16(C[i + 7], j, c70)
        vstore16(C[i + 7], j + 16, c71)
        vstore16(C[i + 8], j, c80)
        vstore16(C[i + 8], j + 16, c81)
        vstore16(C[i + 9], j, c90)
        vstore16(C[i + 9], j + 16, c91)
        vstore16(C[i + 10], j, ca0)
        vstore16(C[i + 10], j + 16, ca1)
        vstore16(C[i + 11], j, cb0)
        vstore16(C[i + 11], j + 16, cb1)
    else:  # the bottom/right edge: the tile goes to a scratch buffer, and only its inside into C
        vstore16(tile, 0, c00)
        vstore16(tile, 16, c01)
        vstore16(tile, 32, c10)
        vstore16(tile, 48, c11)
        vstore16(tile, 64, c20)
        vstore16(tile, 80, c21)
        vstore16(tile, 96, c30)
        vstore16(tile, 112, c31)
        vstore16(tile, 128, c40)
        vstore16(tile, 144, c41)
        vstore16(tile, 160, c50)
        vstore16(tile, 176, c51)
        vstore16(tile, 192, c60)
        vstore16(tile, 208, c61)
        vstore16(tile, 224, c70)
        vstore16(tile, 240, c71)
        vstore16(tile, 256, c80)
        vstore16(tile, 272, c81)
        vstore16(tile, 288, c90)
        vstore16(tile, 304, c91)
        vstore16(tile, 320, ca0)
        vstore16(tile, 336, ca1)
        vstore16(tile, 352, cb0)
        vstore16(tile, 368, cb1)
        for r in range(min(ZMR, M - i)):
            for c in range(min(ZNR, N - j)):
                if add:
                    C[i + r, j + c] += tile[r * ZNR + c]
                else:
                    C[i + r, j + c] = tile[r * ZNR + c]


@njit(fastmath=True, cache=True)
def _zmm_rows(C, A, Bp, Ap, tile, i0, i1):
    """C[i0:i1] = A[i0:i1] @ B, B packed (Bp), Ap scratch for this task's packed A block."""
    K = A.shape[1]
    na = (i1 - i0 + ZMR - 1) // ZMR  # A slivers in this block
    for kb in range(Bp.shape[0]):
        k0 = kb * ZKC
        kc = min(ZKC, K - k0)
        for s in range(na):  # pack A[i0:i1, k0:k0+kc]: sliver s holds rows i0+8s..+7, element (p, r) at p*8 + r
            dst = Ap[s]
            ia = i0 + s * ZMR
            nr = min(ZMR, i1 - ia)
            for p in range(kc):  # p outer, r inner: 8 short streams if A is row-major, one if it is a transpose
                for r in range(nr):
                    dst[p * ZMR + r] = A[ia + r, k0 + p]
                for r in range(nr, ZMR):
                    dst[p * ZMR + r] = 0.0
        for sj in range(Bp.shape[1]):  # one B sliver (128 KiB) stays in L2 (and its current rows in L1) ...
            b = Bp[kb, sj]
            for si in range(na):  # ... while the A slivers (32 KiB each) of this task's block stream past it
                _micro_12x32(C, Ap[si], b, kc, i0 + si * ZMR, sj * ZNR, kb > 0, tile)


def _zmm_tasks(M, threads):
    """How many row blocks of C: a multiple of the thread count (prange gives each thread an equal run of
    tasks, and the tasks below hold equal numbers of slivers, to within one), at least two per thread (the
    linear layers' dW has only M = 256 rows), and at most ZMC rows each."""
    t = max(int(threads), 1)
    nsl = -(-M // ZMR)  # 12-row slivers of C
    per_thread = max(2, -(-nsl // (t * (ZMC // ZMR))))
    return max(1, min(t * per_thread, nsl))


@njit(fastmath=True, parallel=True, cache=True)
def _gemm_zmm_par(C, A, Bp, nb):
    M = A.shape[0]
    nsl = (M + ZMR - 1) // ZMR
    for ib in prange(nb):  # task ib owns slivers [ib*nsl//nb, (ib+1)*nsl//nb) of C and packs its own block of A
        s0 = ib * nsl // nb
        s1 = (ib + 1) * nsl // nb
        Ap = np.empty((s1 - s0, ZKC * ZMR), dtype=np.float32)
        tile = np.empty(ZMR * ZNR, dtype=np.float32)
        _zmm_rows(C, A, Bp, Ap, tile, s0 * ZMR, min(s1 * ZMR, M))


def gemm_zmm_into(C, A, B):
    """The rung-9 GEMM on any float32 views A (M,K) and B (K,N) (transposes included) into C (M,N)."""
    M, K = A.shape
    N = B.shape[1]
    out = C if C.flags.c_contiguous else np.empty(C.shape, np.float32)
    if K == 0:
        out[...] = 0.0
    else:
        Bp = np.empty(((K + ZKC - 1) // ZKC, (N + ZNR - 1) // ZNR, ZKC * ZNR), dtype=np.float32)
        _zpack_b_par(Bp, B)
        _gemm_zmm_par(out, A, Bp, _zmm_tasks(M, get_num_threads()))
    if out is not C:
        C[...] = out


@register("gemm", "cpu", "zmm_par", rung=9, requires=zmm_kernels)
def gemm_zmm_par(C, A, B):
    """The BLAS form: broadcast one element of A, multiply a 32-float row piece of B, 24 zmm accumulators.

    Each step of k is 2 vector loads of B, 12 broadcasts of A and 24 FMAs on 512-bit registers into a 12 x 32
    tile of C kept in registers (no folding of partial sums, unlike rungs 5-8); B is packed in 32-column
    slivers (1024 deep), A in 12-row slivers per task; tasks are row blocks of C of at most 72 rows, as many
    per thread on every thread (at least two), with equal numbers of slivers to within one. An 8 x 32 tile (16 accumulators, 10 loads per 16 FMAs) measured
    0.80x OpenBLAS on one core against 0.9-1.0x for 12 x 32 (1 thread, CPU time, one process). A register-only FMA loop (``kernels_src.tools.fmapeak``) measures
    2 zmm FMAs per cycle per core here, about 7 G FMAs/s = 225 GFLOP/s a core; the micro-kernel alone on
    L1-resident slivers ran at ~92 % of that. Predicted: 75-85 % of the core's peak once packing and L2
    traffic are paid, about OpenBLAS's own fraction: 0.8-1.0x numpy.matmul, against rung 8's 0.6x.
    Measured A/B (1 thread, CPU time, one process, 1024^3, busy shared machine): 0.82-0.94x OpenBLAS, rung 7
    0.59-0.68x. Needs AVX-512 (``requires=``): on AVX2 each 16-float vector is two ymm registers and the tile
    would spill, so rung 8 stays the best there."""
    gemm_zmm_into(C, A, B)


def gemm_regblock_into(C, A, B):
    """Rung 6 (``regblock_par``) on any operands, strided views included: A's rows are copied to contiguous rows
    when they are not (the micro-kernel loads 8 floats of a row at a time), and B is transposed once, unless B
    is itself the transpose of a C-contiguous matrix (``W.T``), whose rows are then used as they are."""
    if not A.flags.c_contiguous:
        A = np.ascontiguousarray(A)
    if B.T.flags.c_contiguous:
        Bt = B.T
    else:
        Bt = np.empty((B.shape[1], B.shape[0]), dtype=B.dtype)
        _transpose(Bt, B)
    _gemm_regblock_par(C, A, Bt)


def gemm_cpu_best(C, A, B):
    """C = A @ B with the course's fastest CPU GEMM on this machine (a stable name for other ops to build on:
    conv2d's im2col, the linear layers): rung 9 where the CPU has AVX-512 and the 512-bit switch is on, else
    rung 6, the 4x4 register tile, which on the 2-core AVX2 EPYC of the committed board ran 1024^3 at 51
    GFLOP/s against rung 8's 39 (rung 8's 4x6 tile needs 24 accumulators, more than AVX2's 16 ymm registers: its
    loop reloads 16 of them from the stack, `kernels cpuboard --asm`). A and B may be strided views: rung 6
    copies a strided A to contiguous rows first, and that copy still costs less than rung 8's spills there
    (conv1d's overlapping windows: 90-93 ms through rung 6 with the copy, 122 ms through rung 8's packing, on
    that board)."""
    if _ZMM_OK is None:
        _zmm_ok()
    if _ZMM_OK:
        gemm_zmm_into(C, A, B)
    else:
        gemm_regblock_into(C, A, B)


_ZMM_OK = None


def _zmm_ok():
    global _ZMM_OK
    _ZMM_OK = bool(zmm_kernels()[0])
    return _ZMM_OK


@register("gemm", "cpu", "torch", baseline=True, requires=torch_cpu)
def gemm_torch_cpu(C, A, B):
    """torch.matmul on the CPU (oneDNN/MKL-style kernels), with as many threads as Numba, into C (no copy)."""
    import torch

    c, a, b = tviews(C, A, B)
    torch.matmul(a, b, out=c)


# ================================================================================================ GPU
SIG = "void(float32[:, ::1], float32[:, ::1], float32[:, ::1])"
# The CUDA simulator refuses ``alignment=`` (and launch bounds); the real compiler needs it for
# 16-byte vector loads from shared memory. None means "the dtype's natural alignment" (4 bytes).
SMEM_ALIGN = None if device.SIMULATED else 16


def _jit(**opts):
    """cuda.jit with options the simulator ignores dropped when simulating."""
    if device.SIMULATED:
        opts = {k: v for k, v in opts.items() if k in ("fastmath", "device")}
    return cuda.jit(**opts)


# ------------------------------------------------------------------ cuBLAS yardstick (through torch)
def _torch_gpu():
    if device.MODE != "gpu":
        return False, "cuBLAS needs a real GPU"
    try:
        import torch
    except ImportError:
        return False, "torch is not installed (cuBLAS is reached through torch)"
    if not torch.cuda.is_available():
        return False, "torch cannot see a CUDA GPU"
    return True, ""


_TORCH_VIEWS: dict = {}


def _as_torch(a):
    """Zero-copy torch view of a numba device array (cached: the bench calls us hundreds of times)."""
    import torch

    ptr = a.__cuda_array_interface__["data"][0]
    key = (ptr, a.shape)
    t = _TORCH_VIEWS.get(key)
    if t is None:
        if len(_TORCH_VIEWS) > 64:
            _TORCH_VIEWS.clear()
        t = _TORCH_VIEWS[key] = (torch.as_tensor(a, device="cuda"), a)  # keep a alive with its view
    return t[0]


@register("gemm", "gpu", "cublas", baseline=True, requires=_torch_gpu)
def gemm_cublas(C, A, B):
    """cuBLAS SGEMM via torch.matmul with TF32 disabled: true float32 FMAs, NVIDIA's tuned kernels."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.matmul(_as_torch(A), _as_torch(B), out=_as_torch(C))


# ------------------------------------------------------------------------------- rungs 1-2: naive
NAIVE_X, NAIVE_Y = 32, 8  # 256 threads per block; a warp is 32 consecutive threadIdx.x


@_jit(fastmath=True)
def gemm_naive_kernel(C, A, B):
    M, N = C.shape
    K = A.shape[1]
    i = cuda.blockIdx.x * NAIVE_X + cuda.threadIdx.x  # row: the 32 threads of a warp take 32 rows
    j = cuda.blockIdx.y * NAIVE_Y + cuda.threadIdx.y
    if i < M and j < N:
        acc = float32(0.0)
        for k in range(K):
            acc += A[i, k] * B[k, j]  # A[i, k]: 32 lanes, 32 rows, 32 separate 32-byte sectors
        C[i, j] = acc


@register("gemm", "gpu", "naive", rung=1, ptx=[(gemm_naive_kernel, SIG)],
          bytes=lambda s, b: s[0] * s[1] * s[2] * (32 + 32 / 32) + s[0] * s[1] * 32)
def gemm_naive(C, A, B):
    """One thread per C element, threadIdx.x -> row: a warp reads 32 different rows (uncoalesced).

    One thread per C element, threadIdx.x -> row i. A warp's 32 loads of A[i, k] hit 32 different
    rows: 32 sectors of 32 bytes for 128 useful bytes, and its stores of C scatter the same way. The
    bytes model counts a 32-byte sector per A element and C element. Predicted: far below 1 TFLOP/s."""
    M, N = C.shape
    gemm_naive_kernel[(ceil_div(M, NAIVE_X), ceil_div(N, NAIVE_Y)), (NAIVE_X, NAIVE_Y)](C, A, B)


@_jit(fastmath=True)
def gemm_coalesced_kernel(C, A, B):
    M, N = C.shape
    K = A.shape[1]
    j = cuda.blockIdx.x * NAIVE_X + cuda.threadIdx.x  # column: a warp takes 32 adjacent columns
    i = cuda.blockIdx.y * NAIVE_Y + cuda.threadIdx.y
    if i < M and j < N:
        acc = float32(0.0)
        for k in range(K):
            acc += A[i, k] * B[k, j]  # A[i, k]: one address, broadcast; B[k, j]: 128 contiguous bytes
        C[i, j] = acc


@register("gemm", "gpu", "coalesced", rung=2, ptx=[(gemm_coalesced_kernel, SIG)],
          bytes=lambda s, b: s[0] * s[1] * s[2] * b * (1 + 1 / 32) + s[0] * s[1] * b)
def gemm_coalesced(C, A, B):
    """threadIdx.x -> column: a warp reads 128 contiguous bytes of B (coalesced).

    Swap the roles of threadIdx.x and y: now a warp's 32 threads share i and take adjacent j, so
    B[k, j] is one 128-byte transaction and A[i, k] one broadcast. Same FLOPs, ~8x fewer sectors per
    useful byte. Predicted: several times rung 1, then limited by re-reading A and B from L2
    (~4 bytes per FMA)."""
    M, N = C.shape
    gemm_coalesced_kernel[(ceil_div(N, NAIVE_X), ceil_div(M, NAIVE_Y)), (NAIVE_X, NAIVE_Y)](C, A, B)


# ------------------------------------------------------------------------- rung 3: shared tiles
TILE = 32


@_jit(fastmath=True)
def gemm_smem_kernel(C, A, B):
    M, N = C.shape
    K = A.shape[1]
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    i = cuda.blockIdx.y * TILE + ty
    j = cuda.blockIdx.x * TILE + tx
    As = cuda.shared.array((TILE, TILE), float32)
    Bs = cuda.shared.array((TILE, TILE), float32)
    acc = float32(0.0)
    for k0 in range(0, K, TILE):
        # each thread stages one element of each tile; zeros outside the matrix keep the sum exact
        As[ty, tx] = A[i, k0 + tx] if i < M and k0 + tx < K else float32(0.0)
        Bs[ty, tx] = B[k0 + ty, j] if k0 + ty < K and j < N else float32(0.0)
        cuda.syncthreads()  # the whole tile must be written before anyone reads it
        for kk in range(TILE):
            acc += As[ty, kk] * Bs[kk, tx]
        cuda.syncthreads()  # ... and read by everyone before the next iteration overwrites it
    if i < M and j < N:
        C[i, j] = acc


@register("gemm", "gpu", "smem", rung=3, ptx=[(gemm_smem_kernel, SIG)], bytes=tile_bytes(TILE, TILE))
def gemm_smem(C, A, B):
    """32x32 tiles of A and B staged in shared memory, 32 FMAs per tile load.

    Blocks of 32x32 threads stage a 32x32 tile of A and of B in shared memory, then each thread does
    32 FMAs from it. Every global element is now read N/32 (A) or M/32 (B) times instead of N or M:
    intensity 8 FLOP/byte. Predicted: 2-4x rung 2; the inner loop now does 2 shared loads per FMA,
    which caps it far below the FMA peak."""
    M, N = C.shape
    gemm_smem_kernel[(ceil_div(N, TILE), ceil_div(M, TILE)), (TILE, TILE)](C, A, B)


# ------------------------------------------------------------------------ rung 4: 1D blocktiling
B1_BM, B1_BN, B1_BK, B1_TM = 64, 64, 8, 8
B1_NT = B1_BM * B1_BN // B1_TM  # 512 threads: each computes TM outputs of one column


@_jit(fastmath=True)
def gemm_blocktile1d_kernel(C, A, B):
    M, N = C.shape
    K = A.shape[1]
    tid = cuda.threadIdx.x
    row0 = cuda.blockIdx.y * B1_BM
    col0 = cuda.blockIdx.x * B1_BN
    ty = tid // B1_BN  # which group of TM rows (0..7)
    tx = tid % B1_BN  # which column (0..63)
    As = cuda.shared.array((B1_BM, B1_BK), float32)
    Bs = cuda.shared.array((B1_BK, B1_BN), float32)
    acc = cuda.local.array(B1_TM, float32)  # constant indices only: lives in registers
    for i in range(B1_TM):
        acc[i] = 0.0
    # loader coordinates: the A tile is 64x8 and the B tile 8x64, one element each per thread
    ar = tid // B1_BK
    ac = tid % B1_BK
    br = tid // B1_BN
    bc = tid % B1_BN
    for k0 in range(0, K, B1_BK):
        As[ar, ac] = A[row0 + ar, k0 + ac] if row0 + ar < M and k0 + ac < K else float32(0.0)
        Bs[br, bc] = B[k0 + br, col0 + bc] if k0 + br < K and col0 + bc < N else float32(0.0)
        cuda.syncthreads()
        for kk in range(B1_BK):
            b = Bs[kk, tx]  # one shared load, re-used TM times from a register
            for i in range(B1_TM):
                acc[i] += As[ty * B1_TM + i, kk] * b
        cuda.syncthreads()
    for i in range(B1_TM):
        r = row0 + ty * B1_TM + i
        if r < M and col0 + tx < N:
            C[r, col0 + tx] = acc[i]


@register("gemm", "gpu", "blocktile1d", rung=4, ptx=[(gemm_blocktile1d_kernel, SIG)],
          bytes=tile_bytes(B1_BM, B1_BN))
def gemm_blocktile1d(C, A, B):
    """1D blocktiling: 64x64 block tile, each thread computes 8 outputs of a column.

    Each thread computes 8 outputs down one column (a 64x64 block tile, 512 threads): the B value it
    loads from shared memory is re-used 8 times from a register, so shared loads per FMA drop from 2
    to 1.125, and the bigger tile doubles intensity to 16 FLOP/byte. Predicted: ~2x rung 3."""
    M, N = C.shape
    gemm_blocktile1d_kernel[(ceil_div(N, B1_BN), ceil_div(M, B1_BM)), B1_NT](C, A, B)


# ----------------------------------------------------------------- rungs 5-9: 2D register tiles
def make_blocktile2d(BM=128, BN=128, BK=8, TM=8, TN=8, hinted=False):
    """Rung 5 (``hinted=False``) and rung 6 (``hinted=True``): a BM x BN block tile of C, each of the
    (BM/TM)*(BN/TN) threads owning a TM x TN register tile. A is stored transposed in shared memory
    (As[k, m]) so a thread's TM values of A are contiguous, like its TN values of B.

    The tile sizes are Python ints captured by the closure, so Numba sees them as compile-time
    constants: shared and local arrays get static shapes and the TM x TN loops unroll completely.
    """
    NT = (BM // TM) * (BN // TN)
    TC = BN // TN  # threads per row of the thread grid
    LA = BM * BK // NT  # A-tile elements each thread loads
    LB = BK * BN // NT
    align = SMEM_ALIGN if hinted else None
    assert NT & (NT - 1) == 0 and BM * BK % NT == 0 and BK * BN % NT == 0

    @_jit(fastmath=True)
    def kernel(C, A, B):
        M, N = C.shape
        K = A.shape[1]
        if hinted:
            # a no-op (tid < NT) that tells the compiler tid >= 0, so every index built from it is
            # known non-negative and Numba's negative-index fix-up disappears from the inner loop
            tid = cuda.threadIdx.x & (NT - 1)
        else:
            tid = cuda.threadIdx.x
        ty = tid // TC
        tx = tid % TC
        row0 = cuda.blockIdx.y * BM
        col0 = cuda.blockIdx.x * BN
        As = cuda.shared.array((BK, BM), float32, alignment=align)  # transposed: As[k, m] = A[m, k]
        Bs = cuda.shared.array((BK, BN), float32, alignment=align)
        acc = cuda.local.array((TM, TN), float32)
        rm = cuda.local.array(TM, float32)
        rn = cuda.local.array(TN, float32)
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = 0.0
        for k0 in range(0, K, BK):
            for s in range(LA):
                e = tid + s * NT
                r = e // BK
                c = e % BK  # neighbouring threads read neighbouring k of one row of A
                v = float32(0.0)
                if row0 + r < M and k0 + c < K:
                    v = A[row0 + r, k0 + c]
                As[c, r] = v
            for s in range(LB):
                e = tid + s * NT
                r = e // BN
                c = e % BN  # neighbouring threads read neighbouring columns of B
                v = float32(0.0)
                if k0 + r < K and col0 + c < N:
                    v = B[k0 + r, col0 + c]
                Bs[r, c] = v
            cuda.syncthreads()
            for kk in range(BK):
                for i in range(TM):
                    rm[i] = As[kk, ty * TM + i]
                for j in range(TN):
                    rn[j] = Bs[kk, tx * TN + j]
                for i in range(TM):  # TM*TN FMAs for TM+TN shared loads
                    for j in range(TN):
                        acc[i, j] += rm[i] * rn[j]
            cuda.syncthreads()
        for i in range(TM):
            r = row0 + ty * TM + i
            if r < M:
                for j in range(TN):
                    c = col0 + tx * TN + j
                    if c < N:
                        C[r, c] = acc[i, j]

    def launch(C, A, B):
        M, N = C.shape
        kernel[(ceil_div(N, BN), ceil_div(M, BM)), NT](C, A, B)

    launch.kernel = kernel
    launch.config = dict(BM=BM, BN=BN, BK=BK, TM=TM, TN=TN, threads=NT)
    return launch


def make_warptile(BM=128, BN=128, BK=8, TM=8, TN=8, pad=4, dbuf=False, wr=4, wc=8, minblocks=None, unroll=1):
    """Rungs 7-9. Three changes against rung 6, all about shared memory:

    - ``pad``: the transposed A tile gets ``pad`` spare columns (As[k, BM+pad]). Threads that store
      A[m, k..k+7] into As[k.., m] then hit 32 different banks instead of 4.
    - warp layout: the 32 lanes of a warp form a ``wr`` x ``wc`` (4 x 8) patch of the thread grid,
      and each thread's TM x TN tile is split into 4x4 pieces spaced a whole warp-patch apart. A
      warp's 16-byte loads of A then cover 4 x 16 contiguous bytes and of B 8 x 16: one 128-byte
      shared-memory wavefront each, with no bank conflicts.
    - ``dbuf``: two shared buffers; the next tile's global loads are issued into registers before
      this tile's FMAs, and stored to the other buffer after them, with one barrier per tile.
    """
    NT = (BM // TM) * (BN // TN)
    TR = BM // TM  # thread-grid rows
    TC = BN // TN  # thread-grid columns
    LA = BM * BK // NT
    LB = BK * BN // NT
    QM = TM // 4  # 4-row pieces per thread
    QN = TN // 4
    BMP = BM + pad
    WPR = TC // wc  # warps across the thread grid
    NBUF = 2 if dbuf else 1
    UNROLL = unroll  # k steps per trip of the inner loop
    SROWS = NBUF * BK  # shared-array shapes must be compile-time constants: computed here
    align = SMEM_ALIGN
    assert wr * wc == 32 and TR % wr == 0 and TC % wc == 0 and TM % 4 == 0 and TN % 4 == 0
    assert NT & (NT - 1) == 0 and BM * BK % NT == 0 and BK * BN % NT == 0 and BMP % 4 == 0
    opts = dict(fastmath=True)
    if minblocks:
        opts["launch_bounds"] = (NT, minblocks)

    @_jit(**opts)
    def kernel(C, A, B):
        M, N = C.shape
        K = A.shape[1]
        tid = cuda.threadIdx.x & (NT - 1)  # tells the compiler tid >= 0 (see rung 6)
        warp = tid // 32
        lane = tid % 32
        ty = (warp // WPR) * wr + lane // wc  # thread-grid row of this thread
        tx = (warp % WPR) * wc + lane % wc
        row0 = cuda.blockIdx.y * BM
        col0 = cuda.blockIdx.x * BN
        # NBUF buffers stacked along the first axis: buffer b holds rows b*BK .. b*BK+BK-1
        As = cuda.shared.array((SROWS, BMP), float32, alignment=align)  # As[k, m] = A[m, k]
        Bs = cuda.shared.array((SROWS, BN), float32, alignment=align)
        acc = cuda.local.array((TM, TN), float32)
        rm = cuda.local.array(TM, float32)
        rn = cuda.local.array(TN, float32)
        ra = cuda.local.array(LA, float32)  # this thread's share of one A tile and one B tile
        rb = cuda.local.array(LB, float32)
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = 0.0
        ntiles = (K + BK - 1) // BK
        # Trip t loads tile t. With double buffering it also computes tile t-1 from the other
        # buffer, between issuing tile t's global loads and storing them to shared memory.
        for t in range(ntiles + NBUF - 1):
            k0 = t * BK
            if t < ntiles:
                for s in range(LA):
                    e = tid + s * NT
                    r = e // BK
                    c = e % BK  # neighbouring threads read neighbouring k of one row of A
                    v = float32(0.0)
                    if row0 + r < M and k0 + c < K:
                        v = A[row0 + r, k0 + c]
                    ra[s] = v
                for s in range(LB):
                    e = tid + s * NT
                    r = e // BN
                    c = e % BN  # neighbouring threads read neighbouring columns of B
                    v = float32(0.0)
                    if k0 + r < K and col0 + c < N:
                        v = B[k0 + r, col0 + c]
                    rb[s] = v
            if not dbuf:  # single buffer: store, wait for everyone, then compute this tile
                for s in range(LA):
                    e = tid + s * NT
                    As[e % BK, e // BK] = ra[s]
                for s in range(LB):
                    e = tid + s * NT
                    Bs[e // BN, e % BN] = rb[s]
                cuda.syncthreads()
            if t >= NBUF - 1:
                kb = ((t - NBUF + 1) & (NBUF - 1)) * BK  # first row of the buffer to compute from
                for k0 in range(0, BK, UNROLL):
                    for u in range(UNROLL):  # a constant-length loop: fully unrolled by the compiler
                        kk = kb + ((k0 + u) & (BK - 1))  # "& (BK-1)" changes nothing but proves kk >= 0
                        for p in range(QM):
                            for q in range(4):
                                rm[p * 4 + q] = As[kk, p * TR * 4 + ty * 4 + q]
                        for p in range(QN):
                            for q in range(4):
                                rn[p * 4 + q] = Bs[kk, p * TC * 4 + tx * 4 + q]
                        for i in range(TM):
                            for j in range(TN):
                                acc[i, j] += rm[i] * rn[j]
            if dbuf and t < ntiles:  # tile t goes to the buffer nobody is reading
                sb = (t & 1) * BK
                for s in range(LA):
                    e = tid + s * NT
                    As[sb + e % BK, e // BK] = ra[s]
                for s in range(LB):
                    e = tid + s * NT
                    Bs[sb + e // BN, e % BN] = rb[s]
            cuda.syncthreads()
        for p in range(QM):
            for q in range(4):
                r = row0 + p * TR * 4 + ty * 4 + q
                if r < M:
                    for pn in range(QN):
                        for qn in range(4):
                            c = col0 + pn * TC * 4 + tx * 4 + qn
                            if c < N:
                                C[r, c] = acc[p * 4 + q, pn * 4 + qn]

    def launch(C, A, B):
        M, N = C.shape
        kernel[(ceil_div(N, BN), ceil_div(M, BM)), NT](C, A, B)

    launch.kernel = kernel
    launch.config = dict(BM=BM, BN=BN, BK=BK, TM=TM, TN=TN, pad=pad, dbuf=dbuf, threads=NT,
                         warp=(wr, wc), minblocks=minblocks, unroll=unroll)
    return launch



# ------------------------------------------------------- rungs 10-11: 16-byte global loads, warp tiles
SIG_VEC = "void(float32[:, ::1], float32[:, ::1], float32[:, ::1], float32[::1], int64)"


def _addr(a) -> int:
    """Address of an array's first element (device array, simulator array or NumPy array)."""
    iface = getattr(a, "__cuda_array_interface__", None) or a.__array_interface__
    return iface["data"][0]


def make_vec(BM=128, BN=128, BK=8, TM=8, TN=8, LR=4, LC=8, warptile=False, pad=4, minblocks=None,
             unroll=2, epilogue=None, splitk=False):
    """Rungs 10 and 11, and the fused GEMM epilogue (``kernels_src.ops.epilogue``): rung 8's double-buffered
    kernel with three changes.

    - 16-byte global loads (``kernels_src.vec.load4``, PTX ``ld.global.v4.f32``): a thread fetches four
      consecutive floats of a row of A or B in one instruction, and C is written with 16-byte stores. They
      need every row to start on a 16-byte boundary (K and N multiples of 4, arrays 16-byte aligned) and a
      whole tile inside the matrix, so a block whose tile is entirely inside C takes this path for every
      full K tile, and edge blocks, the last partial K tile and unaligned shapes take a guarded scalar path
      (the branch is the same for every thread of a block: no divergence).
    - ``warptile``: a warp owns a contiguous WM x WN tile of C (WM = TM*LR, WN = TN*LC): its 32 lanes form
      an LR x LC grid, and each lane's TM x TN outputs are (TM/4) x (TN/4) pieces of 4 x 4, spaced one
      lane-grid apart *inside the warp's tile*. Without it (rung 10), the pieces are spread over the whole
      block tile, as in rungs 7-8.
    - ``epilogue``: a ``cuda.jit(device=True)`` function f; the kernel then stores f(acc + bias[col])
      instead of acc, while the result is still in registers (a fused bias + activation).
    - ``splitk`` (rung 12): the grid gains a third dimension; block z computes the product over its own
      slice of the K tiles and writes its partial tile into rows z*M ... z*M + M - 1 of C, which is then a
      (S*M, N) workspace (with one slice, C itself). The launcher adds the S partials with a second kernel.

    Every value read from shared memory is a 16-byte ``load4`` too. The kernel always takes a bias vector
    and a flag saying whether the fast path is allowed; the GEMM launchers pass a dummy bias, which the
    compiler never reads (``epilogue is None`` is a compile-time constant).
    """
    NT = (BM // TM) * (BN // TN)
    QM, QN = TM // 4, TN // 4  # 4 x 4 pieces per thread
    WM, WN = TM * LR, TN * LC  # a warp's tile of C (warptile=True)
    WARPS_N = BN // WN
    TR, TC = BM // TM, BN // TN  # the thread grid (warptile=False: pieces spaced a thread grid apart)
    WPR = TC // LC  # warps across the thread grid (warptile=False)
    MSTEP = 4 * LR if warptile else 4 * TR
    NSTEP = 4 * LC if warptile else 4 * TC
    MSTEP4, NSTEP4 = MSTEP // 4, NSTEP // 4
    UNROLL = unroll
    BK4, BN4 = BK // 4, BN // 4
    GA = BM * BK4 // NT  # 16-byte groups of the A tile each thread loads
    GB = BK * BN4 // NT
    GA4, GB4 = 4 * GA, 4 * GB  # local-array lengths must be plain constants
    BMP = BM + pad
    BMP4 = BMP // 4
    SROWS = 2 * BK  # two buffers
    align = SMEM_ALIGN
    EPI = epilogue is not None
    epi = epilogue if EPI else _identity
    SPLITK = bool(splitk)
    assert BK % unroll == 0 and LR * LC == 32 and TM % 4 == 0 and TN % 4 == 0 and BK % 4 == 0 and BMP % 4 == 0
    assert NT & (NT - 1) == 0 and BM * BK4 % NT == 0 and BK * BN4 % NT == 0
    if warptile:
        assert BM % WM == 0 and BN % WN == 0 and (BM // WM) * WARPS_N * 32 == NT
    else:
        assert TR % LR == 0 and TC % LC == 0
    opts = dict(fastmath=True)
    if minblocks:
        opts["launch_bounds"] = (NT, minblocks)

    @_jit(**opts)
    def kernel(C, A, B, bias, fast_ok):
        M = A.shape[0]  # C may be a (S*M, N) split-K workspace: the product's shape comes from A and B
        N = B.shape[1]
        K = A.shape[1]
        tid = cuda.threadIdx.x & (NT - 1)  # proves tid >= 0 (rung 6)
        warp = tid // 32
        lane = tid % 32
        if warptile:
            mb = (warp // WARPS_N) * WM + (lane // LC) * 4  # first row of this lane's first piece
            nb = (warp % WARPS_N) * WN + (lane % LC) * 4
        else:
            mb = ((warp // WPR) * LR + lane // LC) * 4
            nb = ((warp % WPR) * LC + lane % LC) * 4
        row0 = cuda.blockIdx.y * BM
        col0 = cuda.blockIdx.x * BN
        As = cuda.shared.array((SROWS, BMP), float32, alignment=align)  # As[k, m] = A[m, k]
        Bs = cuda.shared.array((SROWS, BN), float32, alignment=align)
        acc = cuda.local.array((TM, TN), float32)
        rm = cuda.local.array(TM, float32)
        rn = cuda.local.array(TN, float32)
        ra = cuda.local.array(GA4, float32)  # this thread's share of the next A and B tiles
        rb = cuda.local.array(GB4, float32)
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = 0.0
        full = fast_ok != 0 and row0 + BM <= M and col0 + BN <= N  # the whole tile is inside C
        K4 = K // 4
        N4 = N // 4
        ntiles = (K + BK - 1) // BK
        kt0 = 0  # first K tile of this block's slice
        zoff = 0  # first row of this block's partial in C
        if SPLITK:
            per = (ntiles + cuda.gridDim.z - 1) // cuda.gridDim.z
            kt0 = cuda.blockIdx.z * per
            ntiles = max(0, min(ntiles, kt0 + per) - kt0)  # a slice past the end writes zeros
            zoff = cuda.blockIdx.z * M
        for t in range(ntiles + 1):
            k0 = (kt0 + t) * BK
            if t < ntiles:  # issue tile t's global loads into registers
                if full and k0 + BK <= K:
                    for s in range(GA):
                        g = tid + s * NT
                        x0, x1, x2, x3 = load4(A, (row0 + g // BK4) * K4 + k0 // 4 + g % BK4)
                        ra[4 * s] = x0
                        ra[4 * s + 1] = x1
                        ra[4 * s + 2] = x2
                        ra[4 * s + 3] = x3
                    for s in range(GB):
                        g = tid + s * NT
                        y0, y1, y2, y3 = load4(B, (k0 + g // BN4) * N4 + col0 // 4 + g % BN4)
                        rb[4 * s] = y0
                        rb[4 * s + 1] = y1
                        rb[4 * s + 2] = y2
                        rb[4 * s + 3] = y3
                else:  # an edge tile: the same elements, one guarded 4-byte load each
                    for s in range(GA):
                        g = tid + s * NT
                        r = row0 + g // BK4
                        for q in range(4):
                            c = k0 + (g % BK4) * 4 + q
                            ra[4 * s + q] = A[r, c] if r < M and c < K else float32(0.0)
                    for s in range(GB):
                        g = tid + s * NT
                        r = k0 + g // BN4
                        for q in range(4):
                            c = col0 + (g % BN4) * 4 + q
                            rb[4 * s + q] = B[r, c] if r < K and c < N else float32(0.0)
            if t >= 1:  # compute tile t-1 from the buffer written in the previous trip
                kb = ((t - 1) & 1) * BK
                abase = kb * BMP4 + mb // 4  # in 16-byte groups
                bbase = kb * BN4 + nb // 4
                for k0 in range(0, BK, UNROLL):
                    for u in range(UNROLL):  # constant trip count: unrolled, offsets become immediates
                        for p in range(QM):
                            a0, a1, a2, a3 = load4(As, abase + (k0 + u) * BMP4 + p * MSTEP4)
                            rm[4 * p] = a0
                            rm[4 * p + 1] = a1
                            rm[4 * p + 2] = a2
                            rm[4 * p + 3] = a3
                        for p in range(QN):
                            b0, b1, b2, b3 = load4(Bs, bbase + (k0 + u) * BN4 + p * NSTEP4)
                            rn[4 * p] = b0
                            rn[4 * p + 1] = b1
                            rn[4 * p + 2] = b2
                            rn[4 * p + 3] = b3
                        for i in range(TM):  # TM*TN FMAs for (TM+TN)/4 shared loads
                            for j in range(TN):
                                acc[i, j] += rm[i] * rn[j]
            if t < ntiles:  # tile t goes to the buffer nobody is reading
                sb = (t & 1) * BK
                for s in range(GA):
                    g = tid + s * NT
                    for q in range(4):
                        As[sb + (g % BK4) * 4 + q, g // BK4] = ra[4 * s + q]
                for s in range(GB):
                    g = tid + s * NT
                    store4(Bs, (sb + g // BN4) * BN4 + g % BN4, rb[4 * s], rb[4 * s + 1], rb[4 * s + 2],
                           rb[4 * s + 3])
            cuda.syncthreads()
        for p in range(QM):
            for q in range(4):
                r = row0 + mb + p * MSTEP + q
                for pn in range(QN):
                    c = col0 + nb + pn * NSTEP
                    v0 = acc[4 * p + q, 4 * pn]
                    v1 = acc[4 * p + q, 4 * pn + 1]
                    v2 = acc[4 * p + q, 4 * pn + 2]
                    v3 = acc[4 * p + q, 4 * pn + 3]
                    if full:  # 16-byte stores (and, with an epilogue, 16-byte bias loads)
                        if EPI:
                            e0, e1, e2, e3 = load4(bias, c // 4)
                            v0 = epi(v0 + e0)
                            v1 = epi(v1 + e1)
                            v2 = epi(v2 + e2)
                            v3 = epi(v3 + e3)
                        store4(C, (zoff + r) * N4 + c // 4, v0, v1, v2, v3)
                    elif r < M:
                        for qn in range(4):
                            if c + qn < N:
                                v = acc[4 * p + q, 4 * pn + qn]
                                if EPI:
                                    v = epi(v + bias[c + qn])
                                C[zoff + r, c + qn] = v

    def launch(C, A, B, bias=None):
        M, N = C.shape
        K = A.shape[1]
        if bias is None:
            bias = _dummy_bias()
        ok = (K % 4 == 0 and N % 4 == 0 and _addr(A) % 16 == 0 and _addr(B) % 16 == 0
              and _addr(C) % 16 == 0 and (not EPI or _addr(bias) % 16 == 0))
        kernel[(ceil_div(N, BN), ceil_div(M, BM)), NT](C, A, B, bias, 1 if ok else 0)

    launch.kernel = kernel
    launch.config = dict(BM=BM, BN=BN, BK=BK, TM=TM, TN=TN, pad=pad, dbuf=True, threads=NT, warp=(LR, LC),
                         warptile=warptile, minblocks=minblocks, unroll=unroll, vec=True, epilogue=getattr(epilogue, "__name__", None),
                         splitk=SPLITK)
    return launch


@cuda.jit(device=True, inline="always")
def _identity(x):
    return x


_DUMMY: dict = {}


def _dummy_bias():
    """A 4-float device array for the launchers without an epilogue (the kernel never reads it)."""
    if "b" not in _DUMMY:
        _DUMMY["b"] = cuda.to_device(np.zeros(4, np.float32))
    return _DUMMY["b"]


_bt2d = make_blocktile2d(hinted=False)
_hinted = make_blocktile2d(hinted=True)
_cfree = make_warptile(dbuf=False)
_dbuf = make_warptile(dbuf=True)
TUNED = dict(BM=128, BN=256, BK=8, TM=8, TN=16, pad=4, dbuf=True, wr=8, wc=4)  # the sweep winner (gemm_sweep.json)
_tuned = make_warptile(**TUNED)


def _cfg_bytes(launch):
    return tile_bytes(launch.config["BM"], launch.config["BN"])


@register("gemm", "gpu", "blocktile2d", rung=5, ptx=[(_bt2d.kernel, SIG)], bytes=_cfg_bytes(_bt2d))
def gemm_blocktile2d(C, A, B):
    """2D blocktiling: 128x128 block tile, each thread computes an 8x8 register tile.

    2D blocktiling: 128x128 block tiles, 256 threads, each computing an 8x8 register tile. Per k a
    thread loads 8 values of A and 8 of B from shared memory and does 64 FMAs (0.25 loads per FMA, was
    1.125), and intensity doubles again to 32 FLOP/byte. Predicted: ~2x rung 4, if the compiler keeps
    the 64 accumulators in registers (the PTX has no .local traffic: it does)."""
    _bt2d(C, A, B)


@register("gemm", "gpu", "hinted", rung=6, ptx=[(_hinted.kernel, SIG)], bytes=_cfg_bytes(_hinted))
def gemm_hinted(C, A, B):
    """Rung 5 plus two compiler hints: tid >= 0 (via tid & 255) and 16-byte aligned shared arrays.

    Rung 5 plus two hints. ``tid = threadIdx.x & 255`` proves tid >= 0, so Numba's negative-index
    fix-up on every shared-memory index folds away; ``alignment=16`` on the shared arrays lets the
    8 scalar loads become 2 ld.shared.v4. The machine code shows the effect (chapter 5 tabulates it):
    16 LDS per k become 4 LDS.128, and ~30 % fewer registers. Predicted: ~1.5x rung 5 (the inner
    loop is now ~70 % FMAs)."""
    _hinted(C, A, B)


@register("gemm", "gpu", "conflictfree", rung=7, ptx=[(_cfree.kernel, SIG)], bytes=_cfg_bytes(_cfree))
def gemm_conflictfree(C, A, B):
    """No bank conflicts: padded A tile and a warp-aware 4x8 thread layout.

    No bank conflicts: the A tile is padded to 132 columns (transposing stores hit 32 banks, not 4)
    and each warp covers a 4x8 patch of threads whose 4x4 sub-tiles are adjacent, so every 16-byte
    shared load of a warp is one 128-byte wavefront (rung 6's B loads took two). Predicted: 10-30 %
    over rung 6, if shared memory was the limiter."""
    _cfree(C, A, B)


@register("gemm", "gpu", "dbuf", rung=8, ptx=[(_dbuf.kernel, SIG)], bytes=_cfg_bytes(_dbuf))
def gemm_dbuf(C, A, B):
    """Double buffering: the next tile's global loads overlap this tile's FMAs.

    Double buffering: the next tile's 8 global loads per thread go out before this tile's 512 FMAs
    and land in the second shared buffer afterwards, so global latency hides behind arithmetic and
    there is one barrier per tile instead of two. Predicted: 10-20 % over rung 7 at 4096^2."""
    _dbuf(C, A, B)


@register("gemm", "gpu", "tuned", rung=9, ptx=[(_tuned.kernel, SIG)], bytes=_cfg_bytes(_tuned))
def gemm_tuned(C, A, B):
    """Rung 8's kernel with the shape that won a sweep on the GPU at 4096^3: 128x256 tiles, 8x16 per thread.
    (``TUNED``; book/data/bench/gemm_sweep.json has every candidate.) 128 FMAs per k for the same
    index arithmetic as 64, and 42.7 FLOP/byte of tile intensity; but 202 registers allow only one
    block (8 warps) per SM. Predicted: ~5 % over rung 8 at 4096^3, and worse at 1024^3, where 32
    blocks cannot fill 132 SMs."""
    _tuned(C, A, B)


# minblocks=2 (launch bounds: at most 128 registers) keeps two blocks of 256 threads per SM, as rung 8 has.
# Without it the compiler takes 134 (rung 10) and 160 (rung 11) registers and one block fits: the sweep
# (book/data/bench/h100/gemm_sweep_vec.json) measured 13-15 % less at 4096^3.
VEC = dict(BM=128, BN=128, BK=8, TM=8, TN=8, LR=4, LC=8, warptile=False, minblocks=2)  # rung 8's shape and layout
WARPTILE = dict(BM=128, BN=128, BK=16, TM=8, TN=8, LR=8, LC=4, warptile=True, minblocks=2)
_vec = make_vec(**VEC)
_warptile = make_vec(**WARPTILE)


@register("gemm", "gpu", "vec", rung=10, ptx=[(_vec.kernel, SIG_VEC)], bytes=_cfg_bytes(_vec))
def gemm_vec(C, A, B):
    """16-byte global loads: rung 8 with ld.global.v4.f32 for A and B tiles and 16-byte stores of C.

    Rung 8's kernel (same 128x128x8 tiles, same thread layout) with its global traffic in 16-byte
    instructions: one load4 of A and one of B per thread per tile instead of 4 + 4 guarded scalar loads,
    and a block whose tile lies inside C skips every bounds check (edge blocks keep a guarded path).
    Predicted: 5-15 % over rung 8 at 4096^3: the per-tile overhead shrinks, the inner loop does not.
    (Written before the first measurement. That measurement showed the new kernel needed 134 registers,
    which left one block per SM instead of rung 8's two, so the registered rung adds launch bounds,
    ``minblocks=2``, to keep rung 8's occupancy; the chapter shows both.)"""
    _vec(C, A, B)


@register("gemm", "gpu", "warptile", rung=11, ptx=[(_warptile.kernel, SIG_VEC)], bytes=_cfg_bytes(_warptile))
def gemm_warptile(C, A, B):
    """Warptiling: each warp owns a 64x32 tile of C, BK = 16, 16-byte loads from global and shared memory.

    Rung 10 with each warp owning a contiguous 64x32 tile of C (lanes as an 8x4 grid, each lane two by two
    4x4 pieces inside the warp's tile) and 16-deep K tiles, so the per-tile work (global loads, shared
    stores, one barrier) is spread over 1024 FMAs per thread instead of 512. Predicted: >= 75 % of cuBLAS
    at 4096^3 (the issue's goal), from fewer non-FMA instructions per FMA. (Launch bounds as rung 10.)"""
    _warptile(C, A, B)


# ------------------------------------------------------------------------------- rung 12: split-K
# Training's weight gradients dW = X^T G are products with a long K (the B*T token rows) and a small output
# (C x 3C for the QKV matrix): 128 x 128 tiles give a few dozen blocks for 132 SMs, each walking all of K.
# Split-K gives each of S blocks per tile one slice of K, and a second kernel adds the S partial tiles.
SPLITK = dict(WARPTILE, splitk=True)
SPLITK_MAX = 16  # at most 16 slices: the partials cost 2 * S * M * N * 4 bytes of extra traffic
SPLITK_MIN_TILES = 8  # and each slice keeps at least 8 K tiles (128 values of K with BK = 16) of work
SPLITK_TARGET_BLOCKS = 2 * 132  # two resident blocks on each of the H100's 132 SMs (launch bounds, rung 10)
_splitk = make_vec(**SPLITK)
SIG_RED = "void(float32[:, ::1], float32[:, ::1], int64)"


@cuda.jit(fastmath=True)
def splitk_reduce_kernel(C, ws, S):
    """C[m, n] = sum over s of ws[s*M + m, n]: one thread per output, the S loads of a warp coalesced."""
    M, N = C.shape
    i = cuda.grid(1)
    if i < M * N:
        m = i // N
        n = i % N
        acc = float32(0.0)
        for s in range(S):
            acc += ws[s * M + m, n]
        C[m, n] = acc


def splitk_slices(M, N, K, cfg=None):
    """How many K slices the split-K launcher uses for an (M, N, K) product: enough blocks to fill the GPU
    (SPLITK_TARGET_BLOCKS), never a slice shorter than SPLITK_MIN_TILES K tiles, at most SPLITK_MAX."""
    cfg = cfg or _splitk.config
    tiles = ceil_div(M, cfg["BM"]) * ceil_div(N, cfg["BN"])
    ktiles = ceil_div(K, cfg["BK"])
    want = ceil_div(SPLITK_TARGET_BLOCKS, tiles)
    return max(1, min(SPLITK_MAX, want, ktiles // SPLITK_MIN_TILES))


_SPLITK_WS: dict = {}


def gemm_splitk_launch(C, A, B, slices=None):
    """Split-K launcher with an explicit slice count (``slices=None``: :func:`splitk_slices`)."""
    M, N = C.shape
    K = A.shape[1]
    S = int(slices) if slices else splitk_slices(M, N, K)
    if S <= 1:  # one slice: the kernel writes C itself, no second pass
        _splitk(C, A, B)
        return
    key = (S * M, N)
    ws = _SPLITK_WS.get(key)
    if ws is None:  # kept between calls (no allocation in a captured CUDA graph after the first call)
        ws = _SPLITK_WS[key] = cuda.device_array(key, dtype=np.float32)
    ok = (K % 4 == 0 and N % 4 == 0 and _addr(A) % 16 == 0 and _addr(B) % 16 == 0 and _addr(ws) % 16 == 0)
    cfg = _splitk.config
    _splitk.kernel[(ceil_div(N, cfg["BN"]), ceil_div(M, cfg["BM"]), S), cfg["threads"]](ws, A, B, _dummy_bias(),
                                                                                         1 if ok else 0)
    splitk_reduce_kernel[ceil_div(M * N, 256), 256](C, ws, S)


def _splitk_bytes(s, b):
    M, N, K = s
    S = splitk_slices(M, N, K)
    return tile_bytes(128, 128)(s, b) + (2 * S * M * N if S > 1 else 0) * b


@register("gemm", "gpu", "splitk", rung=12, ptx=[(_splitk.kernel, SIG_VEC), (splitk_reduce_kernel, SIG_RED)],
          bytes=_splitk_bytes)
def gemm_splitk(C, A, B):
    """Split-K: rung 11 with K cut into S slices (one block per tile and slice) and a second pass adding them.

    For products with a long K and few output tiles (training's dW = X^T G: K = B*T = 4096 token rows, C x 3C
    = 512 x 1536 outputs, 48 tiles of 128 x 128 for 132 SMs) rung 11 leaves most SMs idle and each block
    walks all of K. With S slices (``splitk_slices``: enough to put two blocks on every SM) the same FLOPs run
    on S times more blocks, for 2*S*M*N*4 extra bytes of partials. Predicted: at 512 x 1536 x 4096 (48 tiles,
    S = 6, 288 blocks) about 132/48 = 2.7x rung 11, the share of SMs rung 11 leaves idle; no gain (a few %
    lost to the second pass) where rung 11 already fills the GPU."""
    gemm_splitk_launch(C, A, B)


# ------------------------------------------------------------------------------- exercise: a dispatch policy
# Chapter 14's exercise: the dispatcher's rule for one product, written by the reader, graded on shapes.
# The numbers are kernels_src.runtime.dispatch.DEFAULTS (tests/test_dispatch.py checks that they agree).
POLICY_GEMV_MAX_M, POLICY_SPLITK_MIN_K, POLICY_SPLITK_MAX_TILES, POLICY_TILE = 1, 1024, 132, 128


def dispatch_policy_reference(shapes):
    """shapes (n, 3) int (M, N, K) -> code (n,) int32: 0 GEMV (M <= 1), 1 split-K (K >= 1024 and fewer than 132
    output tiles of 128 x 128), 2 the warptile GEMM."""
    M, N, K = (shapes[:, i].astype(np.int64) for i in range(3))
    tiles = -(-M // POLICY_TILE) * -(-N // POLICY_TILE)
    code = np.where(M <= POLICY_GEMV_MAX_M, 0, np.where((K >= POLICY_SPLITK_MIN_K) & (tiles < POLICY_SPLITK_MAX_TILES), 1, 2))
    return code.astype(np.int32)


def dispatch_policy_inputs(size, dtype, rng):
    """n shapes around every boundary of the rule: M 1 / 2, K 1023 / 1024, 131 / 132 tiles, and the model's."""
    n = size[0]
    fixed = [(1, 1536, 512), (2, 1536, 512), (512, 1536, 4096), (4096, 1536, 512), (96, 512, 4096),
             (1, 96, 100000), (1408, 1536, 1024), (1409, 1536, 1024), (1536, 1408, 1024), (128, 128, 1023),
             (128, 128, 1024), (129, 129, 1024), (16384, 128, 1024), (16384, 129, 1024), (3, 1, 1)]
    ms = np.array([1, 2, 3, 127, 128, 129, 500, 1408, 1409, 4096])
    ks = np.array([1, 64, 1023, 1024, 1025, 4096, 8192])
    rnd = [(int(rng.choice(ms)), int(rng.choice(ms)), int(rng.choice(ks))) for _ in range(max(0, n - len(fixed)))]
    return (np.array((fixed + rnd)[:n], dtype=np.int64).reshape(n, 3),)


exercise_op("dispatch_policy", reference=dispatch_policy_reference, make_inputs=dispatch_policy_inputs, chapter=14,
            title="dispatch policy: GEMV, split-K or warptile for an (M, N, K) product", size_names=("n",),
            kind="memory", output_names=("code",), tol=(0.0, 0.0), flops=lambda s: 0, bytes=lambda s, b: 0,
            sizes={"check": [(15,), (64,)], "check_sim": [(15,), (64,)], "bench": [(64,)]})
