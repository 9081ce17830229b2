"""gemm_tf32, gemm_f16, gemm_bf16: the GEMM on tensor cores (chapter 20).

Shapes (sizes written (M, N, K), as chapter 5's ``gemm``):

    gemm_tf32   C (M,N) f32 = A (M,K) f32 @ B (K,N) f32       the products in TF32 (10-bit mantissas)
    gemm_f16    Y (M,N) f32 = X (M,K) f16 @ W (N,K)^T f16     "NT", the layout of a linear layer's weight
    gemm_bf16   Y (M,N) f32 = X (M,K) bf16 @ W (N,K)^T bf16   bf16 stored as uint16 bit patterns (NumPy has no
                                                               bfloat16); the top half of a float32

Every product is summed in float32. Cost: 2*M*N*K FLOPs; bytes: 4 (TF32) or 2 (FP16/BF16) per input element,
4 per output. At 4096^3 that is 137 GFLOP on 200 MB (TF32): ~680 FLOP per byte, deep in the compute-bound
regime, which is where the tensor cores matter: the H100 SXM's dense peaks are ~67 TFLOP/s in FP32 on the CUDA
cores and ~495 (TF32) and ~990 (FP16/BF16) on the tensor cores (NVIDIA's H100 datasheet).

How the kernels reach the tensor cores: ``mma.sync`` through inline PTX (``kernels_src.compiler.inline_ptx``,
whose docstring draws each thread's fragment). A warp multiplies a 16 x 8 x K8 (TF32) or 16 x 8 x 16
(FP16/BF16) piece per instruction. In 32-bit *words*, both shapes read the same fragments: a TF32 word is one
value, an FP16/BF16 word is two values adjacent in k. So one kernel body serves all three formats, working on
tiles BKW words deep (16 words = 16 TF32 or 32 half values).

Ladder (each rung changes one thing)
  cpu/numpy_tf32   baseline  NumPy with A and B rounded to TF32 first: the format's error, without a GPU
  cpu/numpy        baseline  NumPy float32 on the decoded FP16/BF16 values (gemm_f16, gemm_bf16)
  gpu/cublas       baseline  cuBLAS through torch in the same precision (TF32 on for gemm_tf32, and off again)
  gpu/mma_warp     rung 1    one warp per 16 x 8 tile of C, fragments loaded straight from global memory
  gpu/mma_smem     rung 2    128 x 128 block tiles staged in shared memory (padded rows: no bank conflicts on
                             fragment reads), 8 warps of 64 x 32, 16 mma per warp per k-step
  gpu/mma_dbuf     rung 3    rung 2 double-buffered (the next tile's global loads in flight during the mma's)
                             with 16-byte global loads and shared stores
  gpu/mma_wide     rung 4    rung 3 without the integer work in its hot loop: flat shared arrays at per-thread
                             base + constant, fragments read 16 bytes at a time (k reordered inside a tile),
                             64 x 64 warp tiles (4 warps, 2 blocks per SM), an unguarded loop for inner blocks
  gpu/mma_wide256  rung 5    rung 4 with 128 x 256 block tiles (8 warps, one block per SM)
  gpu/mma_occ      rung 6    rung 4 with 64 x 32 warp tiles (8 warps, <= 128 registers, 16 warps per SM)

Rounding: A and B are rounded to TF32 (``to_tf32``, nearest, ties away) once, when they are stored to shared
memory; FP16/BF16 inputs are already in their format. Tolerances: :func:`tc_tol`.
"""
from __future__ import annotations

import functools

import numpy as np

from .. import device
from ..compiler import cuda, float32, load4, mma_bf16, mma_f16, mma_tf32, store4, to_tf32, uint16, uint32
from ..device import ceil_div
from ..registry import define_op, register
from .gemm import SMEM_ALIGN, _jit, _torch_gpu
from .gemm import make_inputs as _gemm_inputs

KINDS = ("tf32", "f16", "bf16")
OPS = {"tf32": "gemm_tf32", "f16": "gemm_f16", "bf16": "gemm_bf16"}
# Unit roundoff of each input format (half the spacing of numbers in [1, 2)): 10, 10 and 7 stored mantissa bits.
UNIT_ROUNDOFF = {"tf32": 2.0 ** -11, "f16": 2.0 ** -11, "bf16": 2.0 ** -8}


# ------------------------------------------------------------------------------------------ the formats (host)
def tf32_round(a):
    """float32 array -> the same values rounded to TF32 (nearest, ties away from zero: ``cvt.rna.tf32.f32``);
    inf and NaN unchanged."""
    b = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    special = (b >> 23) & 0xFF == 0xFF
    r = np.where(special, b, (b + 0x1000) & 0xFFFFE000).astype(np.uint32)
    return r.view(np.float32).reshape(np.shape(a))


def bf16_bits(a):
    """float32 array -> bf16 bit patterns (uint16), rounded to nearest, ties to even; NaN stays NaN."""
    b = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    nan = np.isnan(np.asarray(a, np.float32))
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF
    r = np.where(nan, (b >> 16) | 0x40, r)
    return r.astype(np.uint16).reshape(np.shape(a))


