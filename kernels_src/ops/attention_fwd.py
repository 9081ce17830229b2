"""Attention forward on the GPU, rungs 1-5 (chapter 9): from three kernels to flash tiles.

  gpu/three_kernels rung 1  scores (tiled GEMM) -> DRAM -> softmax -> DRAM -> P V (tiled GEMM)
  gpu/row          rung 2   one block per query row, online softmax: no S x T buffer at all
  gpu/flash        rung 3   Br x Bc flash tiling, running max/sum/unnormalized O in registers
  gpu/flash_causal rung 4   rung 3 that never loads tiles above the causal diagonal (or past kv_len)
  gpu/flash_tuned  rung 5   rung 4 with the tile shape chosen per head size D
and attention_scores' gpu/tiled (the first kernel of rung 1, and an exercise).
"""
from __future__ import annotations
import math
import numpy as np

from ..compiler import cuda, float32
from .. import device
from ..device import ceil_div
from ..registry import register
from .reductions import FAST_MATH, NEG_INF, ONE, ZERO, block_max_smem, block_sum_smem
from .softmax import block_online_smem


# ------------------------------------------------------------------------------------------ GPU
def _jit(threads=None):
    kw = {"fastmath": FAST_MATH}
    if threads is not None and not device.SIMULATED:
        kw["launch_bounds"] = threads
    return cuda.jit(**kw)


_cache: dict = {}


def _cached(key, make):
    if key not in _cache:
        _cache[key] = make()
    return _cache[key]


SIG_FWD = ("void(float32[:, :, :, ::1], float32[:, :, ::1], float32[:, :, :, ::1], float32[:, :, :, ::1], "
           "float32[:, :, :, ::1], int32[::1], int64)")
SIG_SCORES = ("void(float32[:, :, :, ::1], float32[:, :, :, ::1], float32[:, :, :, ::1], int32[::1], int64)")
TILE = 16  # rung 1's GEMM tiles (chapter 5's shared-memory rung, batched over (b, h))
TILE_P = TILE + 1  # padded shared rows (a literal: shared-array shapes must be compile-time constants)


def make_scores_kernel(D):
    scale = np.float32(1.0 / math.sqrt(D))

    @_jit(TILE * TILE)
    def attention_scores_kernel(sc, q, k, kv_len, causal):
        # q (B,H,S,D), k (B,Hkv,T,D) -> sc (B,H,S,T): one TILE x TILE tile of one head per block
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        H, S = q.shape[1], q.shape[2]
        T = k.shape[2]
        z = cuda.blockIdx.z
        b = z // H
        h = z % H
        hk = h // (H // k.shape[1])
        i = cuda.blockIdx.y * TILE + ty
        j0 = cuda.blockIdx.x * TILE
        Qs = cuda.shared.array((TILE, TILE_P), float32)
        Ks = cuda.shared.array((TILE, TILE_P), float32)
        acc = ZERO
        for d0 in range(0, D, TILE):
            Qs[ty, tx] = q[b, h, i, d0 + tx] if i < S and d0 + tx < D else ZERO
            jj = j0 + ty
            Ks[ty, tx] = k[b, hk, jj, d0 + tx] if jj < T and d0 + tx < D else ZERO
            cuda.syncthreads()
            for dd in range(TILE):
                acc += Qs[ty, dd] * Ks[tx, dd]
            cuda.syncthreads()
        j = j0 + tx
        if i < S and j < T:
            lim = kv_len[b]
            if causal:
                lim = min(lim, i + T - S + 1)
            sc[b, h, i, j] = acc * scale if j < lim else NEG_INF

    return attention_scores_kernel


def scores_kernel(D):
    return _cached(("scores", D), lambda: make_scores_kernel(D))


def _launch_scores(sc, q, k, kv_len, causal):
    B, H, S, D = q.shape
    T = k.shape[2]
    scores_kernel(D)[(ceil_div(T, TILE), ceil_div(S, TILE), B * H), (TILE, TILE)](sc, q, k, kv_len, causal)


@register("attention_scores", "gpu", "tiled", rung=1, ptx=[(scores_kernel(64), SIG_SCORES)])
def attention_scores_gpu(sc, q, k, v, kv_len, causal):
    """Chapter 5's shared-memory GEMM, batched over (b, h), with the scale and the mask applied at the
    store: the S x T score matrix goes to DRAM (B*H*S*T*4 bytes)."""
    _launch_scores(sc, q, k, kv_len, causal)


SM_THREADS = 128


