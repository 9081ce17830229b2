"""Mixture of Experts, part 3: the grouped GEMM over experts, its backward, and the whole MoE layer (chapter 18).
Letters and the padded slot layout are defined in moe_route.py's docstring.

  moe_grouped_gemm      X (T,d), W (E,d,n), sorted_ids (P,), block_expert (P/B,), k -> Y (P,n)
                        Y[r] = X[sorted_ids[r] // k] @ W[block_expert[r // B]]; padding rows and blocks past the
                        padded total are 0. One launch for all experts: each row block reads its expert from
                        block_expert and gathers its tokens' rows of X through sorted_ids while loading its
                        tile (the permutation fused into the load; no permuted copy of X is written). An
                        empty expert has no row blocks, so it costs nothing.
  moe_grouped_gemm_bwd  dY (P,n), X, W, sorted_ids, block_expert, offsets (E+1,), slot_row (S,), k
                        -> dX (T,d) = sum over the token's slots of dY[row] @ W[e]^T,
                           dW (E,d,n) = sum over expert e's rows of X[token]^T dY[row]   (a K-grouped product:
                           the reduction runs over a different number of rows for each expert; 0 if empty)
  (the whole layer, forward and backward, is in moe_layer.py)

Cost: the grouped GEMM does 2*S*d*n useful FLOPs (S = T*k slots; padding rows are computed and wasted: at
most E*(B-1) rows).

Ladder (moe_grouped_gemm)
  cpu/prange      rung 1  prange over row blocks: gather the block's rows, multiply by its expert (ikj loops)
  gpu/smem        rung 1  chapter 5's rung 3 (16x16 shared-memory tiles, a thread per output) with the expert
                          read per block and the A rows gathered through sorted_ids
  gpu/warptile    rung 2  chapter 5's rung 11 tile engine (128x128x16 tiles, a warp per 64x32 tile of Y,
                          16-byte loads, double buffering) with the same two changes: the row block's expert
                          and its gathered rows (each thread looks up the rows it loads once per block)
Ladder (moe_grouped_gemm_bwd): cpu/prange rung 1; gpu/smem rung 1 (dX: the transposed product per row block,
  then a fixed-order sum over each token's k rows; dW: a block per (tile of dW, expert) walking that expert's
  rows in order: deterministic, no atomics).
"""
import numpy as np

from ..compiler import cuda, float32, int64, load4, njit, prange, store4
from .. import device
from ..device import ceil_div
from ..registry import define_op, exercise_op, register
from .moe_align import reference_align
from .moe_route import F2, I1, _buf, make_routing, row_block

SMEM_ALIGN = None if device.SIMULATED else 16