def bf16_values(bits):
    """bf16 bit patterns (uint16) -> float32 values (exact: bf16 is the top half of a float32)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def decode(x):
    """An input of these ops as float64: fp16 and float32 directly, uint16 as bf16 bits."""
    x = np.asarray(x)
    return bf16_values(x).astype(np.float64) if x.dtype == np.uint16 else x.astype(np.float64)


# ----------------------------------------------------------------------------------------- references, inputs
def reference_nn(A, B):
    """float64 oracle of gemm_tf32: C = A @ B (on the inputs as given; the TF32 rounding is the kernel's error)."""
    return decode(A) @ decode(B)


def reference_nt(X, W):
    """float64 oracle of gemm_f16 / gemm_bf16: Y = X W^T, on the decoded half-precision values."""
    return decode(X) @ decode(W).T


def _half_inputs(fmt):
    def make_inputs(size, dtype, rng):
        M, N, K = size
        X = rng.standard_normal((M, K)).astype(np.float32)
        W = rng.standard_normal((N, K)).astype(np.float32)
        if fmt == "f16":
            return X.astype(np.float16), W.astype(np.float16)
        return bf16_bits(X), bf16_bits(W)
    return make_inputs


def _edge_inputs(fmt):
    """Zeros, +-inf, NaN and the format's largest values in the first row of X and column of W: a product
    with inf gives +-inf (or NaN with a zero), NaN spreads along its row and column, as the reference says."""
    make = _half_inputs(fmt) if fmt != "tf32" else (lambda s, d, r: _gemm_inputs(s, np.float32, r))

    def make_edge_inputs(size, dtype, rng):
        A, B = make(size, dtype, rng)
        A, B = A.copy(), B.copy()
        M, N, K = size
        big = {"tf32": 1e30, "f16": 65504.0, "bf16": 1e30}[fmt]  # held by the format; products stay finite
        vals = np.array([0.0, np.inf, -np.inf, np.nan, big, -big], np.float32)
        enc = (lambda v: bf16_bits(v)) if fmt == "bf16" else (lambda v: v.astype(A.dtype))
        A[0, : min(K, len(vals))] = enc(vals[: min(K, len(vals))])
        if fmt == "tf32":
            B[: min(K, len(vals)), 0] = enc(vals[::-1][: min(K, len(vals))])
        else:
            B[0, : min(K, len(vals))] = enc(vals[::-1][: min(K, len(vals))])
        return A, B
    return make_edge_inputs


def tc_tol(fmt):
    """(rtol, atol) for a tensor-core GEMM of standard-normal inputs, from the formats.

    - Input rounding (TF32 only: FP16/BF16 inputs are given in their format, so exact): each product a*b has a
      relative error of at most 2u (u = 2^-11, ties away), independent from product to product; over K products
      of size ~1 the error is a random walk of typical size sqrt(K) * u. Allowed: 8 sqrt(K) u (8 sigma; a
      tensor core that truncated instead of rounding would still pass at ~5 sigma).
    - Accumulation in float32: K additions to partial sums of size ~sqrt(K) (as chapter 5's ``gemm_tol``); the
      ISA does not fix the order or the internal rounding of the tensor core's sums, so 16 K eps32, 4x the
      CUDA-core GEMM's allowance.
    A kernel that drops one 8-deep k-slice is off by ~sqrt(8) ~ 2.8, far outside (at K = 4096, atol ~ 0.26).
    """
    u = UNIT_ROUNDOFF[fmt] if fmt == "tf32" else 0.0
    eps = float(np.finfo(np.float32).eps)

    def tol(size, dtype):
        K = size[2]
        return 1e-5, 8.0 * np.sqrt(K) * u + 16.0 * K * eps + 1e-6
    return tol


SIZES = {
    # 1, primes, sizes that are not multiples of 8, 16, 128 (the mma and block tiles), and several block tiles
    "check": [(1, 1, 1), (7, 5, 3), (1, 33, 17), (33, 17, 9), (16, 8, 16), (129, 131, 17), (257, 383, 129),
              (517, 389, 263)],
    "check_sim": [(1, 1, 1), (7, 5, 3), (17, 9, 19)],
    "bench": [(256, 256, 256)],
    "bench_gpu": [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096)],
    "bench_sim": [(17, 9, 19)],
}


def _define(fmt):
    nn = fmt == "tf32"
    item = 4 if nn else 2
    define_op(
        OPS[fmt], chapter=20, kind="compute", size_names=("M", "N", "K"), sizes=SIZES, tol=tc_tol(fmt),
        reference=reference_nn if nn else reference_nt,
        make_inputs=(lambda s, d, r: _gemm_inputs(s, np.float32, r)) if nn else _half_inputs(fmt),
        title={"tf32": "GEMM on tensor cores, TF32: C = A @ B",
               "f16": "GEMM on tensor cores, FP16 in, FP32 out: Y = X @ W^T",
               "bf16": "GEMM on tensor cores, BF16 in, FP32 out: Y = X @ W^T"}[fmt],
        output_names=("C",) if nn else ("Y",), edge_inputs=_edge_inputs(fmt),
        flops=lambda s: 2 * s[0] * s[1] * s[2],
        bytes=lambda s, b, item=item: (s[0] * s[2] + s[2] * s[1]) * item + s[0] * s[1] * 4,
    )


for _f in KINDS:
    _define(_f)


# ================================================================================================ CPU baselines
@register("gemm_tf32", "cpu", "numpy_tf32", baseline=True)
def gemm_tf32_numpy(C, A, B):
    """NumPy float32 matmul of A and B rounded to TF32: the format's error, on any machine."""
    np.matmul(tf32_round(A), tf32_round(B), out=C)


def _numpy_half(Y, X, W):
    """NumPy float32 matmul of the decoded values (exact: every FP16/BF16 value is a float32)."""
    np.matmul(decode(X).astype(np.float32), decode(W).astype(np.float32).T, out=Y)


register("gemm_f16", "cpu", "numpy", baseline=True)(_numpy_half)
register("gemm_bf16", "cpu", "numpy", baseline=True)(_numpy_half)


# ================================================================================================ GPU kernels
WARP_TILE_WARPS = 4  # rung 1: warps per block, each its own 16 x 8 tile of C


