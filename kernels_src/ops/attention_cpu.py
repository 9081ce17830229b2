"""Attention on the CPU (chapter 9), forward, scores and backward; the ops are defined in attention_ref.

  cpu/naive        rung 1   per (b, h) the S x T score matrix materialized, then softmax, then P V
  cpu/online       rung 2   one query row at a time, online softmax over the keys: O(D) extra memory
  cpu/prange       rung 3   rung 2 with (b, h, row block) spread over the cores
  cpu/blocked      rung 4   16 query rows x 64-key tiles: each K/V tile is reused by 16 rows from cache
  cpu/simd         rung 5   rung 4 in SIMD: score and P V tiles register-blocked 2 rows x 4 keys, the
                            exp from cpumath (no libm call), the tile max an integer max
  cpu/microgemm    rung 6   the tile products as micro-GEMMs along contiguous rows (scores stored key-major,
                            sums in zmm registers, no horizontal sums), softmax across 32 rows at once, causal
                            work paired per task
  cpu/numpy        baseline the formula with NumPy matmuls in float32 (the S x T scores materialized)
  cpu/torch        baseline torch.nn.functional.scaled_dot_product_attention on the CPU
attention_scores: cpu/loop, cpu/prange, cpu/tiles (4 rows x 16 keys in zmm registers); attention_bwd and attention_bwd_dv: cpu/prange.
"""
from __future__ import annotations
import math
import numpy as np

from ..compiler import get_num_threads, njit, prange
from ..compiler.cpuint8 import vmul16
from ..compiler.cpusimd import vfma16, vload16, vsplat16, vstore16, vzero16
from ..registry import register
from .reductions import FAST_MATH
from .cpu_baselines import torch_cpu, tviews
from .softmax import CPU_FAST, exp_nonpos, row_max_simd
from .attention_torch import O_ONLY
from .attention_ref import visible


# --------------------------------------------------------------------------------------------- CPU
@njit(cache=True, error_model="numpy", fastmath=FAST_MATH)
def _naive_cpu(o, lse, q, k, v, kv_len, causal):
    B, H, S, D = q.shape
    T = k.shape[2]
    g = H // k.shape[1]
    scale = np.float32(1.0 / math.sqrt(D))
    sc = np.empty((S, T), dtype=np.float32)  # the score matrix of one head, materialized
    for b in range(B):
        for h in range(H):
            hk = h // g
            for i in range(S):
                lim = min(kv_len[b], i + T - S + 1) if causal else kv_len[b]
                for j in range(T):
                    if j < lim:
                        acc = np.float32(0.0)
                        for d in range(D):
                            acc += q[b, h, i, d] * k[b, hk, j, d]
                        sc[i, j] = acc * scale
                    else:
                        sc[i, j] = -np.inf
            for i in range(S):
                m = np.float32(-np.inf)
                for j in range(T):
                    m = max(m, sc[i, j])
                if m == -np.inf:  # fully masked row: O = 0, L = -inf
                    o[b, h, i, :] = 0.0
                    lse[b, h, i] = -np.inf
                    continue
                s = np.float32(0.0)
                for j in range(T):
                    e = np.exp(sc[i, j] - m)
                    sc[i, j] = e
                    s += e
                inv = np.float32(1.0) / s
                for d in range(D):
                    o[b, h, i, d] = 0.0
                for j in range(T):
                    p = sc[i, j] * inv
                    for d in range(D):
                        o[b, h, i, d] += p * v[b, hk, j, d]
                lse[b, h, i] = m + np.log(s)


@register("attention", "cpu", "naive", rung=1)
def attention_naive_cpu(o, lse, q, k, v, kv_len, causal):
    """The formula as written: per head an S x T score buffer, a softmax over its rows, then P V.

    Memory traffic per head: S*T floats written and read twice on top of Q, K, V, O. At S = T = 256
    the buffer (256 KiB) still fits in L2, so predict ~1 GFLOP/s-class speed limited by the scalar
    loops, not by the buffer; at S = T = 16384 it would be 1 GiB per head."""
    _naive_cpu(o, lse, q, k, v, kv_len, causal)


@njit(cache=True, error_model="numpy", fastmath=FAST_MATH, inline="always")
def _online_row(o, lse, q, k, v, kv_len, causal, b, h, i, acc):
    S, D = q.shape[2], q.shape[3]
    T = k.shape[2]
    hk = h // (q.shape[1] // k.shape[1])
    scale = np.float32(1.0 / math.sqrt(D))
    lim = min(kv_len[b], i + T - S + 1) if causal else kv_len[b]
    m = np.float32(-np.inf)
    s = np.float32(0.0)
    for d in range(D):
        acc[d] = 0.0
    for j in range(lim):
        x = np.float32(0.0)
        for d in range(D):
            x += q[b, h, i, d] * k[b, hk, j, d]
        x *= scale
        if x > m:  # a new maximum: rescale what has been summed so far
            a = np.exp(m - x)
            s = s * a + np.float32(1.0)
            for d in range(D):
                acc[d] = acc[d] * a + v[b, hk, j, d]
            m = x
        else:
            p = np.exp(x - m)
            s += p
            for d in range(D):
                acc[d] += p * v[b, hk, j, d]
    if s > 0:
        inv = np.float32(1.0) / s
        for d in range(D):
            o[b, h, i, d] = acc[d] * inv
        lse[b, h, i] = m + np.log(s)
    else:
        for d in range(D):
            o[b, h, i, d] = 0.0
        lse[b, h, i] = -np.inf