@_jit(SM_THREADS)
def attention_softmax_kernel(sc, lse):
    # sc (B,H,S,T) scores -> probabilities in place; lse (B,H,S). One block per row.
    bm = cuda.shared.array(SM_THREADS, float32)
    bs = cuda.shared.array(SM_THREADS, float32)
    H, S, T = sc.shape[1], sc.shape[2], sc.shape[3]
    r = cuda.blockIdx.x
    b = r // (H * S)
    h = (r // S) % H
    i = r % S
    tid = cuda.threadIdx.x
    m = NEG_INF
    s = ZERO
    for c in range(tid, T, SM_THREADS):
        x = sc[b, h, i, c]
        if x > m:
            s = s * math.exp(m - x) + ONE
            m = x
        elif x > NEG_INF:
            s += math.exp(x - m)
    mx, tot = block_online_smem(m, s, bm, bs)
    ms = mx if mx != NEG_INF else ZERO
    inv = ONE / tot if tot > ZERO else ZERO
    for c in range(tid, T, SM_THREADS):
        sc[b, h, i, c] = math.exp(sc[b, h, i, c] - ms) * inv
    if tid == 0:
        lse[b, h, i] = mx + math.log(tot) if tot > ZERO else NEG_INF


@_jit(TILE * TILE)
def attention_pv_kernel(o, p, v):
    # p (B,H,S,T) @ v (B,Hkv,T,D) -> o (B,H,S,D): one TILE x TILE tile of O per block
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    H, S, T = p.shape[1], p.shape[2], p.shape[3]
    D = v.shape[3]
    z = cuda.blockIdx.z
    b = z // H
    h = z % H
    hk = h // (H // v.shape[1])
    i = cuda.blockIdx.y * TILE + ty
    d = cuda.blockIdx.x * TILE + tx
    Ps = cuda.shared.array((TILE, TILE_P), float32)
    Vs = cuda.shared.array((TILE, TILE_P), float32)
    acc = ZERO
    for j0 in range(0, T, TILE):
        Ps[ty, tx] = p[b, h, i, j0 + tx] if i < S and j0 + tx < T else ZERO
        Vs[ty, tx] = v[b, hk, j0 + ty, d] if j0 + ty < T and d < D else ZERO
        cuda.syncthreads()
        for jj in range(TILE):
            acc += Ps[ty, jj] * Vs[jj, tx]
        cuda.syncthreads()
    if i < S and d < D:
        o[b, h, i, d] = acc


_workspace: dict = {}


def workspace(shape):
    """Rung 1's score buffer, kept between calls like a caching allocator would (free_workspace())."""
    buf = _workspace.get("scores")
    if buf is None or buf.shape != tuple(shape):
        _workspace.clear()
        buf = _workspace["scores"] = cuda.device_array(shape, dtype=np.float32)
    return buf


def free_workspace():
    _workspace.clear()


@register("attention", "gpu", "three_kernels", rung=1,
          ptx=[(scores_kernel(64), SIG_SCORES),
               (attention_softmax_kernel, "void(float32[:, :, :, ::1], float32[:, :, ::1])"),
               (attention_pv_kernel, "void(float32[:, :, :, ::1], float32[:, :, :, ::1], float32[:, :, :, ::1])")])
def attention_three_kernels(o, lse, q, k, v, kv_len, causal):
    """Three kernels through DRAM: scores (tiled GEMM) -> softmax in place -> P V (tiled GEMM).

    The S x T matrix is written once and read three times (softmax twice, P V once): at B=4, H=16,
    S=T=2048 that is 4 GiB of traffic, ~1.5 ms at 2.9 TB/s, on top of two 16x16-tile GEMMs that chapter
    5 measured at ~15 % of cuBLAS. Predict ~10 TFLOP/s-equivalent at best, and O(S*T) memory."""
    B, H, S, D = q.shape
    T = k.shape[2]
    sc = workspace((B, H, S, T))
    _launch_scores(sc, q, k, kv_len, causal)
    attention_softmax_kernel[B * H * S, SM_THREADS](sc, lse)
    attention_pv_kernel[(ceil_div(D, TILE), ceil_div(S, TILE), B * H), (TILE, TILE)](o, sc, v)


ROW_THREADS = 64


def make_row_kernel(D):
    scale = np.float32(1.0 / math.sqrt(D))
    NT = ROW_THREADS

    @_jit(NT)
    def attention_row_kernel(o, lse, q, k, v, kv_len, causal):
        # one block per query row (b, h, i); thread t takes keys t, t+NT, ... with its own online state
        qs = cuda.shared.array(D, float32)
        red = cuda.shared.array((NT, D), float32)
        bm = cuda.shared.array(NT, float32)
        tid = cuda.threadIdx.x
        H, S = q.shape[1], q.shape[2]
        T = k.shape[2]
        i = cuda.blockIdx.x
        b = cuda.blockIdx.y // H
        h = cuda.blockIdx.y % H
        hk = h // (H // k.shape[1])
        for d in range(tid, D, NT):
            qs[d] = q[b, h, i, d] * scale
        cuda.syncthreads()
        lim = kv_len[b]
        if causal:
            lim = min(lim, i + T - S + 1)
        acc = cuda.local.array(D, float32)
        for d in range(D):
            acc[d] = ZERO
        m = NEG_INF
        s = ZERO
        for j in range(tid, lim, NT):
            x = ZERO
            for d in range(D):
                x += qs[d] * k[b, hk, j, d]
            mn = max(m, x)
            a = math.exp(m - mn)
            p = math.exp(x - mn)
            s = s * a + p
            for d in range(D):
                acc[d] = acc[d] * a + p * v[b, hk, j, d]
            m = mn
        mx = block_max_smem(m, bm)  # the row's max over all threads
        a = math.exp(m - mx) if m != NEG_INF else ZERO
        for d in range(D):
            red[tid, d] = acc[d] * a
        tot = block_sum_smem(s * a, bm)
        for d in range(tid, D, NT):
            x = ZERO
            for t in range(NT):
                x += red[t, d]
            o[b, h, i, d] = x / tot if tot > ZERO else ZERO
        if tid == 0:
            lse[b, h, i] = mx + math.log(tot) if tot > ZERO else NEG_INF

    return attention_row_kernel


def row_kernel(D):
    return _cached(("row", D), lambda: make_row_kernel(D))


@register("attention", "gpu", "row", rung=2, ptx=[(row_kernel(64), SIG_FWD)])
def attention_row(o, lse, q, k, v, kv_len, causal):
    """One block (64 threads) per query row, online softmax over the keys; no score matrix anywhere.

    Each thread keeps a running max, sum and D-float output for its keys; one merge at the end. DRAM
    traffic drops to Q, K, V, O, but every row re-reads all of K and V (through L2): S*T*D*8 bytes of
    L2 traffic and one dot product per thread with no data reuse. Predict L2-bound, ~2-4 TFLOP/s:
    faster than rung 1 only where the S x T traffic dominated."""
    B, H, S, D = q.shape
    row_kernel(D)[(S, B * H), ROW_THREADS](o, lse, q, k, v, kv_len, causal)


def make_flash_kernel(D, BR, BC, TM, TN, skip):
    """Flash forward. A block owns BR query rows of one (b, h) and walks over key tiles of BC rows.
    Threads form an NTY x NTX grid; thread (ty, tx) owns score rows ty*TM + r and columns tx + NTX*c
    (c < TN), and the same rows of O, columns tx + NTX*c (c < DC). Per tile: K, V tiles -> shared
    memory; TM x TN scores in registers; the row max over the tile through shared memory; P -> shared
    memory; O += P V in registers. Running max m, sum l and unnormalized O live in registers; O is
    divided by l once at the end. ``skip``: loop only over tiles that hold a visible key."""
    NTX, NTY = BC // TN, BR // TM
    NT = NTX * NTY
    assert NT & (NT - 1) == 0 and BC % TN == 0 and BR % TM == 0
    DC = ceil_div(D, NTX)
    DP = D + 1  # padded rows: a column walk hits 32 different banks
    KP = max(BC * DP, BR * (BC + 1))  # K tile and P tile share one buffer (P is written after K is used)
    LQ = ceil_div(BR * D, NT)
    LK = ceil_div(BC * D, NT)
    scale = np.float32(1.0 / math.sqrt(D))
    smem = 4 * (BR * DP + KP + BC * D + BR * NTX)
    if smem > SMEM_LIMIT:
        raise ValueError(f"flash tiles BR={BR} BC={BC} at D={D} need {smem} bytes of shared memory "
                         f"(> {SMEM_LIMIT}, the static limit)")

    @_jit(NT)
    def attention_flash_kernel(o, lse, q, k, v, kv_len, causal):
        tid = cuda.threadIdx.x & (NT - 1)  # tells the compiler tid >= 0 (no negative-index fix-ups)
        ty = tid // NTX
        tx = tid % NTX
        H, S = q.shape[1], q.shape[2]
        T = k.shape[2]
        b = cuda.blockIdx.y // H
        h = cuda.blockIdx.y % H
        hk = h // (H // k.shape[1])
        i0 = cuda.blockIdx.x * BR
        Qs = cuda.shared.array((BR, DP), float32)
        KPs = cuda.shared.array(KP, float32)
        Vs = cuda.shared.array((BC, D), float32)
        red = cuda.shared.array((BR, NTX), float32)
        sacc = cuda.local.array((TM, TN), float32)
        oacc = cuda.local.array((TM, DC), float32)
        mrow = cuda.local.array(TM, float32)
        lrow = cuda.local.array(TM, float32)
        ra = cuda.local.array(TM, float32)
        rb = cuda.local.array(TN, float32)
        rv = cuda.local.array(DC, float32)
        for e in range(LQ):  # Q tile, pre-scaled, loaded once
            x = tid + e * NT
            if x < BR * D:
                r = x // D
                c = x % D
                Qs[r, c] = q[b, h, i0 + r, c] * scale if i0 + r < S else ZERO
        for r in range(TM):
            mrow[r] = NEG_INF
            lrow[r] = ZERO
            for c in range(DC):
                oacc[r, c] = ZERO
        kv = kv_len[b]
        off = T - S
        jend = kv
        if causal:
            jend = min(jend, i0 + BR + off)  # last row of the block sees keys j <= i0 + BR - 1 + off
        ntiles = (T + BC - 1) // BC
        if skip:
            ntiles = (max(jend, 0) + BC - 1) // BC
        for t in range(ntiles):
            j0 = t * BC
            cuda.syncthreads()  # everyone is done with the previous V and P tiles
            for e in range(LK):
                x = tid + e * NT
                if x < BC * D:
                    r = x // D
                    c = x % D
                    inside = j0 + r < T
                    KPs[r * DP + c] = k[b, hk, j0 + r, c] if inside else ZERO
                    Vs[r, c] = v[b, hk, j0 + r, c] if inside else ZERO
            cuda.syncthreads()
            for r in range(TM):
                for c in range(TN):
                    sacc[r, c] = ZERO
            for d in range(D):  # TM x TN scores: TM + TN shared loads for TM * TN FMAs
                for r in range(TM):
                    ra[r] = Qs[ty * TM + r, d]
                for c in range(TN):
                    rb[c] = KPs[(tx + NTX * c) * DP + d]
                for r in range(TM):
                    for c in range(TN):
                        sacc[r, c] += ra[r] * rb[c]
            for r in range(TM):  # mask, then this thread's max of each of its rows
                i = i0 + ty * TM + r
                lim = kv
                if causal:
                    lim = min(lim, i + off + 1)
                mx = NEG_INF
                for c in range(TN):
                    if j0 + tx + NTX * c >= lim:
                        sacc[r, c] = NEG_INF
                    mx = max(mx, sacc[r, c])
                red[ty * TM + r, tx] = mx
            cuda.syncthreads()  # partial maxima visible; every thread is done reading the K tile
            for r in range(TM):
                mx = mrow[r]
                for x in range(NTX):
                    mx = max(mx, red[ty * TM + r, x])
                alpha = math.exp(mrow[r] - mx) if mx != NEG_INF else ONE
                ms = mx if mx != NEG_INF else ZERO
                mrow[r] = mx
                ls = ZERO
                for c in range(TN):
                    p = math.exp(sacc[r, c] - ms)  # exp(-inf) = 0 for masked entries
                    KPs[(ty * TM + r) * (BC + 1) + tx + NTX * c] = p
                    ls += p
                lrow[r] = lrow[r] * alpha + ls  # this thread's partial sum, rescaled to the new max
                for c in range(DC):
                    oacc[r, c] *= alpha
            cuda.syncthreads()  # the P tile is complete
            for j in range(BC):  # O += P V: TM + DC shared loads for TM * DC FMAs
                for r in range(TM):
                    ra[r] = KPs[(ty * TM + r) * (BC + 1) + j]
                for c in range(DC):
                    dd = tx + NTX * c
                    rv[c] = Vs[j, dd] if dd < D else ZERO
                for r in range(TM):
                    for c in range(DC):
                        oacc[r, c] += ra[r] * rv[c]
        cuda.syncthreads()
        for r in range(TM):  # the row sum is split over the NTX threads of the row: add the parts once
            red[ty * TM + r, tx] = lrow[r]
        cuda.syncthreads()
        for r in range(TM):
            i = i0 + ty * TM + r
            if i < S:
                tot = ZERO
                for x in range(NTX):
                    tot += red[ty * TM + r, x]
                inv = ONE / tot if tot > ZERO else ZERO
                for c in range(DC):
                    dd = tx + NTX * c
                    if dd < D:
                        o[b, h, i, dd] = oacc[r, c] * inv  # the one division, at the very end
                if tx == 0:
                    lse[b, h, i] = mrow[r] + math.log(tot) if tot > ZERO else NEG_INF

    def launch(o, lse, q, k, v, kv_len, causal):
        B, H, S, _ = q.shape
        attention_flash_kernel[(ceil_div(S, BR), B * H), NT](o, lse, q, k, v, kv_len, causal)

    launch.kernel = attention_flash_kernel
    launch.config = dict(D=D, BR=BR, BC=BC, TM=TM, TN=TN, threads=NT, skip=skip, smem_bytes=smem)
    return launch


def flash(D, BR, BC, TM, TN, skip):
    return _cached(("flash", D, BR, BC, TM, TN, skip), lambda: make_flash_kernel(D, BR, BC, TM, TN, skip))


SMEM_LIMIT = 48 * 1024  # static shared memory per block (Numba has no opt-in to more)
FLASH_CFG = dict(BR=64, BC=32, TM=8, TN=4)  # 64 threads, 8 x 4 scores and 8 x (D/8) outputs each
FLASH_CFG_WIDE = dict(BR=32, BC=16, TM=4, TN=2)  # D > 64: a 64 x 128 Q tile alone would be 32 KiB


def _base_cfg(D):
    return FLASH_CFG if D <= 64 else FLASH_CFG_WIDE
# Rung 5's shapes per head size: static shared memory is capped at 48 KiB per block in Numba, which
# bounds BR*D + BC*D + BR*BC. These were chosen by counting shared loads per FMA, NOT by measurement:
# on the H100 the D = 64 shape turned out slower than rung 4's (chapter 9). The tool to choose them is
# kernels_src.figures.attention.sweep(), which times every shape in its SWEEP list.
TUNED = {16: dict(BR=64, BC=64, TM=8, TN=8), 32: dict(BR=64, BC=64, TM=8, TN=8),
         64: dict(BR=64, BC=48, TM=8, TN=6), 128: dict(BR=32, BC=24, TM=4, TN=3)}


def _tuned_cfg(D):
    return TUNED.get(D, _base_cfg(D))


@register("attention", "gpu", "flash", rung=3, ptx=[(flash(64, skip=False, **FLASH_CFG).kernel, SIG_FWD)])
def attention_flash(o, lse, q, k, v, kv_len, causal):
    """Flash tiling: 64-row query blocks walk 32-key K/V tiles in shared memory; m, l and O in registers.

    Scores, the running max and sum and the unnormalized O stay in registers; O is divided once at the end.

    Each K/V element is read from L2 S/64 times instead of S times, and each thread does 8 x 4 scores
    and 8 x 8 outputs per tile from 12 and 16 shared loads: ~0.4 loads per FMA (rung 2: ~1 global load
    per FMA). Predict ~15-25 TFLOP/s: the SDPA math backend's speed without its S x T traffic.
    Masked tiles are still computed (and thrown away): causal costs the same as non-causal."""
    flash(q.shape[3], skip=False, **_base_cfg(q.shape[3]))(o, lse, q, k, v, kv_len, causal)


@register("attention", "gpu", "flash_causal", rung=4, ptx=[(flash(64, skip=True, **FLASH_CFG).kernel, SIG_FWD)])
def attention_flash_causal(o, lse, q, k, v, kv_len, causal):
    """Rung 3 that stops at the last key tile any of its rows can see (the causal diagonal, kv_len).

    Tiles strictly above the diagonal are never loaded or computed: with S = T = 2048 and 64-row
    blocks the work falls to (32*33/2)/(32*32) ~ 52 % of the tiles. Predict causal ~1.9x faster than
    non-causal (the blocks on the diagonal do some masked work); non-causal unchanged."""
    flash(q.shape[3], skip=True, **_base_cfg(q.shape[3]))(o, lse, q, k, v, kv_len, causal)


@register("attention", "gpu", "flash_tuned", rung=5,
          ptx=[(flash(64, skip=True, **TUNED[64]).kernel, SIG_FWD),
               (flash(128, skip=True, **TUNED[128]).kernel, SIG_FWD)])
def attention_flash_tuned(o, lse, q, k, v, kv_len, causal):
    """Rung 4 with a bigger register tile per thread: 64 x 48 tiles, 8 x 6 scores per thread (D = 64).

    TUNED holds one shape per head size (32 x 24 of 4 x 3 for D = 128, whose Q tile alone is 16 KiB),
    picked by counting, not measuring: for D = 64 an 8 x 6 score tile needs 14 shared loads for 48 FMAs
    (0.29 per FMA, was 0.375). Predict ~1.2x rung 4."""
    flash(q.shape[3], skip=True, **_tuned_cfg(q.shape[3]))(o, lse, q, k, v, kv_len, causal)