@functools.cache
def make_warp_kernel(fmt):
    """Rung 1: a warp computes one 16 x 8 tile of C, loading its fragments straight from global memory (with a
    bounds guard per element: outside the matrix a fragment holds zero). Every lane reaches every mma."""
    TF32 = fmt == "tf32"
    mma = {"tf32": mma_tf32, "f16": mma_f16, "bf16": mma_bf16}[fmt]
    NW = WARP_TILE_WARPS

    @_jit(fastmath=True)
    def kernel(C, A, B):
        # TF32: A (M,K), B (K,N) floats. FP16/BF16: A (M,KW), B = W (N,KW) words of two values.
        M = A.shape[0]
        KW = A.shape[1]
        N = B.shape[1] if TF32 else B.shape[0]
        lane = cuda.threadIdx.x % 32
        warp = cuda.threadIdx.x // 32
        g = lane >> 2
        t4 = lane & 3
        r0 = cuda.blockIdx.y * 16
        n0 = (cuda.blockIdx.x * NW + warp) * 8
        c0 = float32(0.0)
        c1 = float32(0.0)
        c2 = float32(0.0)
        c3 = float32(0.0)
        ra = r0 + g
        rb = r0 + g + 8
        n = n0 + g
        for k in range(0, KW, 8):
            ka = k + t4
            kb = k + t4 + 4
            if TF32:
                a0 = to_tf32(A[ra, ka]) if ra < M and ka < KW else float32(0.0)
                a1 = to_tf32(A[rb, ka]) if rb < M and ka < KW else float32(0.0)
                a2 = to_tf32(A[ra, kb]) if ra < M and kb < KW else float32(0.0)
                a3 = to_tf32(A[rb, kb]) if rb < M and kb < KW else float32(0.0)
                b0 = to_tf32(B[ka, n]) if ka < KW and n < N else float32(0.0)
                b1 = to_tf32(B[kb, n]) if kb < KW and n < N else float32(0.0)
            else:
                a0 = A[ra, ka] if ra < M and ka < KW else uint32(0)
                a1 = A[rb, ka] if rb < M and ka < KW else uint32(0)
                a2 = A[ra, kb] if ra < M and kb < KW else uint32(0)
                a3 = A[rb, kb] if rb < M and kb < KW else uint32(0)
                b0 = B[n, ka] if ka < KW and n < N else uint32(0)
                b1 = B[n, kb] if kb < KW and n < N else uint32(0)
            c0, c1, c2, c3 = mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)
        col = n0 + 2 * t4
        if ra < M:
            if col < N:
                C[ra, col] = c0
            if col + 1 < N:
                C[ra, col + 1] = c1
        if rb < M:
            if col < N:
                C[rb, col] = c2
            if col + 1 < N:
                C[rb, col + 1] = c3

    return kernel