# --------------------------------------------------------------------------------------- reference
def reference_grouped(X, W, sorted_ids, block_expert, k):
    """float64: Y (P, n), row r = X[sorted_ids[r] // k] @ W[expert of r's block], 0 for padding."""
    T = X.shape[0]
    S = T * k
    P = sorted_ids.size
    B = P // block_expert.size
    Y = np.zeros((P, W.shape[2]))
    for e in range(W.shape[0]):
        rows = np.flatnonzero((np.repeat(block_expert, B) == e) & (sorted_ids < S))
        if rows.size:
            Y[rows] = X[sorted_ids[rows] // k] @ W[e]
    return Y


def make_inputs_grouped(size, dtype, rng):
    """Standard normal X and W; a routing (uniform, Zipf-skewed, or all to experts 0..k-1) aligned to the
    row tile B of this machine's kernels (moe_route.row_block)."""
    T, d, n, E, k, skew = size
    ids = make_routing(T, E, k, skew, rng)
    sorted_ids, block_expert, _, _ = reference_align(ids, E, row_block(), 0)
    X = rng.standard_normal((T, d)).astype(np.float32)
    W = rng.standard_normal((E, d, n)).astype(np.float32)
    return X, W, sorted_ids, block_expert, int(k)


def grouped_tol(size, dtype):
    """chapter 5's GEMM error model (gemm.gemm_tol) with K = d: ~sqrt(d) eps of an output of size sqrt(d)."""
    from .gemm import gemm_tol

    return gemm_tol((0, 0, size[1]), dtype)


GG_SIZES = {"check": [(1, 1, 1, 1, 1, 0), (7, 5, 3, 3, 3, 1), (33, 17, 20, 7, 2, 2), (100, 64, 36, 13, 4, 1),
                      (257, 40, 132, 5, 1, 0), (300, 128, 128, 64, 8, 1)],
            "check_sim": [(1, 1, 1, 1, 1, 0), (5, 8, 12, 3, 2, 1), (9, 12, 36, 5, 1, 2)],
            "bench": [(1024, 256, 512, 8, 2, 0)],
            "bench_gpu": [(4096, 1024, 3584, 8, 2, 0), (4096, 1024, 3584, 8, 2, 1), (4096, 1024, 3584, 8, 2, 2),
                          (4096, 1024, 512, 64, 8, 0), (4096, 1024, 512, 64, 8, 1)],
            "bench_sim": [(9, 12, 36, 5, 1, 2)]}

define_op("moe_grouped_gemm", reference=reference_grouped, make_inputs=make_inputs_grouped, chapter=18,
          title="grouped GEMM over experts (gather fused into the load)",
          size_names=("T", "d", "n", "E", "k", "skew"), kind="compute", tol=grouped_tol, output_names=("Y",),
          sizes=GG_SIZES, flops=lambda s: 2 * s[0] * s[4] * s[1] * s[2],
          bytes=lambda s, b: (s[0] * s[1] + s[3] * s[1] * s[2] + s[0] * s[4] * s[2]) * b)


# --------------------------------------------------------------------------------------------- CPU
@njit(parallel=True, cache=True)
def grouped_prange(Y, A, W, sorted_ids, block_expert, k, S, gather):
    # Y (P,n) <- rows of A gathered (gather: A row = slot // k) or direct (row r), times the block's expert
    P, n = Y.shape
    d = A.shape[1]
    B = P // block_expert.size
    for b in prange(block_expert.size):
        e = block_expert[b]
        for r in range(b * B, (b + 1) * B):
            for c in range(n):
                Y[r, c] = 0.0
            s = sorted_ids[r]
            if e < 0 or s >= S:
                continue
            src = s // k if gather else r
            for i in range(d):  # ikj: the inner loop runs along a row of W[e] and of Y (stride 1)
                a = A[src, i]
                for c in range(n):
                    Y[r, c] += a * W[e, i, c]


@register("moe_grouped_gemm", "cpu", "prange", rung=1)
def grouped_cpu(Y, X, W, sorted_ids, block_expert, k):
    """prange over row blocks: each block's rows are gathered from X and multiplied by its expert's W with
    chapter 5's ikj loop order (W[e] walked along its rows). Predict chapter 5's ikj/prange rate: a few
    GFLOP/s per core, far below BLAS (no register blocking)."""
    grouped_prange(Y, X, W, sorted_ids, block_expert, k, X.shape[0] * k, True)


# --------------------------------------------------------------------------------------------- GPU
TILE_GPU, TILE_SIM = 16, 8


def make_smem(TILE, gather, transb=False):
    """Rung 1: TILE x TILE tiles in shared memory, one output per thread. ``gather``: A's row r is
    X[sorted_ids[r] // k] (else A is already in the padded layout, row r). ``transb``: multiply by W[e]^T
    (the backward's dX), so W[e] is (n_out, K)."""

    @cuda.jit
    def grouped_smem_kernel(Y, A, W, sorted_ids, block_expert, k, S, B):
        As = cuda.shared.array((TILE, TILE), float32)
        Bs = cuda.shared.array((TILE, TILE), float32)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        P = Y.shape[0]
        n = Y.shape[1]
        K = A.shape[1]
        r0 = cuda.blockIdx.y * TILE
        c = cuda.blockIdx.x * TILE + tx
        e = block_expert[r0 // B]  # TILE divides B: one expert per tile
        ar = -1  # the row of A this thread loads (tile row ty), -1 for padding
        r = r0 + ty
        if r < P and e >= 0:
            s = sorted_ids[r]
            if s < S:
                ar = s // k if gather else r
        acc = float32(0.0)
        if e >= 0:  # the same for the whole block: the barriers below are reached by all or none
            for k0 in range(0, K, TILE):
                As[ty, tx] = A[ar, k0 + tx] if ar >= 0 and k0 + tx < K else float32(0.0)
                if transb:
                    Bs[ty, tx] = W[e, c, k0 + ty] if k0 + ty < K and c < n else float32(0.0)
                else:
                    Bs[ty, tx] = W[e, k0 + ty, c] if k0 + ty < K and c < n else float32(0.0)
                cuda.syncthreads()
                for kk in range(TILE):
                    acc += As[ty, kk] * Bs[kk, tx]
                cuda.syncthreads()
        if r < P and c < n:
            Y[r, c] = acc

    return grouped_smem_kernel


_smem: dict = {}


def smem_kernel(gather, transb=False):
    T = TILE_SIM if device.SIMULATED else TILE_GPU
    key = (T, gather, transb)
    if key not in _smem:
        _smem[key] = make_smem(T, gather, transb)
    return _smem[key], T


def grouped_smem(Y, A, W, sorted_ids, block_expert, k, S, gather, transb=False):
    P, n = Y.shape
    if P == 0 or n == 0:
        return
    kern, T = smem_kernel(gather, transb)
    B = P // block_expert.size
    kern[(ceil_div(n, T), ceil_div(P, T)), (T, T)](Y, A, W, sorted_ids, block_expert, k, S, B)


F3 = "float32[:, :, ::1]"
SIG_SMEM = f"void({F2}, {F2}, {F3}, {I1}, {I1}, int64, int64, int64)"


@register("moe_grouped_gemm", "gpu", "smem", rung=1,
          ptx=[(make_smem(TILE_GPU, True), SIG_SMEM), (make_smem(TILE_GPU, False), SIG_SMEM),
               (make_smem(TILE_GPU, False, True), SIG_SMEM)])
def grouped_gpu_smem(Y, X, W, sorted_ids, block_expert, k):
    """Chapter 5's rung 3 (16x16 shared tiles, one output per thread), plus a block's expert read from
    block_expert and its A rows gathered through sorted_ids. Chapter 5 measured rung 3 at ~7.9 TFLOP/s;
    the gather adds one index load per thread per block: predict about the same, ~20 % of warptile."""
    grouped_smem(Y, X, W, sorted_ids, block_expert, k, X.shape[0] * k, True)


def make_warptile(BM, BN, BK, TM, TN, LR, LC, pad=4, minblocks=None, unroll=2, gather=True):
    """Rung 2: the tile engine of chapter 5's rung 11 (gemm.make_vec with warptile=True: a warp owns a
    contiguous (TM*LR) x (TN*LC) tile of Y, 16-byte loads from global and shared memory, the next K tile
    loaded into registers while this one is multiplied), with the grouped changes: the block's expert,
    A rows looked up once per block through sorted_ids, zero rows for padding, zero tiles past the total."""
    NT = (BM // TM) * (BN // TN)
    QM, QN = TM // 4, TN // 4
    WM, WN = TM * LR, TN * LC
    WARPS_N = BN // WN
    MSTEP, NSTEP = 4 * LR, 4 * LC
    MSTEP4, NSTEP4 = MSTEP // 4, NSTEP // 4
    UNROLL = unroll
    BK4, BN4 = BK // 4, BN // 4
    GA = BM * BK4 // NT
    GB = BK * BN4 // NT
    GA4, GB4 = 4 * GA, 4 * GB
    BMP = BM + pad
    BMP4 = BMP // 4
    SROWS = 2 * BK
    GATHER = gather
    assert LR * LC == 32 and TM % 4 == 0 and TN % 4 == 0 and BK % 4 == 0 and BMP % 4 == 0 and BK % unroll == 0
    assert BM * BK4 % NT == 0 and BK * BN4 % NT == 0 and BM % WM == 0 and BN % WN == 0
    assert (BM // WM) * WARPS_N * 32 == NT
    opts = dict(fastmath=True)
    if minblocks and not device.SIMULATED:
        opts["launch_bounds"] = (NT, minblocks)

    @cuda.jit(**opts)
    def grouped_warptile_kernel(Y, A, W, sorted_ids, block_expert, k, S, B, fast_ok):
        P = Y.shape[0]
        N = Y.shape[1]
        K = A.shape[1]
        tid = cuda.threadIdx.x & (NT - 1)
        warp = tid // 32
        lane = tid % 32
        mb = (warp // WARPS_N) * WM + (lane // LC) * 4
        nb = (warp % WARPS_N) * WN + (lane % LC) * 4
        row0 = cuda.blockIdx.y * BM
        col0 = cuda.blockIdx.x * BN
        e = block_expert[row0 // B]  # BM divides B: one expert per row block
        As = cuda.shared.array((SROWS, BMP), float32, alignment=SMEM_ALIGN)
        Bs = cuda.shared.array((SROWS, BN), float32, alignment=SMEM_ALIGN)
        acc = cuda.local.array((TM, TN), float32)
        rm = cuda.local.array(TM, float32)
        rn = cuda.local.array(TN, float32)
        ra = cuda.local.array(GA4, float32)
        rb = cuda.local.array(GB4, float32)
        arow = cuda.local.array(GA, int64)
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = 0.0
        for s in range(GA):  # the rows of A this thread loads, looked up once for all K tiles
            g = tid + s * NT
            r = row0 + g // BK4
            src = -1
            if r < P:
                sl = sorted_ids[r]
                if sl < S:
                    src = sl // k if GATHER else r
            arow[s] = src
        full = fast_ok != 0 and col0 + BN <= N
        K4 = K // 4
        N4 = N // 4
        ntiles = (K + BK - 1) // BK if e >= 0 else 0  # past the padded total: a zero tile
        wbase = e * K  # first row of W[e] in the (E*K, N) view of W
        for t in range(ntiles + 1):
            k0 = t * BK
            if t < ntiles:
                if full and k0 + BK <= K:
                    for s in range(GA):
                        g = tid + s * NT
                        src = arow[s]
                        if src >= 0:
                            x0, x1, x2, x3 = load4(A, src * K4 + k0 // 4 + g % BK4)
                        else:
                            x0 = x1 = x2 = x3 = float32(0.0)
                        ra[4 * s] = x0
                        ra[4 * s + 1] = x1
                        ra[4 * s + 2] = x2
                        ra[4 * s + 3] = x3
                    for s in range(GB):
                        g = tid + s * NT
                        y0, y1, y2, y3 = load4(W, (wbase + k0 + g // BN4) * N4 + col0 // 4 + g % BN4)
                        rb[4 * s] = y0
                        rb[4 * s + 1] = y1
                        rb[4 * s + 2] = y2
                        rb[4 * s + 3] = y3
                else:
                    for s in range(GA):
                        g = tid + s * NT
                        src = arow[s]
                        for q in range(4):
                            c = k0 + (g % BK4) * 4 + q
                            ra[4 * s + q] = A[src, c] if src >= 0 and c < K else float32(0.0)
                    for s in range(GB):
                        g = tid + s * NT
                        r = k0 + g // BN4
                        for q in range(4):
                            c = col0 + (g % BN4) * 4 + q
                            rb[4 * s + q] = W[e, r, c] if r < K and c < N else float32(0.0)
            if t >= 1:
                kb = ((t - 1) & 1) * BK
                abase = kb * BMP4 + mb // 4
                bbase = kb * BN4 + nb // 4
                for kk0 in range(0, BK, UNROLL):
                    for u in range(UNROLL):
                        for p in range(QM):
                            a0, a1, a2, a3 = load4(As, abase + (kk0 + u) * BMP4 + p * MSTEP4)
                            rm[4 * p] = a0
                            rm[4 * p + 1] = a1
                            rm[4 * p + 2] = a2
                            rm[4 * p + 3] = a3
                        for p in range(QN):
                            b0, b1, b2, b3 = load4(Bs, bbase + (kk0 + u) * BN4 + p * NSTEP4)
                            rn[4 * p] = b0
                            rn[4 * p + 1] = b1
                            rn[4 * p + 2] = b2
                            rn[4 * p + 3] = b3
                        for i in range(TM):
                            for j in range(TN):
                                acc[i, j] += rm[i] * rn[j]
            if t < ntiles:
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
                    if full and r < P:
                        store4(Y, r * N4 + c // 4, acc[4 * p + q, 4 * pn], acc[4 * p + q, 4 * pn + 1],
                               acc[4 * p + q, 4 * pn + 2], acc[4 * p + q, 4 * pn + 3])
                    elif r < P:
                        for qn in range(4):
                            if c + qn < N:
                                Y[r, c + qn] = acc[4 * p + q, 4 * pn + qn]

    def launch(Y, A, W, sorted_ids, block_expert, k, S):
        P, N = Y.shape
        if P == 0 or N == 0:
            return
        K = A.shape[1]
        B = P // block_expert.size
        if B % BM:
            raise ValueError(f"grouped GEMM: the alignment B = {B} must be a multiple of the row tile {BM}")
        from .gemm import _addr

        ok = K % 4 == 0 and N % 4 == 0 and _addr(A) % 16 == 0 and _addr(W) % 16 == 0 and _addr(Y) % 16 == 0
        grouped_warptile_kernel[(ceil_div(N, BN), P // BM), NT](Y, A, W, sorted_ids, block_expert, k, S, B,
                                                                1 if ok else 0)

    launch.kernel = grouped_warptile_kernel
    launch.BM = BM
    return launch


WARPTILE_GPU = dict(BM=128, BN=128, BK=16, TM=8, TN=8, LR=8, LC=4, minblocks=2)  # chapter 5's rung 11 shape
WARPTILE_SIM = dict(BM=16, BN=32, BK=8, TM=4, TN=4, LR=4, LC=8)  # one warp: the simulator runs 32 threads
_wt: dict = {}


def warptile(gather=True):
    cfg = WARPTILE_SIM if device.SIMULATED else WARPTILE_GPU
    key = (device.SIMULATED, gather)
    if key not in _wt:
        _wt[key] = make_warptile(**cfg, gather=gather)
    return _wt[key]


SIG_WT = f"void({F2}, {F2}, {F3}, {I1}, {I1}, int64, int64, int64, int64)"
BM = WARPTILE_GPU["BM"]


@register("moe_grouped_gemm", "gpu", "warptile", rung=2,
          ptx=[(make_warptile(**WARPTILE_GPU, gather=True).kernel, SIG_WT),
               (make_warptile(**WARPTILE_GPU, gather=False).kernel, SIG_WT)])
def grouped_gpu_warptile(Y, X, W, sorted_ids, block_expert, k):
    """Chapter 5's rung 11 engine (128x128x16 tiles, warp tiles, 16-byte loads, double buffering) with the
    expert read per row block and the A rows gathered through sorted_ids (looked up once per block, then a
    16-byte load from the gathered row each K tile, as fast as a dense row). Predict >= 85 % of the dense
    warptile GEMM at the same FLOPs: what is lost is the padding rows (<= E*127 of S) and, with 64 small
    experts, fewer blocks per wave."""
    warptile(True)(Y, X, W, sorted_ids, block_expert, k, X.shape[0] * k)


# ------------------------------------------------------------------- torch's grouped product (bf16 only)
BF16_U = 2.0 ** -8  # bf16 unit roundoff (7 stored mantissa bits)


def grouped_bf16_tol(size, dtype):
    """The inputs rounded to bf16 (relative error <= u = 2^-8 each, so <= 2u per product, independent from
    product to product): a random walk of ~sqrt(d) u on outputs of size ~sqrt(d); allowed 8 sqrt(d) 2u, plus the
    output's own rounding if torch returns bf16 (rtol u) and chapter 5's fp32 accumulation allowance."""
    import math

    d = size[1]
    rt, at = grouped_tol(size, dtype)
    return (max(rt, 2 * BF16_U), at + 16 * math.sqrt(d) * BF16_U)


def _torch_gpu():
    from .reductions import torch_gpu

    return torch_gpu()


@register("moe_grouped_gemm", "gpu", "torch_grouped_bf16", baseline=True, requires=_torch_gpu,
          tol=grouped_bf16_tol)
def grouped_torch_bf16(Y, X, W, sorted_ids, block_expert, k):
    """torch's own grouped product, ``torch._grouped_mm`` (bf16 in, fp32 out; bf16 is the only input precision
    it takes): the rows of X gathered through sorted_ids into the padded expert order, one call over all
    experts with the padded group ends as ``offs``. Timed as a bf16 model would call it: the casts of X and W
    to bf16 are inside the call (X's cast and gather: T*d + P*d elements; W's cast: E*d*n, about a tenth of the
    product's time at E 8). Shapes whose rows are not 16-byte aligned (d or n not a multiple of 8) fall back to
    one bf16 product per expert (check sizes only). Predict: tensor cores at ~half of cuBLAS's bf16 rate,
    several times the course's fp32 (CUDA-core) warptile at the same FLOPs; a different precision, so not a
    like-for-like speed-up."""
    import torch

    from .reductions import torch_view

    tX, tW, tY = torch_view(X), torch_view(W), torch_view(Y)
    si = torch_view(sorted_ids).long()
    be = torch_view(block_expert).long()
    T, d = tX.shape
    E, _, n = tW.shape
    P = si.numel()
    B = P // be.numel()
    S = T * k
    valid = si < S
    A = tX.to(torch.bfloat16)[torch.where(valid, si // k, 0)]  # (P, d), expert-contiguous, padded rows read row 0
    Wb = tW.to(torch.bfloat16)
    counts = torch.bincount(be[be >= 0], minlength=E)[:E] * B
    ends = torch.cumsum(counts, 0)
    if d % 8 == 0 and n % 8 == 0:
        try:
            out = torch._grouped_mm(A, Wb, offs=ends.to(torch.int32), out_dtype=torch.float32)
        except (TypeError, RuntimeError) as err:  # a torch whose grouped product returns bf16 only
            if "out_dtype" not in str(err) and "dtype" not in str(err):
                raise
            out = torch._grouped_mm(A, Wb, offs=ends.to(torch.int32)).float()
    else:
        out = torch.zeros((P, n), dtype=torch.float32, device=tX.device)
        starts = (ends - counts).tolist()
        for e, (s0, s1) in enumerate(zip(starts, ends.tolist())):
            if s1 > s0:
                out[s0:s1] = A[s0:s1].float() @ Wb[e].float()  # bf16 values, exact in fp32 products
    rows = torch.arange(P, device=tX.device)
    keep = valid & (rows < ends[-1])
    tY.copy_(torch.where(keep[:, None], out, torch.zeros((), device=tX.device)))


# ------------------------------------------------------------------------------------------ backward
def reference_grouped_bwd(dY, X, W, sorted_ids, block_expert, offsets, slot_row, k):
    """dX[t] = sum over the kept slots of t of dY[row] @ W[e]^T; dW[e] = sum over e's rows of X[t]^T dY[row]."""
    T = X.shape[0]
    S = T * k
    P = sorted_ids.size
    B = P // block_expert.size
    dX = np.zeros(X.shape)
    dW = np.zeros(W.shape)
    be = np.repeat(block_expert, B)
    for e in range(W.shape[0]):
        rows = np.flatnonzero((be == e) & (sorted_ids < S))
        if rows.size:
            toks = sorted_ids[rows] // k
            np.add.at(dX, toks, dY[rows] @ W[e].T)
            dW[e] = X[toks].T @ dY[rows]
    return dX, dW


def make_inputs_grouped_bwd(size, dtype, rng):
    T, d, n, E, k, skew = size
    ids = make_routing(T, E, k, skew, rng)
    sorted_ids, block_expert, offsets, slot_row = reference_align(ids, E, row_block(), 0)
    X = rng.standard_normal((T, d)).astype(np.float32)
    W = rng.standard_normal((E, d, n)).astype(np.float32)
    dY = rng.standard_normal((sorted_ids.size, n)).astype(np.float32)
    return dY, X, W, sorted_ids, block_expert, offsets, slot_row, int(k)


def grouped_bwd_tol(size, dtype):
    """The GEMM error model with K the longest reduction: n*k terms for dX, up to T*k rows for dW."""
    from .gemm import gemm_tol

    T, d, n, E, k, _ = size
    return gemm_tol((0, 0, max(n * k, T * k)), dtype)


GGB_SIZES = {"check": [(1, 1, 1, 1, 1, 0), (7, 5, 3, 3, 3, 1), (33, 17, 20, 7, 2, 2), (100, 36, 64, 13, 4, 1),
                       (257, 40, 33, 5, 1, 0)],
             "check_sim": [(1, 1, 1, 1, 1, 0), (5, 8, 12, 3, 2, 1), (9, 12, 10, 5, 1, 2)],
             "bench": [(1024, 256, 512, 8, 2, 0)],
             "bench_gpu": [(4096, 1024, 3584, 8, 2, 0), (4096, 1024, 512, 64, 8, 1)],
             "bench_sim": [(9, 12, 10, 5, 1, 2)]}

define_op("moe_grouped_gemm_bwd", reference=reference_grouped_bwd, make_inputs=make_inputs_grouped_bwd,
          chapter=18, title="grouped GEMM backward: dX and the per-expert dW (K-grouped)",
          size_names=("T", "d", "n", "E", "k", "skew"), kind="compute", tol=grouped_bwd_tol,
          output_names=("dX", "dW"), sizes=GGB_SIZES, flops=lambda s: 4 * s[0] * s[4] * s[1] * s[2],
          bytes=lambda s, b: (2 * s[0] * s[1] + 2 * s[3] * s[1] * s[2] + s[0] * s[4] * s[2]) * b)


@njit(parallel=True, cache=True)
def grouped_bwd_prange(dX, dW, dY, X, W, sorted_ids, offsets, slot_row, k):
    T, d = X.shape
    E, _, n = W.shape
    S = T * k
    for t in prange(T):  # dX: each token sums its k slots in order j = 0..k-1
        for i in range(d):
            dX[t, i] = 0.0
        for j in range(k):
            r = slot_row[t * k + j]
            if r < 0:
                continue
            e = 0
            while offsets[e + 1] <= r:  # the expert whose padded run holds row r
                e += 1
            for i in range(d):
                acc = 0.0
                for c in range(n):
                    acc += dY[r, c] * W[e, i, c]
                dX[t, i] += acc
    for e in prange(E):  # dW: expert e's rows, in order (a K-grouped product)
        for i in range(d):
            for c in range(n):
                dW[e, i, c] = 0.0
        for r in range(offsets[e], offsets[e + 1]):
            s = sorted_ids[r]
            if s >= S:
                continue
            t = s // k
            for i in range(d):
                a = X[t, i]
                for c in range(n):
                    dW[e, i, c] += a * dY[r, c]


@register("moe_grouped_gemm_bwd", "cpu", "prange", rung=1)
def grouped_bwd_cpu(dX, dW, dY, X, W, sorted_ids, block_expert, offsets, slot_row, k):
    """prange over tokens for dX (k rows each, in order) and over experts for dW (each expert's rows in
    order: the K-grouped product). With E = 8 experts the dW loop keeps at most 8 cores busy; predict a few
    GFLOP/s per core, like chapter 5's unblocked loops."""
    grouped_bwd_prange(dX, dW, dY, X, W, sorted_ids, offsets, slot_row, k)


def make_dw_kernel(TILE, gather=True):
    @cuda.jit
    def grouped_dw_kernel(dW, dY, X, sorted_ids, offsets, k, S):
        # grid (n/TILE, d/TILE, E): dW[e, i, c] = sum over expert e's rows r of A[r, i] * dY[r, c], where
        # A[r] = X[token(r)] (gather) or X[r] (X already in the padded layout)
        As = cuda.shared.array((TILE, TILE), float32)
        Bs = cuda.shared.array((TILE, TILE), float32)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        e = cuda.blockIdx.z
        i0 = cuda.blockIdx.y * TILE
        c = cuda.blockIdx.x * TILE + tx
        d = X.shape[1]
        n = dY.shape[1]
        acc = float32(0.0)
        for r0 in range(offsets[e], offsets[e + 1], TILE):  # empty expert: no trips, dW[e] = 0
            r = r0 + ty
            s = sorted_ids[r] if r < offsets[e + 1] else S
            src = s // k if gather else r
            As[ty, tx] = X[src, i0 + tx] if s < S and i0 + tx < d else float32(0.0)
            Bs[ty, tx] = dY[r, c] if s < S and c < n else float32(0.0)
            cuda.syncthreads()
            for kk in range(TILE):
                acc += As[kk, ty] * Bs[kk, tx]
            cuda.syncthreads()
        if i0 + ty < d and c < n:
            dW[e, i0 + ty, c] = acc

    return grouped_dw_kernel


@cuda.jit
def sum_slots_kernel(dX, dXp, slot_row):
    # dX[t, c] = sum over j (in order) of dXp[slot_row[t*k+j], c]; grid x over tokens, y over columns
    c = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    t = cuda.blockIdx.x
    k = slot_row.size // dX.shape[0]
    if c < dX.shape[1]:
        acc = float32(0.0)
        for j in range(k):
            r = slot_row[t * k + j]
            if r >= 0:
                acc += dXp[r, c]
        dX[t, c] = acc


_dw: dict = {}


def dw_kernel(gather=True):
    T = TILE_SIM if device.SIMULATED else TILE_GPU
    if (T, gather) not in _dw:
        _dw[(T, gather)] = make_dw_kernel(T, gather)
    return _dw[(T, gather)], T


def grouped_bwd_gpu(dX, dW, dY, X, W, sorted_ids, block_expert, offsets, slot_row, k):
    T, d = X.shape
    E, _, n = W.shape
    S = T * k
    P = sorted_ids.size
    if P and d:
        dXp = _buf("gg_dxp", P * d, np.float32).reshape(P, d)
        grouped_smem(dXp, dY, W, sorted_ids, block_expert, k, S, False, transb=True)  # dY[r] @ W[e]^T
        t = 32 if device.SIMULATED else 256
        sum_slots_kernel[(T, ceil_div(d, t)), t](dX, dXp, slot_row)
    if E and d and n:
        kern, TL = dw_kernel()
        kern[(ceil_div(n, TL), ceil_div(d, TL), E), (TL, TL)](dW, dY, X, sorted_ids, offsets, k, S)


@register("moe_grouped_gemm_bwd", "gpu", "smem", rung=1,
          ptx=[(make_smem(TILE_GPU, False, True), SIG_SMEM),
               (sum_slots_kernel, f"void({F2}, {F2}, {I1})"),
               (make_dw_kernel(TILE_GPU), f"void({F3}, {F2}, {F2}, {I1}, {I1}, int64, int64)")])
def grouped_bwd_gpu_smem(dX, dW, dY, X, W, sorted_ids, block_expert, offsets, slot_row, k):
    """dX: rung 1's shared-memory kernel on W[e]^T per row block, then a fixed-order sum over each token's k
    rows (no atomics). dW: a block per 16x16 tile of dW[e] walking expert e's rows in order (K-grouped; an
    empty expert's blocks write zeros and stop). Rung-3-class kernels: predict ~15-20 % of the dense
    warptile GEMM; a warptile dW would need the K loop over gathered rows (the exercise of this rung)."""
    grouped_bwd_gpu(dX, dW, dY, X, W, sorted_ids, block_expert, offsets, slot_row, k)


# ------------------------------------------------------------------ chapter 18's predict-then-measure exercise
def reference_gemm_time(counts, B, d, n, gflops):
    """Predicted microseconds of a grouped GEMM at ``gflops`` GFLOP/s: us[0] counts the S useful rows only
    (a kernel that skips padding, like the CPU rung), us[1] every padded row (each expert's count rounded
    up to B, what a GPU kernel of B-row blocks computes)."""
    rows = counts.sum()
    padded = (-(-counts // B) * B).sum()
    return np.array([2.0 * rows * d * n, 2.0 * padded * d * n]) / (gflops * 1e3)


def make_inputs_gemm_time(size, dtype, rng):
    E, skew = size
    T = int(rng.integers(1, 5000))
    ids = make_routing(T, E, 1, skew, rng)
    counts = np.bincount(ids.reshape(-1), minlength=E).astype(np.int32)
    return (counts, int(rng.choice([16, 64, 128])), int(rng.integers(64, 4097)), int(rng.integers(64, 4097)),
            float(rng.uniform(1.0, 50000.0)))


exercise_op("moe_gemm_time_prediction", reference=reference_gemm_time, make_inputs=make_inputs_gemm_time,
            chapter=18, title="a grouped GEMM's time from the rows it computes", size_names=("E", "skew"),
            kind="compute", output_names=("us",), tol=(1e-6, 0.0), flops=lambda s: 0, bytes=lambda s, b: 0,
            sizes={"check": [(1, 0), (8, 0), (64, 1), (7, 2)], "check_sim": [(8, 0)], "bench": [(8, 0)]})