@njit(cache=True, error_model="numpy", fastmath=FAST_MATH)
def _online_cpu(o, lse, q, k, v, kv_len, causal):
    B, H, S, D = q.shape
    acc = np.empty(D, dtype=np.float32)
    for b in range(B):
        for h in range(H):
            for i in range(S):
                _online_row(o, lse, q, k, v, kv_len, causal, b, h, i, acc)


@register("attention", "cpu", "online", rung=2)
def attention_online_cpu(o, lse, q, k, v, kv_len, causal):
    """One query row at a time with online softmax: a running max m, sum s and unnormalized output
    (D floats) replace the S x T buffer; keys past the mask are never even visited.

    Same FLOPs as rung 1 (fewer with a causal mask: the loop stops at the diagonal), no S*T traffic.
    Predict ~1x rung 1 without a mask (both are bound by the scalar dot products) and ~2x with causal."""
    _online_cpu(o, lse, q, k, v, kv_len, causal)


ROWS_PER_TASK = 16


@njit(parallel=True, cache=True, error_model="numpy", fastmath=FAST_MATH)
def _prange_cpu(o, lse, q, k, v, kv_len, causal):
    B, H, S, D = q.shape
    nblk = (S + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for t in prange(B * H * nblk):
        b = t // (H * nblk)
        h = (t // nblk) % H
        r0 = (t % nblk) * ROWS_PER_TASK
        acc = np.empty(D, dtype=np.float32)
        for i in range(r0, min(S, r0 + ROWS_PER_TASK)):
            _online_row(o, lse, q, k, v, kv_len, causal, b, h, i, acc)


@register("attention", "cpu", "prange", rung=3)
def attention_prange_cpu(o, lse, q, k, v, kv_len, causal):
    """Rung 2 with (b, h, block of 16 rows) spread over the cores with prange.

    Rows are independent, and 16-row tasks balance the causal triangle (late rows have more keys).
    Predict ~cores x rung 2 (2x on this 2-core machine)."""
    _prange_cpu(o, lse, q, k, v, kv_len, causal)


BR_CPU, BC_CPU = 16, 64


@njit(parallel=True, cache=True, error_model="numpy", fastmath=FAST_MATH)
def _blocked_cpu(o, lse, q, k, v, kv_len, causal):
    B, H, S, D = q.shape
    T = k.shape[2]
    g = H // k.shape[1]
    scale = np.float32(1.0 / math.sqrt(D))
    nblk = (S + BR_CPU - 1) // BR_CPU
    for t in prange(B * H * nblk):
        b = t // (H * nblk)
        h = (t // nblk) % H
        hk = h // g
        r0 = (t % nblk) * BR_CPU
        r1 = min(S, r0 + BR_CPU)
        m = np.full(BR_CPU, -np.inf, dtype=np.float32)
        s = np.zeros(BR_CPU, dtype=np.float32)
        acc = np.zeros((BR_CPU, D), dtype=np.float32)
        sc = np.empty(BC_CPU, dtype=np.float32)
        qs = np.empty((BR_CPU, D), dtype=np.float32)
        for i in range(r0, r1):
            for d in range(D):
                qs[i - r0, d] = q[b, h, i, d] * scale
        last = min(kv_len[b], r1 - 1 + T - S + 1) if causal else kv_len[b]  # keys any row of the block sees
        for j0 in range(0, max(last, 0), BC_CPU):  # this K/V tile (64 x D floats) stays in L1/L2 for 16 rows
            j1 = min(last, j0 + BC_CPU)
            for i in range(r0, r1):
                r = i - r0
                lim = min(j1, i + T - S + 1) if causal else j1
                if lim <= j0:
                    continue
                mt = m[r]
                for j in range(j0, lim):
                    x = np.float32(0.0)
                    for d in range(D):
                        x += qs[r, d] * k[b, hk, j, d]
                    sc[j - j0] = x
                    mt = max(mt, x)
                a = np.exp(m[r] - mt)  # one rescale per tile, not per key
                st = np.float32(0.0)
                for d in range(D):
                    acc[r, d] *= a
                for j in range(j0, lim):
                    p = np.exp(sc[j - j0] - mt)
                    st += p
                    for d in range(D):
                        acc[r, d] += p * v[b, hk, j, d]
                s[r] = s[r] * a + st
                m[r] = mt
        for i in range(r0, r1):
            r = i - r0
            if s[r] > 0:
                inv = np.float32(1.0) / s[r]
                for d in range(D):
                    o[b, h, i, d] = acc[r, d] * inv
                lse[b, h, i] = m[r] + np.log(s[r])
            else:
                for d in range(D):
                    o[b, h, i, d] = 0.0
                lse[b, h, i] = -np.inf


@register("attention", "cpu", "blocked", rung=4)
def attention_blocked_cpu(o, lse, q, k, v, kv_len, causal):
    """Rung 3 blocked: 16 query rows share each 64-key tile of K and V while it sits in cache, and the
    online rescale happens once per tile instead of once per new maximum.

    K and V are read from memory S/16 times instead of S times. At small S everything fits in cache
    anyway, so predict a modest gain (~1.2-1.5x rung 3) from the cheaper rescaling and reuse."""
    _blocked_cpu(o, lse, q, k, v, kv_len, causal)


BR_SIMD, BC_SIMD = 16, 64  # both even / multiples of 4: the tile loops below take rows in pairs, keys in fours


@njit(parallel=True, cache=True, error_model="numpy", fastmath=CPU_FAST)
def _simd_cpu(o, lse, q, k, v, kv_len, causal):
    B, H, S, D = q.shape
    T = k.shape[2]
    g = H // k.shape[1]
    scale = np.float32(1.0 / math.sqrt(D))
    nblk = (S + BR_SIMD - 1) // BR_SIMD
    for t in prange(B * H * nblk):  # (b, h, block of 16 query rows): independent tasks
        b = t // (H * nblk)
        h = (t // nblk) % H
        hk = h // g
        r0 = (t % nblk) * BR_SIMD
        nr = min(S, r0 + BR_SIMD) - r0
        nr2 = nr + (nr & 1)  # rows in pairs; a padding row has q = 0 and p = 0
        m = np.full(BR_SIMD, -np.inf, dtype=np.float32)
        s = np.zeros(BR_SIMD, dtype=np.float32)
        acc = np.zeros((BR_SIMD, D), dtype=np.float32)
        sc = np.zeros((BR_SIMD, BC_SIMD), dtype=np.float32)
        qs = np.zeros((BR_SIMD, D), dtype=np.float32)
        for r in range(nr):
            for d in range(D):
                qs[r, d] = q[b, h, r0 + r, d] * scale
        last = min(kv_len[b], r0 + nr - 1 + T - S + 1) if causal else kv_len[b]  # keys any row of the block sees
        for j0 in range(0, max(last, 0), BC_SIMD):
            w = min(last, j0 + BC_SIMD) - j0
            jl = j0 + w - 1  # key indices past the tile are clamped to its last key (their p is 0)
            for r in range(0, nr2, 2):  # scores: 2 rows x 4 keys, 8 dots over D in 8 vector registers
                for jj in range(0, w, 4):
                    ja = j0 + jj
                    jb, jc, jd = min(ja + 1, jl), min(ja + 2, jl), min(ja + 3, jl)
                    x0 = x1 = x2 = x3 = x4 = x5 = x6 = x7 = np.float32(0.0)
                    for d in range(D):  # 6 loads feed 8 FMAs
                        qa, qb = qs[r, d], qs[r + 1, d]
                        ka, kb, kc, kd = k[b, hk, ja, d], k[b, hk, jb, d], k[b, hk, jc, d], k[b, hk, jd, d]
                        x0 += qa * ka
                        x1 += qa * kb
                        x2 += qa * kc
                        x3 += qa * kd
                        x4 += qb * ka
                        x5 += qb * kb
                        x6 += qb * kc
                        x7 += qb * kd
                    sc[r, jj], sc[r, jj + 1], sc[r, jj + 2], sc[r, jj + 3] = x0, x1, x2, x3
                    sc[r + 1, jj], sc[r + 1, jj + 1], sc[r + 1, jj + 2], sc[r + 1, jj + 3] = x4, x5, x6, x7
            w4 = (w + 3) // 4 * 4
            for r in range(nr2):  # online softmax of each row's tile, p written over its scores
                i = r0 + r
                n = (min(j0 + w, i + T - S + 1) if causal else j0 + w) - j0 if r < nr else 0
                if n <= 0:  # no visible key in this tile: p = 0, nothing rescaled
                    for jj in range(w4):
                        sc[r, jj] = 0.0
                    continue
                srow = sc[r, :n]
                mt = max(m[r], row_max_simd(srow))
                a = exp_nonpos(m[r] - mt)  # rescale of what came before (0 at the first tile: m = -inf)
                st = np.float32(0.0)
                for jj in range(n):  # chapter 8's SIMD exp, the sum in vector lanes
                    p = exp_nonpos(srow[jj] - mt)
                    srow[jj] = p
                    st += p
                for jj in range(n, w4):
                    sc[r, jj] = 0.0
                for d in range(D):
                    acc[r, d] *= a
                s[r] = s[r] * a + st
                m[r] = mt
            for r in range(0, nr2, 2):  # acc += P V: 2 rows x 4 keys per sweep over D (4 loads of v, 8 FMAs)
                for jj in range(0, w, 4):
                    ja = j0 + jj
                    jb, jc, jd = min(ja + 1, jl), min(ja + 2, jl), min(ja + 3, jl)
                    pa0, pa1, pa2, pa3 = sc[r, jj], sc[r, jj + 1], sc[r, jj + 2], sc[r, jj + 3]
                    pb0, pb1, pb2, pb3 = sc[r + 1, jj], sc[r + 1, jj + 1], sc[r + 1, jj + 2], sc[r + 1, jj + 3]
                    for d in range(D):
                        va, vb, vc, vd = v[b, hk, ja, d], v[b, hk, jb, d], v[b, hk, jc, d], v[b, hk, jd, d]
                        acc[r, d] += pa0 * va + pa1 * vb + pa2 * vc + pa3 * vd
                        acc[r + 1, d] += pb0 * va + pb1 * vb + pb2 * vc + pb3 * vd
        for r in range(nr):
            i = r0 + r
            if s[r] > 0:
                inv = np.float32(1.0) / s[r]
                for d in range(D):
                    o[b, h, i, d] = acc[r, d] * inv
                lse[b, h, i] = m[r] + np.log(s[r])
            else:  # no visible key: O = 0, L = -inf
                for d in range(D):
                    o[b, h, i, d] = 0.0
                lse[b, h, i] = -np.inf


@register("attention", "cpu", "simd", rung=5)
def attention_simd_cpu(o, lse, q, k, v, kv_len, causal):
    """Rung 4 with every inner loop in SIMD and register-blocked. Rung 4 computes one score at a time (a dot
    over D, then a horizontal sum) and calls libm's expf per score. Here a 16-row x 64-key tile of scores
    is computed 2 rows x 4 keys at a time: 8 dot products over D share 6 vector loads per step and stay in 8
    vector registers (14 of the 16 AVX2 registers); the exps are chapter 8's exp_nonpos (no libm call), the tile
    max an integer max; P V runs 2 rows x 4 keys per sweep over D (4 loads of V feed 8 FMAs). Predicted:
    ~60 % of the FMA units' 256-bit peak in the two tile products, ~2x rung 4 at 1 x 4 x 256 x 256 x 64,
    close to torch's SDPA with a causal mask."""
    _simd_cpu(o, lse, q, k, v, kv_len, causal)


# ------------------------------------------------------------------------- rung 6: micro-GEMMs on zmm
BR_MG, BC_MG = 32, 64  # query rows per block (2 zmm of 16 floats; a multiple of 8), keys per tile


@njit(cache=True, error_model="numpy", fastmath=CPU_FAST)
def _mg_block(o, lse, q, k, v, kv_len, causal, b, h, hk, r0, t, QT, ST, ACC, VEC, LIM):
    """One block of BR_MG query rows of head (b, h) against all the keys it sees, K/V tile by tile.

    The scores of a tile are kept key-major, sT[j, r], so that every loop runs along r (the query rows of
    the block, 32 contiguous floats = 2 zmm registers): the score product is sT[j, :] += k[j, d] * qt[d, :]
    (one scalar of K broadcast, a row of the transposed Q block), the online softmax runs across the 32 rows
    at once, and P V accumulates the output transposed, acc[d, :] += v[j, d] * sT[j, :]. No loop ends in a
    horizontal sum of vector lanes. The scratch arrays are task t's slices of arrays allocated before the prange loop: arguments of the
    parallel region that alias nothing, which Numba marks noalias, so LLVM may keep values in registers
    across stores to them."""
    qt, sT, acc, lim = QT[t], ST[t], ACC[t], LIM[t]
    m, s, mt, st = VEC[t, 0], VEC[t, 1], VEC[t, 2], VEC[t, 3]
    S, D = q.shape[2], q.shape[3]
    T = k.shape[2]
    scale = np.float32(1.0 / math.sqrt(D))
    nr = min(S, r0 + BR_MG) - r0
    for r in range(BR_MG):  # Q block transposed and scaled; padding rows (past S) are zero, never written out
        m[r] = -np.inf
        s[r] = 0.0
        if r < nr:
            i = r0 + r
            li = min(kv_len[b], i + T - S + 1) if causal else kv_len[b]
            lim[r] = max(0, min(T, li))
            for d in range(D):
                qt[d, r] = q[b, h, i, d] * scale
        else:
            lim[r] = 0
            for d in range(D):
                qt[d, r] = 0.0
    last = 0
    first = T
    for r in range(nr):
        last = max(last, lim[r])
        first = min(first, lim[r])
    acc[:, :] = 0.0
    D4 = D // 4 * 4
    D8 = D // 8 * 8
    for j0 in range(0, last, BC_MG):
        w = min(last, j0 + BC_MG) - j0
        w4 = (w + 3) // 4 * 4
        jl = j0 + w - 1  # keys past the tile are clamped to its last key (their p is set to 0)
        # scores: 4 keys x 4 d per step, each step 16 broadcasts of K and 4 rows of qt, 2 zmm wide
        for jj in range(0, w4, 4):
            ja = j0 + jj
            kra, krb, krc, krd = k[b, hk, ja], k[b, hk, min(ja + 1, jl)], k[b, hk, min(ja + 2, jl)], k[b, hk, min(ja + 3, jl)]
            ya, yb, yc, yd = sT[jj], sT[jj + 1], sT[jj + 2], sT[jj + 3]
            for r in range(BR_MG):
                ya[r] = 0.0
                yb[r] = 0.0
                yc[r] = 0.0
                yd[r] = 0.0
            for d in range(0, D4, 4):
                q0, q1, q2, q3 = qt[d], qt[d + 1], qt[d + 2], qt[d + 3]
                a0, a1, a2, a3 = kra[d], kra[d + 1], kra[d + 2], kra[d + 3]
                b0, b1, b2, b3 = krb[d], krb[d + 1], krb[d + 2], krb[d + 3]
                c0, c1, c2, c3 = krc[d], krc[d + 1], krc[d + 2], krc[d + 3]
                e0, e1, e2, e3 = krd[d], krd[d + 1], krd[d + 2], krd[d + 3]
                for r in range(BR_MG):
                    x0, x1, x2, x3 = q0[r], q1[r], q2[r], q3[r]
                    ya[r] += (a0 * x0 + a1 * x1) + (a2 * x2 + a3 * x3)
                    yb[r] += (b0 * x0 + b1 * x1) + (b2 * x2 + b3 * x3)
                    yc[r] += (c0 * x0 + c1 * x1) + (c2 * x2 + c3 * x3)
                    yd[r] += (e0 * x0 + e1 * x1) + (e2 * x2 + e3 * x3)
            for d in range(D4, D):
                q0 = qt[d]
                a0, b0, c0, e0 = kra[d], krb[d], krc[d], krd[d]
                for r in range(BR_MG):
                    x0 = q0[r]
                    ya[r] += a0 * x0
                    yb[r] += b0 * x0
                    yc[r] += c0 * x0
                    yd[r] += e0 * x0
        if first < j0 + w:  # some row of the block stops inside this tile: -inf past its limit
            for jj in range(w):
                y = sT[jj]
                for r in range(BR_MG):
                    y[r] = -np.inf if j0 + jj >= lim[r] else y[r]
        # online softmax across the 32 rows at once: tile max, exps (cpumath's polynomial), sums, rescale
        for r in range(BR_MG):
            mt[r] = m[r]
            st[r] = 0.0
        for jj in range(w):
            y = sT[jj]
            for r in range(BR_MG):
                mt[r] = y[r] if y[r] > mt[r] else mt[r]
        for r in range(BR_MG):  # a row with no visible key yet keeps max -inf: subtract 0 (p = exp(-inf) = 0)
            mt[r] = mt[r] if mt[r] > -np.inf else np.float32(0.0)
        for jj in range(w):
            y = sT[jj]
            for r in range(BR_MG):
                p = exp_nonpos(y[r] - mt[r])
                y[r] = p
                st[r] += p
        for jj in range(w, w4):
            y = sT[jj]
            for r in range(BR_MG):
                y[r] = 0.0
        for r in range(BR_MG):
            a = exp_nonpos(m[r] - mt[r])  # 0 while m = -inf, 1 when the max did not move
            s[r] = s[r] * a + st[r]
            m[r] = mt[r] if s[r] > 0 else m[r]
            st[r] = a  # (the tile's sum is used: st now holds the rescale factor of each row)
        for d in range(D):
            ar = acc[d]
            for r in range(BR_MG):
                ar[r] *= st[r]
        # acc^T += V^T P^T, acc kept transposed (D x 32 rows): 8 of its rows (16 zmm) stay in registers over the
        # keys of the tile; each key costs 2 loads of P and 8 broadcasts of V for 16 FMAs
        for d in range(0, D8, 8):
            c0, c1, c2, c3 = acc[d], acc[d + 1], acc[d + 2], acc[d + 3]
            c4, c5, c6, c7 = acc[d + 4], acc[d + 5], acc[d + 6], acc[d + 7]
            for jj in range(w):
                vr = v[b, hk, j0 + jj]
                y0, y1, y2, y3, y4, y5, y6, y7 = vr[d], vr[d + 1], vr[d + 2], vr[d + 3], vr[d + 4], vr[d + 5], vr[d + 6], vr[d + 7]
                pj = sT[jj]
                for r in range(BR_MG):
                    x = pj[r]
                    c0[r] += y0 * x
                    c1[r] += y1 * x
                    c2[r] += y2 * x
                    c3[r] += y3 * x
                    c4[r] += y4 * x
                    c5[r] += y5 * x
                    c6[r] += y6 * x
                    c7[r] += y7 * x
        for d in range(D8, D):
            c0 = acc[d]
            for jj in range(w):
                y0 = v[b, hk, j0 + jj, d]
                pj = sT[jj]
                for r in range(BR_MG):
                    c0[r] += y0 * pj[r]
    for r in range(nr):
        i = r0 + r
        if s[r] > 0:
            inv = np.float32(1.0) / s[r]
            for d in range(D):
                o[b, h, i, d] = acc[d, r] * inv
            lse[b, h, i] = m[r] + np.log(s[r])
        else:  # no visible key: O = 0, L = -inf
            for d in range(D):
                o[b, h, i, d] = 0.0
            lse[b, h, i] = -np.inf


@njit(parallel=True, cache=True, error_model="numpy", fastmath=CPU_FAST)
def _microgemm_cpu(o, lse, q, k, v, kv_len, causal, threads):
    B, H, S, D = q.shape
    g = H // k.shape[1]
    nblk = (S + BR_MG - 1) // BR_MG
    npair = (nblk + 1) // 2  # block p and block nblk-1-p in one task: equal causal work in every task
    ntask = B * H * npair
    nt = max(1, min(threads, ntask))
    per = (ntask + nt - 1) // nt  # each thread a contiguous run of tasks, all of the same size
    QT = np.empty((nt, D, BR_MG), dtype=np.float32)  # per thread: Q block transposed, scores, output rows
    ST = np.empty((nt, BC_MG, BR_MG), dtype=np.float32)
    ACC = np.empty((nt, D, BR_MG), dtype=np.float32)
    VEC = np.empty((nt, 4, BR_MG), dtype=np.float32)  # running max, running sum, tile max, tile sum
    LIM = np.empty((nt, BR_MG), dtype=np.int64)
    for th in prange(nt):
        for t in range(th * per, min(ntask, th * per + per)):
            b = t // (H * npair)
            h = (t // npair) % H
            p = t % npair
            _mg_block(o, lse, q, k, v, kv_len, causal, b, h, h // g, p * BR_MG, th, QT, ST, ACC, VEC, LIM)
            if nblk - 1 - p != p:
                _mg_block(o, lse, q, k, v, kv_len, causal, b, h, h // g, (nblk - 1 - p) * BR_MG, th, QT, ST, ACC, VEC,
                          LIM)


@register("attention", "cpu", "microgemm", rung=6)
def attention_microgemm_cpu(o, lse, q, k, v, kv_len, causal):
    """Rung 5 with both tile products as register-blocked micro-GEMMs along contiguous rows, and the causal
    work split evenly. Rung 5 takes each score as a dot product over D (64 floats: 4 zmm) that ends in a
    horizontal sum of vector lanes, and keeps its sums in memory. Here the scores of a tile are stored
    key-major (sT[j, r]) from a transposed, scaled copy of the 32-row Q block: each step of 4 keys x 4 d is 16
    broadcasts of K and 8 zmm loads of Q^T for 32 FMAs into 8 zmm sums that stay in registers (``kernels asm``:
    a loop of 32 zmm FMAs, no load of a sum). The online softmax runs across the 32 rows at once (cpumath's exp,
    16 lanes); P V accumulates the output transposed, 8 of its rows (16 zmm) in registers over the keys of the
    tile, 16 FMAs per key for 2 loads of P and 8 broadcasts of V. The sums stay in registers because the scratch
    arrays are allocated before the prange loop and passed into it: Numba marks the parallel region's array
    arguments noalias, and LLVM then knows a store to a score cannot change Q, K or V. Each task takes a block of
    32 rows near the top of the causal triangle and its mirror near the bottom, so every task does the same
    work, and each thread takes a contiguous run of tasks with its own scratch. Predicted: the tile products
    at ~60 % of the FMA ports' peak (2 per cycle, 16 lanes), ~1.5x rung 5, past torch's flash-attention CPU
    kernel at 1 x 4 x 256 x 256 x 64 with a causal mask (where torch's committed time is about its time
    without the mask, and ours about half). Measured on one core (CPU time, alternating in one process, a
    busy machine): without a mask ~1.3-1.6x rung 5 and ~0.6-0.7x torch; with the causal mask 0.9-1.2x torch."""
    _microgemm_cpu(o, lse, q, k, v, kv_len, causal, get_num_threads())


def _numpy_attention(q, k, v, kv_len, causal):
    g = q.shape[1] // k.shape[1]
    kk = np.repeat(k, g, axis=1) if g > 1 else k
    vv = np.repeat(v, g, axis=1) if g > 1 else v
    sc = np.matmul(q, kk.transpose(0, 1, 3, 2)) * np.float32(1.0 / math.sqrt(q.shape[3]))
    sc = np.where(visible(q.shape[2], k.shape[2], kv_len, causal), sc, np.float32(-np.inf))
    m = sc.max(axis=-1, keepdims=True)
    e = np.exp(sc - m)
    s = e.sum(axis=-1, keepdims=True)
    return np.matmul(e / s, vv), (m + np.log(s))[..., 0]


@register("attention", "cpu", "numpy", baseline=True,
          edge_exempt="the formula a student writes gives 0/0 = NaN on a fully masked row")
def attention_numpy_cpu(o, lse, q, k, v, kv_len, causal):
    """The formula with NumPy in float32: scores by batched matmul (BLAS), a where for the masks, the softmax,
    P V by batched matmul; the S x T scores and probabilities materialized. Results copied into O and L."""
    oo, ll = _numpy_attention(q, k, v, kv_len, causal)
    np.copyto(o, oo)
    np.copyto(lse, ll)


def _torch_mask_cpu(kv_len, S, T, causal):
    """None when SDPA's is_causal flag says it all (no padding; causal only with S = T), else a bool mask."""
    import torch

    if (np.asarray(kv_len) >= T).all() and (not causal or S == T):
        return None
    return torch.from_numpy(visible(S, T, kv_len, causal))


@register("attention", "cpu", "torch", baseline=True, requires=torch_cpu)
def attention_torch_cpu(o, lse, q, k, v, kv_len, causal):
    """torch's CPU attention. Where the shape allows (S = T, as many K/V heads as query heads, full caches: the
    benchmark sizes), its flash-attention CPU kernel, which returns O and L as the course's rungs do (copied
    into o and lse). Otherwise scaled_dot_product_attention with the op's masks and the default scale
    1/sqrt(D); O is copied into o (SDPA has no out=). SDPA does not
    return L, so for ``kernels check`` L is computed with extra torch work (logsumexp of the masked scores)
    and fully masked rows are zeroed; with KERNELS_SDPA_O_ONLY=1 (benchmarks) that extra work is skipped."""
    import torch
    import torch.nn.functional as F

    to, tl, tq, tk, tv = tviews(o, lse, q, k, v)
    S, T = q.shape[2], k.shape[2]
    if S == T and q.shape[1] == k.shape[1] and bool(np.all(kv_len == T)):
        # torch's CPU flash-attention kernel returns O and L (what its training path saves for the backward):
        # the same two outputs as the course's rungs, no mask tensor, no extra work. The benchmark sizes take
        # this path; other shapes (GQA, a shorter cache, S != T with the op's bottom-right causal mask) the one below.
        out, l_ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(tq, tk, tv, 0.0, bool(causal))
        to.copy_(out)
        tl.copy_(l_)
        return
    mask = _torch_mask_cpu(kv_len, S, T, causal)
    out = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask, is_causal=bool(causal) and mask is None,
                                         enable_gqa=q.shape[1] != k.shape[1])
    if O_ONLY:
        to.copy_(out)
        return
    g = q.shape[1] // k.shape[1]
    kk = tk.repeat_interleave(g, dim=1) if g > 1 else tk
    sc = torch.matmul(tq, kk.transpose(-1, -2)) / math.sqrt(q.shape[3])
    vis = torch.from_numpy(visible(S, T, kv_len, causal))
    torch.logsumexp(sc.masked_fill(~vis, -math.inf), dim=-1, out=tl)
    to.copy_(torch.where(torch.isinf(tl)[..., None], 0.0, out))


@njit(cache=True, error_model="numpy", fastmath=FAST_MATH)
def _scores_cpu(sc, q, k, v, kv_len, causal):
    B, H, S, D = q.shape
    T = k.shape[2]
    g = H // k.shape[1]
    scale = np.float32(1.0 / math.sqrt(D))
    for b in range(B):
        for h in range(H):
            for i in range(S):
                lim = min(kv_len[b], i + T - S + 1) if causal else kv_len[b]
                for j in range(T):
                    if j < lim:
                        x = np.float32(0.0)
                        for d in range(D):
                            x += q[b, h, i, d] * k[b, h // g, j, d]
                        sc[b, h, i, j] = x * scale
                    else:
                        sc[b, h, i, j] = -np.inf


@register("attention_scores", "cpu", "loop", rung=1)
def attention_scores_cpu(sc, q, k, v, kv_len, causal):
    """Three loops and a mask test: s_ij = q_i . k_j / sqrt(D), -inf where not visible."""
    _scores_cpu(sc, q, k, v, kv_len, causal)


@njit(parallel=True, cache=True, error_model="numpy", fastmath=FAST_MATH)
def _scores_prange(sc, q, k, v, kv_len, causal):
    B, H, S, D = q.shape
    T = k.shape[2]
    g = H // k.shape[1]
    scale = np.float32(1.0 / math.sqrt(D))
    for bhi in prange(B * H * S):  # one row of scores per iteration
        i = bhi % S
        h = (bhi // S) % H
        b = bhi // (S * H)
        lim = min(kv_len[b], i + T - S + 1) if causal else kv_len[b]
        lim = max(0, min(T, lim))
        for j in range(lim):  # visible keys: a dot product of two contiguous rows (packed FMAs)
            x = np.float32(0.0)
            for d in range(D):
                x += q[b, h, i, d] * k[b, h // g, j, d]
            sc[b, h, i, j] = x * scale
        for j in range(lim, T):  # the masked tail, with no test per element
            sc[b, h, i, j] = -np.inf


@register("attention_scores", "cpu", "prange", rung=2)
def attention_scores_prange(sc, q, k, v, kv_len, causal):
    """Score rows over the cores (issue 36), the visibility test taken out of the inner loop (visible keys,
    then a fill of -inf). The writes of S x T scores dominate; predict >= 70 % of copy from ~58 %."""
    _scores_prange(sc, q, k, v, kv_len, causal)


@njit(parallel=True, cache=True, error_model="numpy")
def _scores_tiles(sc, q, k, kt, kv_len, causal):
    # sc (B,H,S,T); q (B,H,S,D); k (B,Hkv,T,D); kt (B,Hkv,D,T) scratch for K transposed
    B, H, S, D = q.shape
    Hkv, T = k.shape[1], k.shape[2]
    g = H // Hkv
    scale = vsplat16(np.float32(1.0 / math.sqrt(D)))
    for bhd in prange(B * Hkv * D):  # K^T, so that 16 consecutive keys of one dimension are one vector load
        d = bhd % D
        hk = (bhd // D) % Hkv
        b = bhd // (D * Hkv)
        for j in range(T):
            kt[b, hk, d, j] = k[b, hk, j, d]
    nI = (S + 3) // 4
    for task in prange(B * H * nI):  # 4 query rows x 16 keys per tile: 4 sums in zmm registers
        i0 = 4 * (task % nI)
        h = (task // nI) % H
        b = task // (nI * H)
        hk = h // g
        i1, i2, i3 = min(i0 + 1, S - 1), min(i0 + 2, S - 1), min(i0 + 3, S - 1)  # clamped: recomputes row S-1
        jmax = 0
        for i in range(i0, min(i0 + 4, S)):  # the widest visible prefix of the 4 rows
            lim = min(kv_len[b], i + T - S + 1) if causal else kv_len[b]
            jmax = max(jmax, max(0, min(T, lim)))
        q0, q1, q2, q3 = q[b, h, i0], q[b, h, i1], q[b, h, i2], q[b, h, i3]
        for j0 in range(0, jmax - 15, 16):
            a0 = vzero16()
            a1 = vzero16()
            a2 = vzero16()
            a3 = vzero16()
            for d in range(D):
                kv = vload16(kt[b, hk, d], j0)
                a0 = vfma16(vsplat16(q0[d]), kv, a0)
                a1 = vfma16(vsplat16(q1[d]), kv, a1)
                a2 = vfma16(vsplat16(q2[d]), kv, a2)
                a3 = vfma16(vsplat16(q3[d]), kv, a3)
            vstore16(sc[b, h, i0], j0, vmul16(a0, scale))  # a row's masked keys are overwritten below
            vstore16(sc[b, h, i1], j0, vmul16(a1, scale))
            vstore16(sc[b, h, i2], j0, vmul16(a2, scale))
            vstore16(sc[b, h, i3], j0, vmul16(a3, scale))
        jt = jmax - jmax % 16
        for i in range(i0, min(i0 + 4, S)):
            lim = min(kv_len[b], i + T - S + 1) if causal else kv_len[b]
            lim = max(0, min(T, lim))
            for j in range(jt, lim):  # the last keys, fewer than 16: one dot product each
                x = np.float32(0.0)
                for d in range(D):
                    x += q[b, h, i, d] * kt[b, hk, d, j]
                sc[b, h, i, j] = x * np.float32(1.0 / math.sqrt(D))
            for j in range(lim, T):
                sc[b, h, i, j] = -np.inf


@register("attention_scores", "cpu", "tiles", rung=3)
def attention_scores_tiles(sc, q, k, v, kv_len, causal):
    """Score tiles of 4 query rows x 16 keys held in 4 zmm registers (issue 36), K transposed first (in the
    kernel, over the cores) so that one vector load brings 16 keys of one dimension and each FMA, its q value
    broadcast from memory, does 16 scores. `kernels asm` of rung 2 on the AVX-512 machine: its dot product along
    D is vectorized, but then the 16 lanes are folded into one score (vextractf64x4, vextractf128, vshufpd,
    vmovshdup, 4 adds), ~8 instructions of fold per score against its 4 FMAs at D = 64. Here there is no fold:
    1 load and 4 FMAs per dimension for 4 x 16 scores (4 independent sums, so at the FMA's 4-cycle latency
    half the rate of its two ports; a tile of 8 sums spills on AVX2's 16 registers). At the bench size the op
    is compute-bound: 2*S*T*D flops on (S*(T+D) + T*D)*4 bytes per head is ~21 flop/byte, against the
    machine's ~6.6 (numpy.matmul's flop/s over copy bandwidth), so 70 % of copy would take more than
    numpy.matmul's flop/s. Predict ~2x rung 2, ~25 % of copy."""
    kt = np.empty((k.shape[0], k.shape[1], k.shape[3], k.shape[2]), np.float32)
    _scores_tiles(sc, q, k, kt, kv_len, causal)


@njit(parallel=True, cache=True, error_model="numpy", fastmath=FAST_MATH)
def _bwd_cpu(dq, dk, dv, do, q, k, v, o, lse, kv_len, causal, want_dq):
    B, H, S, D = q.shape
    Hkv, T = k.shape[1], k.shape[2]
    g = H // Hkv
    scale = np.float32(1.0 / math.sqrt(D))
    for t in prange(B * Hkv):  # one task per (b, kv head): it owns dK and dV of that head, no races
        b = t // Hkv
        hk = t % Hkv
        for j in range(T):
            for d in range(D):
                dk[b, hk, j, d] = 0.0
                dv[b, hk, j, d] = 0.0
        for h in range(hk * g, (hk + 1) * g):
            for i in range(S):
                dr = np.float32(0.0)
                for d in range(D):
                    dr += do[b, h, i, d] * o[b, h, i, d]
                    if want_dq:
                        dq[b, h, i, d] = 0.0
                li = lse[b, h, i]
                if li == -np.inf:
                    continue
                lim = min(kv_len[b], i + T - S + 1) if causal else kv_len[b]
                for j in range(lim):
                    x = np.float32(0.0)
                    dp = np.float32(0.0)
                    for d in range(D):
                        x += q[b, h, i, d] * k[b, hk, j, d]
                        dp += do[b, h, i, d] * v[b, hk, j, d]
                    p = np.exp(x * scale - li)  # P recomputed from the saved L
                    ds = p * (dp - dr) * scale
                    for d in range(D):
                        dv[b, hk, j, d] += p * do[b, h, i, d]
                        dk[b, hk, j, d] += ds * q[b, h, i, d]
                        if want_dq:
                            dq[b, h, i, d] += ds * k[b, hk, j, d]


@register("attention_bwd", "cpu", "prange", rung=1)
def attention_bwd_cpu(dq, dk, dv, do, q, k, v, o, lse, kv_len, causal):
    """One pass over the visible (i, j) pairs per (b, kv head) task: P recomputed from L, then dV, dK
    and dQ accumulated. Tasks own disjoint outputs, so prange needs no atomics."""
    _bwd_cpu(dq, dk, dv, do, q, k, v, o, lse, kv_len, causal, True)


@register("attention_bwd_dv", "cpu", "prange", rung=1)
def attention_bwd_dv_cpu(dv, do, q, k, v, o, lse, kv_len, causal):
    """The dV part of the backward: dV_j = sum_i exp(s_ij - L_i) dO_i, over the group's heads."""
    dk = np.empty_like(dv)
    _bwd_cpu(dk, dk, dv, do, q, k, v, o, lse, kv_len, causal, False)