@functools.cache
def make_tile_kernel(fmt, BM=128, BN=128, WM=64, WN=32, BKW=16, dbuf=True):
    """Rungs 2 and 3: a block computes a BM x BN tile of C with (BM/WM) x (BN/WN) warps, each a WM x WN tile made
    of (WM/16) x (WN/8) mma tiles, from BKW-word-deep tiles of A and B staged in shared memory.

    Shared layouts (words; each padded so that a warp's fragment reads hit 32 different banks):
      As[buf, m, k]  rows of BKW + 4 words: lane (g, t) reads word 20 g + t (mod 32): all different.
      TF32: Bs[buf, k, n], rows of BN + 8 words: lane (g, t) reads 136 t + g = 8 t + g (mod 32).
      FP16/BF16: Bs[buf, n, k] (W's own layout), rows of BKW + 4 words, as As.
    ``dbuf``: two buffers; the next tile's global loads are issued before this tile's mma's and stored after
    them, one barrier per tile. A block whose tile lies inside C, with rows a multiple of 16 bytes
    (``fast_ok``), loads 16 bytes per instruction; edge blocks take a guarded 4-byte path.
    """
    TF32 = fmt == "tf32"
    mma = {"tf32": mma_tf32, "f16": mma_f16, "bf16": mma_bf16}[fmt]
    WT = float32 if TF32 else uint32
    WARPS_N = BN // WN
    NW = (BM // WM) * WARPS_N
    NT = 32 * NW
    MT, NTL = WM // 16, WN // 8
    ACC = MT * NTL * 4
    LDA = BKW + 4
    LDB = BN + 8 if TF32 else BKW + 4
    BKW4, BN4 = BKW // 4, BN // 4
    GA = BM * BKW4 // NT  # 16-byte groups per thread per tile, of A and of B
    GB = BN * BKW4 // NT
    GA4, GB4 = 4 * GA, 4 * GB
    NBUF = 2 if dbuf else 1
    DBUF = bool(dbuf)
    KSTEPS = BKW // 8
    MT4, NTL2 = 4 * MT, 2 * NTL
    BSHAPE = (NBUF, BKW, LDB) if TF32 else (NBUF, BN, LDB)
    assert NT & (NT - 1) == 0 and BM * BKW4 % NT == 0 and BN * BKW4 % NT == 0 and BKW % 8 == 0
    assert BM % WM == 0 and BN % WN == 0 and WM % 16 == 0 and WN % 8 == 0
    align = SMEM_ALIGN

    @cuda.jit(device=True, inline=True)
    def load_tile(ra, rb, A, B, row0, col0, k0, M, N, KW, fast, tid):
        """This thread's share of the A and B tiles starting at word k0, into registers (zeros outside)."""
        if fast and k0 + BKW <= KW:
            KW4 = KW // 4
            for s in range(GA):
                q = tid + s * NT
                x0, x1, x2, x3 = load4(A, (row0 + q // BKW4) * KW4 + k0 // 4 + q % BKW4)
                ra[4 * s] = x0
                ra[4 * s + 1] = x1
                ra[4 * s + 2] = x2
                ra[4 * s + 3] = x3
            for s in range(GB):
                q = tid + s * NT
                if TF32:  # B (K,N): 4 consecutive n of one k row
                    y0, y1, y2, y3 = load4(B, (k0 + q // BN4) * (N // 4) + col0 // 4 + q % BN4)
                else:  # W (N,KW): 4 consecutive words of one n row
                    y0, y1, y2, y3 = load4(B, (col0 + q // BKW4) * KW4 + k0 // 4 + q % BKW4)
                rb[4 * s] = y0
                rb[4 * s + 1] = y1
                rb[4 * s + 2] = y2
                rb[4 * s + 3] = y3
        else:
            for s in range(GA):
                q = tid + s * NT
                r = row0 + q // BKW4
                for e in range(4):
                    c = k0 + (q % BKW4) * 4 + e
                    ra[4 * s + e] = A[r, c] if r < M and c < KW else WT(0)
            for s in range(GB):
                q = tid + s * NT
                for e in range(4):
                    if TF32:
                        r = k0 + q // BN4
                        c = col0 + (q % BN4) * 4 + e
                        rb[4 * s + e] = B[r, c] if r < KW and c < N else WT(0)
                    else:
                        r = col0 + q // BKW4
                        c = k0 + (q % BKW4) * 4 + e
                        rb[4 * s + e] = B[r, c] if r < N and c < KW else WT(0)

    @cuda.jit(device=True, inline=True)
    def store_tile(As, Bs, ra, rb, buf, tid):
        """Registers -> shared buffer ``buf`` (16-byte stores; TF32 values rounded here, once per element)."""
        for s in range(GA):
            q = tid + s * NT
            r = q // BKW4
            c4 = q % BKW4
            if TF32:
                store4(As, ((buf * BM + r) * LDA) // 4 + c4, to_tf32(ra[4 * s]), to_tf32(ra[4 * s + 1]),
                       to_tf32(ra[4 * s + 2]), to_tf32(ra[4 * s + 3]))
            else:
                store4(As, ((buf * BM + r) * LDA) // 4 + c4, ra[4 * s], ra[4 * s + 1], ra[4 * s + 2], ra[4 * s + 3])
        for s in range(GB):
            q = tid + s * NT
            if TF32:
                store4(Bs, ((buf * BKW + q // BN4) * LDB) // 4 + q % BN4, to_tf32(rb[4 * s]),
                       to_tf32(rb[4 * s + 1]), to_tf32(rb[4 * s + 2]), to_tf32(rb[4 * s + 3]))
            else:
                store4(Bs, ((buf * BN + q // BKW4) * LDB) // 4 + q % BKW4, rb[4 * s], rb[4 * s + 1], rb[4 * s + 2],
                       rb[4 * s + 3])

    @cuda.jit(device=True, inline=True)
    def compute_tile(acc, af, bf, As, Bs, buf, wm, wn, g, t4):
        """The warp's (WM/16) x (WN/8) mma tiles over one shared tile: KSTEPS k-steps of 8 words."""
        for ks in range(KSTEPS):
            kk = ks * 8
            for i in range(MT):
                r = wm + i * 16 + g
                af[4 * i] = As[buf, r, kk + t4]
                af[4 * i + 1] = As[buf, r + 8, kk + t4]
                af[4 * i + 2] = As[buf, r, kk + t4 + 4]
                af[4 * i + 3] = As[buf, r + 8, kk + t4 + 4]
            for j in range(NTL):
                n = wn + j * 8 + g
                if TF32:
                    bf[2 * j] = Bs[buf, kk + t4, n]
                    bf[2 * j + 1] = Bs[buf, kk + t4 + 4, n]
                else:
                    bf[2 * j] = Bs[buf, n, kk + t4]
                    bf[2 * j + 1] = Bs[buf, n, kk + t4 + 4]
            for i in range(MT):
                for j in range(NTL):
                    p = 4 * (i * NTL + j)
                    d0, d1, d2, d3 = mma(af[4 * i], af[4 * i + 1], af[4 * i + 2], af[4 * i + 3], bf[2 * j],
                                         bf[2 * j + 1], acc[p], acc[p + 1], acc[p + 2], acc[p + 3])
                    acc[p] = d0
                    acc[p + 1] = d1
                    acc[p + 2] = d2
                    acc[p + 3] = d3

    @_jit(fastmath=True)
    def kernel(C, A, B, fast_ok):
        M = A.shape[0]
        KW = A.shape[1]
        N = B.shape[1] if TF32 else B.shape[0]
        tid = cuda.threadIdx.x & (NT - 1)
        warp = tid // 32
        lane = tid % 32
        g = lane >> 2
        t4 = lane & 3
        wm = (warp // WARPS_N) * WM
        wn = (warp % WARPS_N) * WN
        row0 = cuda.blockIdx.y * BM
        col0 = cuda.blockIdx.x * BN
        As = cuda.shared.array((NBUF, BM, LDA), WT, alignment=align)
        Bs = cuda.shared.array(BSHAPE, WT, alignment=align)
        acc = cuda.local.array(ACC, float32)
        af = cuda.local.array(MT4, WT)
        bf = cuda.local.array(NTL2, WT)
        ra = cuda.local.array(GA4, WT)
        rb = cuda.local.array(GB4, WT)
        for i in range(ACC):
            acc[i] = float32(0.0)
        fast = fast_ok != 0 and row0 + BM <= M and col0 + BN <= N
        ntiles = (KW + BKW - 1) // BKW
        if DBUF:
            for t in range(ntiles + 1):
                if t < ntiles:
                    load_tile(ra, rb, A, B, row0, col0, t * BKW, M, N, KW, fast, tid)
                if t >= 1:
                    compute_tile(acc, af, bf, As, Bs, (t - 1) & 1, wm, wn, g, t4)
                if t < ntiles:
                    store_tile(As, Bs, ra, rb, t & 1, tid)
                cuda.syncthreads()
        else:
            for t in range(ntiles):
                load_tile(ra, rb, A, B, row0, col0, t * BKW, M, N, KW, fast, tid)
                store_tile(As, Bs, ra, rb, 0, tid)
                cuda.syncthreads()
                compute_tile(acc, af, bf, As, Bs, 0, wm, wn, g, t4)
                cuda.syncthreads()
        for i in range(MT):
            r = row0 + wm + i * 16 + g
            for j in range(NTL):
                p = 4 * (i * NTL + j)
                c = col0 + wn + j * 8 + 2 * t4
                if r < M:
                    if c < N:
                        C[r, c] = acc[p]
                    if c + 1 < N:
                        C[r, c + 1] = acc[p + 1]
                if r + 8 < M:
                    if c < N:
                        C[r + 8, c] = acc[p + 2]
                    if c + 1 < N:
                        C[r + 8, c + 1] = acc[p + 3]

    kernel.threads = NT
    kernel.tile = (BM, BN)
    return kernel


@functools.cache
def make_wide_kernel(fmt, BM=128, BN=128, WM=64, WN=64, minblocks=2):
    """Rung 4: rung 3's double-buffered pipeline with the integer work taken out of the hot loop.

    - **Each fragment is one 16-byte shared load, straight into the registers the mma reads.** A tile is
      ``BKW = 16`` words deep: two k-steps. The order of k inside a tile is ours to choose (a sum does not
      care, as long as A and B agree): k-step 0 gives lane (g, t) the words 4t, 4t+1 as its k-slots t, t+4,
      k-step 1 the words 4t+2, 4t+3. Shared layouts (per buffer; "chunk" = 16 bytes):

      * A, both formats: rows m and m + 8 (m = 16 i + g) share a shared row of 8 chunks; chunk u holds
        A[m, k0], A[m+8, k0], A[m, k1], A[m+8, k1], exactly the registers a0..a3 of the mma (chunk t: words
        4t, 4t+1; chunk t+4: words 4t+2, 4t+3). A loader thread fetches the same 4 words of rows m and m+8
        and writes two chunks. Rows of odd g are stored with chunk u at u ^ 4 (a swizzle), so that the
        quarter warp's reads (lanes g = 2q, 2q+1) and writes fall in 32 different banks.
      * B, FP16/BF16 (W's (N, K) layout): rows of 4 chunks; lane (g, t) reads chunk t of row n: (b0, b1) of
        k-step 0 and of k-step 1.
      * B, TF32 ((K, N) layout): k rows 2p and 2p+1 share a shared row (2 BN + 4 words) as pairs
        B[2p, n], B[2p+1, n]: one chunk holds (b0, b1) of column n and of n + 1. So mma tile j = 2h + e of a
        warp takes the columns wn + 16h + 2c + e as its columns c = 0..7 (the epilogue writes each value to
        its column), and odd chunk-groups of 8 swap neighbours (chunk L at L ^ 1) for conflict-free stores.

      Every shared address is a per-thread base, computed once, plus a compile-time constant and the
      buffer's offset: no index arithmetic per access, and no register moves between load and mma.
    - **A 64 x 64 warp tile** (4 x 8 mma tiles): 16 LDS.128 feed 64 mma per tile (rung 3: 48 LDS for 32),
      in 128 x 128 block tiles of 4 warps, with ``launch_bounds`` asking for two blocks per SM (at most 255
      registers: 128 accumulators, 64 fragment words, 32 staged words of the next tile).
    - **Two loops.** Blocks whose tile is inside C (rows 16-byte aligned) run their full K tiles in a loop
      of unguarded 16-byte global loads at per-thread offsets that advance by a constant per tile; the last,
      partial, tile and every tile of an edge block go through a second loop of guarded 4-byte loads. Both
      loops call the same inline device functions.
    """
    TF32 = fmt == "tf32"
    mma = {"tf32": mma_tf32, "f16": mma_f16, "bf16": mma_bf16}[fmt]
    WT = float32 if TF32 else uint32
    BKW, BKW4 = 16, 4
    BN4 = BN // 4
    WARPS_N = BN // WN
    NW = (BM // WM) * WARPS_N
    NT = 32 * NW
    MT, NTL = WM // 16, WN // 8
    ACC = MT * NTL * 4
    SZA4 = BM * BKW4  # one buffer of A, in chunks: BM/2 rows of 8
    LDR4 = (2 * BN + 4) // 4  # TF32 B: a shared row (two k rows) in chunks
    SZB4 = 8 * LDR4 if TF32 else BN * BKW4
    GA = BM * BKW4 // (2 * NT)  # pairs of chunks (rows m, m+8) per thread per tile
    RA = 16 * NT // 32  # rows of A advanced per round: 8 row pairs per warp
    GB = BN * BKW4 // (2 * NT) if TF32 else BN * BKW4 // NT  # TF32: pairs (k rows 2p, 2p+1); else chunks
    RB = NT // BN4 if TF32 else NT // BKW4  # TF32: k-row pairs per round; else rows of W per round
    GA4, GB4 = 8 * GA, (8 if TF32 else 4) * GB
    FA, FB = 8 * MT, 4 * NTL  # fragment words per thread per tile
    SHA, SHB = 8 * SZA4, 8 * SZB4  # two buffers, in words
    assert NT & (NT - 1) == 0 and GA >= 1 and GA * 2 * NT == BM * BKW4
    assert WM % 16 == 0 and WN % 32 == 0 and BM % WM == 0 and BN % WN == 0 and NT % 32 == 0
    assert (not TF32) or (NT % BN4 == 0 and GB * RB == 8 and BN4 <= NT)
    assert TF32 or GB * NT == BN * BKW4
    align = SMEM_ALIGN
    opts = dict(fastmath=True)
    if minblocks:
        opts["launch_bounds"] = (NT, minblocks)

    @cuda.jit(device=True, inline=True)
    def load_fast(ra, rb, A, B, ga, gb, sa, ya, sb, yb):
        """This thread's chunks of a full tile, 16-byte loads: A at ga + s sa (+ ya: row m + 8), B at gb + s sb
        (TF32: + yb for k row 2p + 1)."""
        for s in range(GA):
            x0, x1, x2, x3 = load4(A, ga + s * sa)
            y0, y1, y2, y3 = load4(A, ga + s * sa + ya)
            ra[8 * s] = x0
            ra[8 * s + 1] = x1
            ra[8 * s + 2] = x2
            ra[8 * s + 3] = x3
            ra[8 * s + 4] = y0
            ra[8 * s + 5] = y1
            ra[8 * s + 6] = y2
            ra[8 * s + 7] = y3
        for s in range(GB):
            x0, x1, x2, x3 = load4(B, gb + s * sb)
            rb[(8 if TF32 else 4) * s] = x0
            rb[(8 if TF32 else 4) * s + 1] = x1
            rb[(8 if TF32 else 4) * s + 2] = x2
            rb[(8 if TF32 else 4) * s + 3] = x3
            if TF32:
                y0, y1, y2, y3 = load4(B, gb + s * sb + yb)
                rb[8 * s + 4] = y0
                rb[8 * s + 5] = y1
                rb[8 * s + 6] = y2
                rb[8 * s + 7] = y3

    @cuda.jit(device=True, inline=True)
    def load_guarded(ra, rb, A, B, ar, ac, br, bc, k0, M, N, KW):
        """The same values, one guarded 4-byte load each (zero outside the matrices): A[ar + s RA (+8),
        k0 + ac + e]; TF32: B[k0 + br + 2 s RB (+1), bc + e]; FP16/BF16: W[br + s RB, k0 + bc + e]."""
        for s in range(GA):
            for h in range(2):
                r = ar + s * RA + 8 * h
                for e in range(4):
                    c = k0 + ac + e
                    ra[8 * s + 4 * h + e] = A[r, c] if r < M and c < KW else WT(0)
        for s in range(GB):
            if TF32:
                for h in range(2):
                    r = k0 + br + 2 * s * RB + h
                    for e in range(4):
                        c = bc + e
                        rb[8 * s + 4 * h + e] = B[r, c] if r < KW and c < N else WT(0)
            else:
                r = br + s * RB
                for e in range(4):
                    c = k0 + bc + e
                    rb[4 * s + e] = B[r, c] if r < N and c < KW else WT(0)

    @cuda.jit(device=True, inline=True)
    def cv(x):
        return to_tf32(x) if TF32 else x

    @cuda.jit(device=True, inline=True)
    def store_tile(As, Bs, ra, rb, sl, sh, tl, th):
        """Registers -> one shared buffer (16-byte stores; TF32 rounded here): A's pairs interleaved at
        sl, sh (+ a round's rows), TF32 B's k-row pairs at tl, th, FP16/BF16 B's chunks at tl."""
        for s in range(GA):
            o = s * (RA // 2) * 8
            store4(As, sl + o, cv(ra[8 * s]), cv(ra[8 * s + 4]), cv(ra[8 * s + 1]), cv(ra[8 * s + 5]))
            store4(As, sh + o, cv(ra[8 * s + 2]), cv(ra[8 * s + 6]), cv(ra[8 * s + 3]), cv(ra[8 * s + 7]))
        for s in range(GB):
            if TF32:
                o = s * RB * LDR4
                store4(Bs, tl + o, cv(rb[8 * s]), cv(rb[8 * s + 4]), cv(rb[8 * s + 1]), cv(rb[8 * s + 5]))
                store4(Bs, th + o, cv(rb[8 * s + 2]), cv(rb[8 * s + 6]), cv(rb[8 * s + 3]), cv(rb[8 * s + 7]))
            else:
                store4(Bs, tl + s * RB * BKW4, rb[4 * s], rb[4 * s + 1], rb[4 * s + 2], rb[4 * s + 3])

    @cuda.jit(device=True, inline=True)
    def compute_tile(acc, fa, fb, As, Bs, pa0, pa1, pb0, pb1):
        """The warp's MT x NTL mma tiles over one shared buffer (two k-steps). pa0, pa1: this lane's A chunk of
        k-step 0, 1 (row pair g); TF32: pb0, pb1: its B chunk for even, odd column groups; else pb0: row g."""
        for i in range(MT):
            x0, x1, x2, x3 = load4(As, pa0 + 64 * i)
            fa[8 * i] = x0
            fa[8 * i + 1] = x1
            fa[8 * i + 2] = x2
            fa[8 * i + 3] = x3
            y0, y1, y2, y3 = load4(As, pa1 + 64 * i)
            fa[8 * i + 4] = y0
            fa[8 * i + 5] = y1
            fa[8 * i + 6] = y2
            fa[8 * i + 7] = y3
        if TF32:  # fb[16 ks + 4 h + ...]: (b0, b1) of tiles 2h and 2h + 1
            for ks in range(2):
                for h in range(NTL // 2):
                    y0, y1, y2, y3 = load4(Bs, (pb0 if h % 2 == 0 else pb1) + ks * LDR4 + 8 * h)
                    fb[4 * (ks * (NTL // 2) + h)] = y0
                    fb[4 * (ks * (NTL // 2) + h) + 1] = y1
                    fb[4 * (ks * (NTL // 2) + h) + 2] = y2
                    fb[4 * (ks * (NTL // 2) + h) + 3] = y3
        else:  # fb[4 j ...]: (b0, b1) of k-step 0, then of k-step 1
            for j in range(NTL):
                y0, y1, y2, y3 = load4(Bs, pb0 + 8 * j * BKW4)
                fb[4 * j] = y0
                fb[4 * j + 1] = y1
                fb[4 * j + 2] = y2
                fb[4 * j + 3] = y3
        for ks in range(2):
            for i in range(MT):
                for j in range(NTL):
                    if TF32:
                        q = 4 * (ks * (NTL // 2) + j // 2) + 2 * (j % 2)
                    else:
                        q = 4 * j + 2 * ks
                    p = 4 * (i * NTL + j)
                    f = 8 * i + 4 * ks
                    d0, d1, d2, d3 = mma(fa[f], fa[f + 1], fa[f + 2], fa[f + 3], fb[q], fb[q + 1],
                                         acc[p], acc[p + 1], acc[p + 2], acc[p + 3])
                    acc[p] = d0
                    acc[p + 1] = d1
                    acc[p + 2] = d2
                    acc[p + 3] = d3

    @_jit(**opts)
    def kernel(C, A, B, fast_ok):
        M = A.shape[0]
        KW = A.shape[1]
        N = B.shape[1] if TF32 else B.shape[0]
        tid = cuda.threadIdx.x & (NT - 1)  # the mask proves tid >= 0: no negative-index fix-up on shared reads
        warp = tid // 32
        lane = tid % 32
        g = lane >> 2
        t4 = lane & 3
        wm = (warp // WARPS_N) * WM
        wn = (warp % WARPS_N) * WN
        row0 = cuda.blockIdx.y * BM
        col0 = cuda.blockIdx.x * BN
        As = cuda.shared.array(SHA, WT, alignment=align)  # two buffers each, flat
        Bs = cuda.shared.array(SHB, WT, alignment=align)
        acc = cuda.local.array(ACC, float32)
        fa = cuda.local.array(FA, WT)
        fb = cuda.local.array(FB, WT)
        ra = cuda.local.array(GA4, WT)
        rb = cuda.local.array(GB4, WT)
        for i in range(ACC):
            acc[i] = float32(0.0)
        # Per-thread bases, once. Fragment reads (chunks): A row pair wm/2 + g, swizzled for odd g.
        sw = 4 * (g & 1)
        pa0 = (wm // 2 + g) * 8 + (t4 ^ sw)
        pa1 = (wm // 2 + g) * 8 + ((t4 + 4) ^ sw)
        # Loader: A pair (rows m, m + 8), m = 16 (tid // 32) + (tid // 4) % 8; 4 words at 4 ac.
        P = tid // 4
        ac = tid % 4
        am = 16 * (tid // 32) + P % 8
        swp = 4 * (P & 1)
        sl = P * 8 + (ac ^ swp)
        sh = P * 8 + ((ac + 4) ^ swp)
        if TF32:
            pb0 = 2 * t4 * LDR4 + wn // 2 + g
            pb1 = 2 * t4 * LDR4 + wn // 2 + (g ^ 1)
            bp = tid // BN4  # k-row pair p of the tile (and p + s RB), 4 columns at 4 bq
            bq = tid % BN4
            tl = bp * LDR4 + ((2 * bq) ^ ((bq >> 2) & 1))
            th = bp * LDR4 + ((2 * bq + 1) ^ ((bq >> 2) & 1))
        else:
            pb0 = (wn + g) * BKW4 + t4
            pb1 = pb0
            bp = tid // BKW4
            bq = tid % BKW4
            tl = bp * BKW4 + bq
            th = tl
        KW4 = KW // 4
        N4 = N // 4
        full = fast_ok != 0 and row0 + BM <= M and col0 + BN <= N
        ntiles = (KW + BKW - 1) // BKW
        nfull = KW // BKW if full else 0
        ga = (row0 + am) * KW4 + ac
        gsa = RA * KW4
        gya = 8 * KW4
        if TF32:
            gb = 2 * bp * N4 + col0 // 4 + bq
            gsb = 2 * RB * N4
            gyb = N4
            gtb = BKW * N4
            gbr = 2 * bp
            gbc = col0 + 4 * bq
        else:
            gb = (col0 + bp) * KW4 + bq
            gsb = RB * KW4
            gyb = 0
            gtb = BKW4
            gbr = col0 + bp
            gbc = 4 * bq
        # tile 0 -> buffer 0
        if nfull > 0:
            load_fast(ra, rb, A, B, ga, gb, gsa, gya, gsb, gyb)
        else:
            load_guarded(ra, rb, A, B, row0 + am, 4 * ac, gbr, gbc, 0, M, N, KW)
        store_tile(As, Bs, ra, rb, sl, sh, tl, th)
        cuda.syncthreads()
        # the hot loop: tile t + 1 (full) loads while tile t computes
        for t in range(nfull - 1):
            ga += BKW4
            gb += gtb
            load_fast(ra, rb, A, B, ga, gb, gsa, gya, gsb, gyb)
            oa = (t & 1) * SZA4
            ob = (t & 1) * SZB4
            compute_tile(acc, fa, fb, As, Bs, pa0 + oa, pa1 + oa, pb0 + ob, pb1 + ob)
            oa = SZA4 - oa
            ob = SZB4 - ob
            store_tile(As, Bs, ra, rb, sl + oa, sh + oa, tl + ob, th + ob)
            cuda.syncthreads()
        # the rest: the partial last tile, and every tile of an edge block
        for t in range(max(nfull - 1, 0), ntiles):
            if t + 1 < ntiles:
                load_guarded(ra, rb, A, B, row0 + am, 4 * ac, gbr, gbc, (t + 1) * BKW, M, N, KW)
            oa = (t & 1) * SZA4
            ob = (t & 1) * SZB4
            compute_tile(acc, fa, fb, As, Bs, pa0 + oa, pa1 + oa, pb0 + ob, pb1 + ob)
            if t + 1 < ntiles:
                oa = SZA4 - oa
                ob = SZB4 - ob
                store_tile(As, Bs, ra, rb, sl + oa, sh + oa, tl + ob, th + ob)
            cuda.syncthreads()
        # C: lane (g, t) holds rows g, g + 8 and columns 2t, 2t + 1 of each mma tile (TF32: permuted columns)
        for i in range(MT):
            r = row0 + wm + i * 16 + g
            for j in range(NTL):
                p = 4 * (i * NTL + j)
                if TF32:
                    c = col0 + wn + 16 * (j // 2) + 4 * t4 + j % 2
                    c1 = c + 2
                else:
                    c = col0 + wn + 8 * j + 2 * t4
                    c1 = c + 1
                if full:
                    C[r, c] = acc[p]
                    C[r, c1] = acc[p + 1]
                    C[r + 8, c] = acc[p + 2]
                    C[r + 8, c1] = acc[p + 3]
                else:
                    if r < M:
                        if c < N:
                            C[r, c] = acc[p]
                        if c1 < N:
                            C[r, c1] = acc[p + 1]
                    if r + 8 < M:
                        if c < N:
                            C[r + 8, c] = acc[p + 2]
                        if c1 < N:
                            C[r + 8, c1] = acc[p + 3]

    kernel.threads = NT
    kernel.tile = (BM, BN)
    return kernel


# ------------------------------------------------------------------------------------------------- launchers
@cuda.jit
def _pad_k_kernel(out, src):
    """out (R, KP) = src (R, K) with zero columns K..KP-1 (16-bit values)."""
    r, c = cuda.grid(2)
    if r < out.shape[0] and c < out.shape[1]:
        out[r, c] = src[r, c] if c < src.shape[1] else uint16(0)


_padded: dict = {}


def words(x):
    """A (R, K) array of 16-bit values (fp16, or bf16 bits) as (R, KP/2) uint32 words, KP = K rounded up to a
    multiple of 8 (zero-padded on the device when K is not: 16-byte rows for the loads; cached per array)."""
    R, K = x.shape
    if K % 8 == 0:
        return x.view(np.uint32) if hasattr(x, "view") else x
    key = (id(x), K)
    hit = _padded.get(key)
    if hit is not None and hit[0] is x:
        return hit[1]
    KP = ceil_div(K, 8) * 8
    out = cuda.device_array((R, KP), np.uint16)
    _pad_k_kernel[(ceil_div(R, 16), ceil_div(KP, 16)), (16, 16)](out, x.view(np.uint16) if x.dtype != np.uint16
                                                                else x)
    w = out.view(np.uint32)
    if len(_padded) >= 16:
        _padded.pop(next(iter(_padded)))
    _padded[key] = (x, w)
    return w


def _operands(fmt, A, B):
    if fmt == "tf32":
        M, K = A.shape
        N = B.shape[1]
        return A, B, M, N, int(K % 4 == 0 and N % 4 == 0)
    return words(A), words(B), A.shape[0], B.shape[0], 1


def launch_warp(fmt, C, A, B):
    a, b, M, N, _ = _operands(fmt, A, B)
    NW = WARP_TILE_WARPS
    make_warp_kernel(fmt)[(max(1, ceil_div(N, 8 * NW)), max(1, ceil_div(M, 16))), 32 * NW](C, a, b)


def launch_tile(fmt, C, A, B, dbuf=True, **shape):
    a, b, M, N, fast = _operands(fmt, A, B)
    k = make_tile_kernel(fmt, dbuf=dbuf, **shape)
    BM, BN = k.tile
    k[(max(1, ceil_div(N, BN)), max(1, ceil_div(M, BM))), k.threads](C, a, b, fast)


def launch_wide(fmt, C, A, B, **shape):
    a, b, M, N, fast = _operands(fmt, A, B)
    k = make_wide_kernel(fmt, **shape)
    BM, BN = k.tile
    k[(max(1, ceil_div(N, BN)), max(1, ceil_div(M, BM))), k.threads](C, a, b, fast)


def _sig(fmt, n):
    t = "float32[:, ::1]" if fmt == "tf32" else "uint32[:, ::1]"
    return f"void(float32[:, ::1], {t}, {t}" + (", int64)" if n == 4 else ")")


WIDE256 = dict(BN=256, minblocks=1)  # rung 5: 128 x 256 blocks of 8 warps, one block per SM
OCC = dict(WN=32, minblocks=2)  # rung 6: 64 x 32 warp tiles, 8 warps, <= 128 registers, two blocks per SM


def _register_gpu(fmt):
    op = OPS[fmt]

    def r1(C, A, B):
        launch_warp(fmt, C, A, B)

    r1.__doc__ = """One warp per 16 x 8 tile of C, fragments straight from global memory: every value of A is
        read once per 8 columns of C, of B once per 16 rows, from L2 at best. Predicted: a few % of cuBLAS (the
        tensor cores wait on loads: ~6 loads of 4 bytes per mma)."""
    register(op, "gpu", "mma_warp", rung=1, ptx=[(make_warp_kernel(fmt), _sig(fmt, 3))])(r1)

    def r2(C, A, B):
        launch_tile(fmt, C, A, B, dbuf=False)

    r2.__doc__ = """128 x 128 block tiles in shared memory, 8 warps each 64 x 32 (4 x 4 mma tiles): a fragment
        read from shared memory serves 4 mma's, a value of A is fetched from global memory once per 128 columns.
        Predicted: ~10x rung 1; limited by the barrier between loading and computing (no overlap)."""
    register(op, "gpu", "mma_smem", rung=2, ptx=[(make_tile_kernel(fmt, dbuf=False), _sig(fmt, 4))])(r2)

    def r3(C, A, B):
        launch_tile(fmt, C, A, B, dbuf=True)

    r3.__doc__ = """Rung 2 double-buffered, with 16-byte global loads: tile t+1's loads are in flight while tile
        t's mma's run, one barrier per tile. Predicted: 1.5-2x rung 2."""
    register(op, "gpu", "mma_dbuf", rung=3, ptx=[(make_tile_kernel(fmt, dbuf=True), _sig(fmt, 4))])(r3)

    def r4(C, A, B):
        launch_wide(fmt, C, A, B)

    r4.__doc__ = """Rung 3 with the integer work taken out of the hot loop: each fragment one 16-byte shared load
        (k reordered inside a tile, rows m and m + 8 interleaved, so the load lands in the registers the mma
        reads), every shared address a per-thread base plus a constant, 64 x 64 warp tiles (128 x 128 blocks
        of 4 warps, two blocks per SM), and a separate hot loop of unguarded 16-byte global loads for blocks
        inside C. SASS of the hot loop (ptxas, sm_90): 183 instructions per 64 mma for FP16/BF16 (rung 3: 510
        per 32), 336 for TF32 (rung 3: 586 per 32; the rounding to TF32 is ~100 of them). Predicted: 2-3x
        rung 3, at least the chapter's goals (50 % of cuBLAS in TF32, 35 % in FP16/BF16), short of cuBLAS
        for want of cp.async (the next tile still goes through registers) and of wgmma."""
    register(op, "gpu", "mma_wide", rung=4, ptx=[(make_wide_kernel(fmt), _sig(fmt, 4))])(r4)

    def r5(C, A, B):
        launch_wide(fmt, C, A, B, **WIDE256)

    r5.__doc__ = """Rung 4 with 128 x 256 block tiles (8 warps of 64 x 64, one block per SM): each value of A staged in
        shared memory now serves 256 columns instead of 128, halving A's global and shared traffic per mma, and
        8 warps instead of 2 x 4 share one barrier per tile. Predicted: 10-20 % over rung 4 if the loads were the
        limit, nothing if the mma issue rate is (the ncu profile of rung 4 says which)."""
    register(op, "gpu", "mma_wide256", rung=5, ptx=[(make_wide_kernel(fmt, **WIDE256), _sig(fmt, 4))])(r5)

    def r6(C, A, B):
        launch_wide(fmt, C, A, B, **OCC)

    r6.__doc__ = """Rung 4 with 64 x 32 warp tiles (8 warps per 128 x 128 block) and at most 128 registers, so that two
        blocks, 16 warps, share an SM (rung 4: 8 warps, 240 registers). ncu on rung 4: the tensor pipe busy 39 %
        of the time, the issue slots 20 %, the warps stalled on fixed-latency dependencies (wait), on global
        and shared loads (long and short scoreboard); with 8 warps per SM nothing else is ready to issue. Twice
        the warps hide twice the latency, at the price of more shared loads per mma (an A fragment now feeds 4
        mma instead of 8). Predicted: 1.2-1.5x rung 4 if latency is the limit."""
    register(op, "gpu", "mma_occ", rung=6, ptx=[(make_wide_kernel(fmt, **OCC), _sig(fmt, 4))])(r6)


for _f in KINDS:
    _register_gpu(_f)


# ------------------------------------------------------------------------------- cuBLAS through torch (yardstick)
def _tview(a, fmt=None):
    import torch

    t = torch.as_tensor(a, device="cuda")
    if fmt == "bf16":
        t = t.view(torch.bfloat16)
    return t


@register("gemm_tf32", "gpu", "cublas", baseline=True, requires=_torch_gpu)
def gemm_tf32_cublas(C, A, B):
    """cuBLAS through torch.matmul with TF32 allowed (and switched off again after: the fp32 benches need it off)."""
    import torch

    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        torch.matmul(_tview(A), _tview(B), out=_tview(C))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def _cublas_half(fmt):
    def run(Y, X, W):
        """cuBLAS through torch.mm in the same precision, FP32 output (``out_dtype``), no conversion pass."""
        import torch

        x, w = _tview(X, fmt), _tview(W, fmt)
        try:
            torch.mm(x, w.t(), out_dtype=torch.float32, out=_tview(Y))
        except TypeError:  # a torch without out_dtype: half output, then one conversion (counted in the time)
            _tview(Y).copy_(torch.mm(x, w.t()))
    return run


register("gemm_f16", "gpu", "cublas", baseline=True, requires=_torch_gpu)(_cublas_half("f16"))
register("gemm_bf16", "gpu", "cublas", baseline=True, requires=_torch_gpu)(_cublas_half("bf16"))
