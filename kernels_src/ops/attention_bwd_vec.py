"""Attention backward on the GPU, rung 2 (chapter 9): rung 1's three kernels written like forward rungs 6-7.
"""
from __future__ import annotations
import math
import numpy as np

from ..compiler import cuda, float32, load4, store4
from .. import device
from ..device import ceil_div
from ..registry import register
from .reductions import FAST_MATH, NEG_INF, ZERO
from .softmax import _aligned16
from .attention_flash2 import FLASH2_REGS, SMEM_ALIGN
from .attention_bwd import SIG_BWD_PRE, SIG_DKDV, SIG_DQ, _scratch, attention_bwd_flash2, attention_bwd_pre_kernel
from .attention_fwd import SMEM_LIMIT, _cached


# ------------------------------------------------------------------ GPU backward rung 2: the same rewrite
# Rung 1's kernels compute each score as a dot product read one float at a time from shared memory (two
# 4-byte loads per FMA), with 64-bit index arithmetic, loops that are not unrolled and masks on every pair.
# Rung 2 keeps its two kernels and its pre-pass and changes how the work is written down, as rungs 6-7 of the
# forward did:
#   - each kernel has two kinds of product. The score products S = Q K^T and dP = dO V^T contract over d,
#     so a thread reads 4 consecutive d of its rows and keys with one 16-byte load (load4) of the natural
#     [row, d] layout; the accumulations dV += P^T dO, dK += dS^T Q and dQ += dS K contract over rows or
#     keys, so a thread reads 4 consecutive keys (or rows) of P or dS and 4 consecutive columns of dO, Q or K.
#     P and dS are stored [query, key] in the dK/dV kernel and transposed, dST[key, query], in the dQ kernel:
#     then every operand of every inner product is one 16-byte shared load per 4 values. (Why not the
#     forward's transposed QT, KT: here Q and dO each feed one product over d and one over rows, so they would
#     be needed in both layouts, two copies that do not fit in 48 KiB. A load of 4 consecutive d costs the
#     same loads per FMA as a load of 4 consecutive rows.);
#   - Q, dO, K and V rows are padded to D + 4 floats: the 8 lanes of a quarter-warp that load 8 consecutive
#     rows at the same d hit 8 different 16-byte bank groups;
#   - in the score products a thread owns rows ty + NTY*r and keys tx + NTX*c (interleaved, so neighbouring
#     lanes read neighbouring rows); in the accumulations it owns 4 consecutive keys (or rows) x 4 columns;
#   - Q is not pre-scaled (forward rungs 6-7 do pre-scale it): s = fl(q.k) * scale is the same rounding as
#     rung 1's, and at logits of 1e4 (the edge inputs, D = 128) a pre-scaled Q moved s by ~1 ulp of 1e4 and
#     dK past the 5e-3 tolerance; the multiply costs one instruction per score;
#   - a row with no visible key (L = -inf) and a row past S get L = +inf (in shared memory or registers):
#     exp(s - L) = 0 without a test; only tiles that cross the causal diagonal or kv_len evaluate the mask,
#     and tiles with no visible pair are never visited (a key block past kv_len writes zeros, looping over
#     nothing);
#   - constant trip counts: the score loops do one group of 4 d (64 FMAs at D = 64) per iteration, the
#     accumulation loops are unrolled by UN = 4; launch bounds for 4 blocks of 128 threads (<= 128 registers);
#     16-byte global loads and stores (rows of D floats, D a multiple of 4, arrays 16-byte aligned).
BWD2_THREADS = 128
# per head size: (dK/dV kernel: BR queries x BC keys, NTX threads along keys in the score product),
#                (dQ kernel:    BR queries x BC keys, NTX).  The side whose outputs a block owns (BC for dK/dV,
# BR for dQ) is 2048 / D: 128 threads x (4 keys or rows x 4 columns) cover it x D. The other side is what fits
# in 48 KiB of static shared memory with <= 16 scores per thread (more spill at 128 registers).
BWD2_CFG = {16: (dict(BR=16, BC=128, NTX=32), dict(BR=128, BC=8, NTX=8)),
            32: (dict(BR=32, BC=64, NTX=16), dict(BR=64, BC=16, NTX=8)),
            64: (dict(BR=32, BC=32, NTX=16), dict(BR=32, BC=32, NTX=8)),
            128: (dict(BR=16, BC=16, NTX=8), dict(BR=16, BC=16, NTX=8))}


def _bwd2_layout(D, BR, BC, NTX, own):
    """Shared by both kernels: the score product's thread grid and the accumulation's. ``own`` is the tile
    side (keys for dK/dV, queries for dQ) whose 4-wide groups a thread owns in the accumulation."""
    NT = BWD2_THREADS
    NTY = NT // NTX
    D4 = D // 4
    NCX = 4 * NT // own  # accumulation: NT // (own / 4) threads side by side along the columns
    assert NTX * NTY == NT and BR % NTY == 0 and BC % NTX == 0 and NTX % 8 == 0, (BR, BC, NTX)
    assert D % 4 == 0 and own % 4 == 0 and (4 * NT) % own == 0 and D4 % NCX == 0, (D, own)
    return NT, NTY, BR // NTY, BC // NTX, D4, NCX, D4 // NCX


def _bwd2_opts(NT, minblocks):
    opts = {"fastmath": FAST_MATH}
    if not device.SIMULATED:
        opts["launch_bounds"] = (NT, minblocks or max(1, FLASH2_REGS // NT))
    return opts


def make_dkdv2_kernel(D, BR, BC, NTX, unroll=4, minblocks=None):
    """dK/dV kernel of backward rung 2: a block owns BC keys of (b, kv head) and walks the query tiles (of
    every head of the group) that see them. Score product: thread (ty, tx) computes s and dP for rows
    ty + NTY*r and keys tx + NTX*c. Accumulation: thread (kx, cx) owns dK, dV of keys 4*kx + u and columns
    4*(cx + NCX*p) + e."""
    NT, NTY, TM, TN, D4, NCX, CG = _bwd2_layout(D, BR, BC, NTX, own=BC)
    UN = unroll
    assert BR % UN == 0 and BR <= NT
    DP4 = D4 + 1  # padded rows of Q, dO, K, V: D + 4 floats
    CG4 = 4 * CG  # columns of dK (dV) per thread
    BCP4 = BC // 4 + 1  # padded rows of P and dS: BC + 4 floats
    NQ, NK, NP = BR * DP4 * 4, BC * DP4 * 4, BR * BCP4 * 4  # shared-array sizes must be plain constants
    LQ = ceil_div(BR * D4, NT)
    LK = ceil_div(BC * D4, NT)
    smem = 4 * (2 * NQ + 2 * NK + 2 * NP + 2 * BR)
    if smem > SMEM_LIMIT:
        raise ValueError(f"dK/dV tiles BR={BR} BC={BC} at D={D} need {smem} bytes of shared memory")
    scale = np.float32(1.0 / math.sqrt(D))
    align = SMEM_ALIGN
    POS_INF = np.float32(np.inf)

    @cuda.jit(**_bwd2_opts(NT, minblocks))
    def attention_dkdv2_kernel(dk, dv, do, q, k, v, lse, dr, kv_len, causal):
        tid = cuda.threadIdx.x & (NT - 1)
        ty = tid // NTX
        tx = tid % NTX
        kx = tid // NCX
        cx = tid % NCX
        Hkv, T = k.shape[1], k.shape[2]
        H, S = q.shape[1], q.shape[2]
        g = H // Hkv
        bhk = cuda.blockIdx.x  # (b, kv head) fastest: every head's first key block (the longest, causal) first
        b = bhk // Hkv
        hk = bhk % Hkv
        j0 = cuda.blockIdx.y * BC
        Ks = cuda.shared.array(NK, float32, alignment=align)  # Ks[key * (D + 4) + d]
        Vs = cuda.shared.array(NK, float32, alignment=align)
        Qs = cuda.shared.array(NQ, float32, alignment=align)  # Qs[row * (D + 4) + d]
        dOs = cuda.shared.array(NQ, float32, alignment=align)
        Ps = cuda.shared.array(NP, float32, alignment=align)  # Ps[row * (BC + 4) + key]
        dSs = cuda.shared.array(NP, float32, alignment=align)
        Ls = cuda.shared.array(BR, float32)
        Ds = cuda.shared.array(BR, float32)
        sacc = cuda.local.array((TM, TN), float32)
        pacc = cuda.local.array((TM, TN), float32)
        qa = cuda.local.array((TM, 4), float32)
        oa = cuda.local.array((TM, 4), float32)
        kb = cuda.local.array((TN, 4), float32)
        vb = cuda.local.array((TN, 4), float32)
        adk = cuda.local.array((4, CG4), float32)
        adv = cuda.local.array((4, CG4), float32)
        kvrow0 = (b * Hkv + hk) * T * D4  # 16-byte groups: k[b, hk, 0, 0]
        for e in range(LK):  # the block's K and V tiles, loaded once
            gi = tid + e * NT
            if gi < BC * D4:
                r = gi // D4
                d4 = gi % D4
                x0 = x1 = x2 = x3 = y0 = y1 = y2 = y3 = ZERO
                if j0 + r < T:
                    x0, x1, x2, x3 = load4(k, kvrow0 + (j0 + r) * D4 + d4)
                    y0, y1, y2, y3 = load4(v, kvrow0 + (j0 + r) * D4 + d4)
                store4(Ks, r * DP4 + d4, x0, x1, x2, x3)
                store4(Vs, r * DP4 + d4, y0, y1, y2, y3)
        for u in range(4):
            for c in range(CG4):
                adk[u, c] = ZERO
                adv[u, c] = ZERO
        off = T - S
        jlim = min(kv_len[b], T)  # keys >= jlim do not exist
        istart = 0
        if causal:
            istart = max(0, j0 - off)  # query i sees key j0 only if i >= j0 - (T - S)
        if j0 >= jlim:
            istart = S  # no key of this block exists: dK = dV = 0
        kmask = j0 + BC > jlim  # some keys of the block are padding: every tile needs the mask
        ifull = j0 + BC - 1 - off  # causal: a query tile starting here or later sees every key of the block
        for h in range(hk * g, (hk + 1) * g):
            qrow0 = (b * H + h) * S * D4
            for i0 in range((istart // BR) * BR, S, BR):
                cuda.syncthreads()  # everyone is done with the previous Q, dO, P and dS tiles
                for e in range(LQ):
                    gi = tid + e * NT
                    if gi < BR * D4:
                        r = gi // D4
                        d4 = gi % D4
                        x0 = x1 = x2 = x3 = y0 = y1 = y2 = y3 = ZERO
                        if i0 + r < S:
                            x0, x1, x2, x3 = load4(q, qrow0 + (i0 + r) * D4 + d4)
                            y0, y1, y2, y3 = load4(do, qrow0 + (i0 + r) * D4 + d4)
                        store4(Qs, r * DP4 + d4, x0, x1, x2, x3)
                        store4(dOs, r * DP4 + d4, y0, y1, y2, y3)
                if tid < BR:
                    lv = POS_INF  # rows past S and rows that see no key: exp(s - inf) = 0
                    dv_ = ZERO
                    if i0 + tid < S:
                        lv = lse[b, h, i0 + tid]
                        dv_ = dr[b, h, i0 + tid]
                        if lv == NEG_INF:
                            lv = POS_INF
                    Ls[tid] = lv
                    Ds[tid] = dv_
                cuda.syncthreads()
                for r in range(TM):
                    for c in range(TN):
                        sacc[r, c] = ZERO
                        pacc[r, c] = ZERO
                for d4 in range(D4):  # s = Q K^T (scaled later), dP = dO V^T: 2(TM + TN) loads for 8 TM TN FMAs
                    for r in range(TM):
                        qa[r, 0], qa[r, 1], qa[r, 2], qa[r, 3] = load4(Qs, (ty + NTY * r) * DP4 + d4)
                        oa[r, 0], oa[r, 1], oa[r, 2], oa[r, 3] = load4(dOs, (ty + NTY * r) * DP4 + d4)
                    for c in range(TN):
                        kb[c, 0], kb[c, 1], kb[c, 2], kb[c, 3] = load4(Ks, (tx + NTX * c) * DP4 + d4)
                        vb[c, 0], vb[c, 1], vb[c, 2], vb[c, 3] = load4(Vs, (tx + NTX * c) * DP4 + d4)
                    for r in range(TM):
                        for c in range(TN):
                            for e in range(4):
                                sacc[r, c] += qa[r, e] * kb[c, e]
                                pacc[r, c] += oa[r, e] * vb[c, e]
                if kmask or (causal and i0 < ifull):  # a tile on the diagonal or past kv_len: mask
                    for r in range(TM):
                        lim = jlim
                        if causal:
                            lim = min(lim, i0 + ty + NTY * r + off + 1)
                        for c in range(TN):
                            if j0 + tx + NTX * c >= lim:
                                sacc[r, c] = NEG_INF
                for r in range(TM):  # P = exp(s - L), dS = P (dP - Dr), stored [row, key]
                    lv = Ls[ty + NTY * r]
                    dv_ = Ds[ty + NTY * r]
                    for c in range(TN):
                        pv = math.exp(sacc[r, c] * scale - lv)
                        Ps[(ty + NTY * r) * (4 * BCP4) + tx + NTX * c] = pv
                        dSs[(ty + NTY * r) * (4 * BCP4) + tx + NTX * c] = pv * (pacc[r, c] - dv_)
                cuda.syncthreads()
                for i in range(0, BR, UN):  # dV += P^T dO, dK += dS^T Q: (2 + 2 CG) loads for 32 CG FMAs
                    for u in range(UN):
                        ii = i + u
                        p0, p1, p2, p3 = load4(Ps, ii * BCP4 + kx)
                        s0, s1, s2, s3 = load4(dSs, ii * BCP4 + kx)
                        for p in range(CG):
                            o0, o1, o2, o3 = load4(dOs, ii * DP4 + cx + NCX * p)
                            a0, a1, a2, a3 = load4(Qs, ii * DP4 + cx + NCX * p)
                            adv[0, 4 * p] += p0 * o0
                            adv[0, 4 * p + 1] += p0 * o1
                            adv[0, 4 * p + 2] += p0 * o2
                            adv[0, 4 * p + 3] += p0 * o3
                            adv[1, 4 * p] += p1 * o0
                            adv[1, 4 * p + 1] += p1 * o1
                            adv[1, 4 * p + 2] += p1 * o2
                            adv[1, 4 * p + 3] += p1 * o3
                            adv[2, 4 * p] += p2 * o0
                            adv[2, 4 * p + 1] += p2 * o1
                            adv[2, 4 * p + 2] += p2 * o2
                            adv[2, 4 * p + 3] += p2 * o3
                            adv[3, 4 * p] += p3 * o0
                            adv[3, 4 * p + 1] += p3 * o1
                            adv[3, 4 * p + 2] += p3 * o2
                            adv[3, 4 * p + 3] += p3 * o3
                            adk[0, 4 * p] += s0 * a0
                            adk[0, 4 * p + 1] += s0 * a1
                            adk[0, 4 * p + 2] += s0 * a2
                            adk[0, 4 * p + 3] += s0 * a3
                            adk[1, 4 * p] += s1 * a0
                            adk[1, 4 * p + 1] += s1 * a1
                            adk[1, 4 * p + 2] += s1 * a2
                            adk[1, 4 * p + 3] += s1 * a3
                            adk[2, 4 * p] += s2 * a0
                            adk[2, 4 * p + 1] += s2 * a1
                            adk[2, 4 * p + 2] += s2 * a2
                            adk[2, 4 * p + 3] += s2 * a3
                            adk[3, 4 * p] += s3 * a0
                            adk[3, 4 * p + 1] += s3 * a1
                            adk[3, 4 * p + 2] += s3 * a2
                            adk[3, 4 * p + 3] += s3 * a3
        for u in range(4):
            j = j0 + 4 * kx + u
            if j < T:
                for p in range(CG):
                    gi = kvrow0 + j * D4 + cx + NCX * p
                    store4(dv, gi, adv[u, 4 * p], adv[u, 4 * p + 1], adv[u, 4 * p + 2], adv[u, 4 * p + 3])
                    store4(dk, gi, adk[u, 4 * p] * scale, adk[u, 4 * p + 1] * scale, adk[u, 4 * p + 2] * scale,
                           adk[u, 4 * p + 3] * scale)

    def launch(dk, dv, do, q, k, v, lse, dr, kv_len, causal):
        B, Hkv, T, _ = k.shape
        attention_dkdv2_kernel[(B * Hkv, ceil_div(T, BC)), NT](dk, dv, do, q, k, v, lse, dr, kv_len, causal)

    launch.kernel = attention_dkdv2_kernel
    launch.config = dict(D=D, BR=BR, BC=BC, NTX=NTX, threads=NT, unroll=UN, smem_bytes=smem,
                         minblocks=minblocks or max(1, FLASH2_REGS // NT))
    return launch


def make_dq2_kernel(D, BR, BC, NTX, unroll=4, minblocks=None):
    """dQ kernel of backward rung 2: a block owns BR queries of (b, h) and walks the key tiles they see.
    Score product as in the dK/dV kernel; dS is stored transposed, dST[key, row], so that the accumulation
    dQ += dS K reads 4 rows of one key with one load. Accumulation: thread (rx, cx) owns dQ of rows
    4*rx + u and columns 4*(cx + NCX*p) + e."""
    NT, NTY, TM, TN, D4, NCX, CG = _bwd2_layout(D, BR, BC, NTX, own=BR)
    UN = unroll
    assert BC % UN == 0
    DP4 = D4 + 1
    CG4 = 4 * CG  # columns of dQ per thread
    BRP4 = BR // 4 + 1  # padded rows of dST: BR + 4 floats
    NQ, NK, NS = BR * DP4 * 4, BC * DP4 * 4, BC * BRP4 * 4
    LQ = ceil_div(BR * D4, NT)
    LK = ceil_div(BC * D4, NT)
    smem = 4 * (2 * NQ + 2 * NK + NS)
    if smem > SMEM_LIMIT:
        raise ValueError(f"dQ tiles BR={BR} BC={BC} at D={D} need {smem} bytes of shared memory")
    scale = np.float32(1.0 / math.sqrt(D))
    align = SMEM_ALIGN
    POS_INF = np.float32(np.inf)

    @cuda.jit(**_bwd2_opts(NT, minblocks))
    def attention_dq2_kernel(dq, do, q, k, v, lse, dr, kv_len, causal):
        tid = cuda.threadIdx.x & (NT - 1)
        ty = tid // NTX
        tx = tid % NTX
        rx = tid // NCX
        cx = tid % NCX
        H, S = q.shape[1], q.shape[2]
        Hkv, T = k.shape[1], k.shape[2]
        bh = cuda.blockIdx.x
        b = bh // H
        h = bh % H
        hk = h // (H // Hkv)
        blk = cuda.blockIdx.y
        if causal:  # the last query blocks see the most keys: start them first
            blk = cuda.gridDim.y - 1 - blk
        i0 = blk * BR
        Qs = cuda.shared.array(NQ, float32, alignment=align)  # Qs[row * (D + 4) + d]
        dOs = cuda.shared.array(NQ, float32, alignment=align)
        Ks = cuda.shared.array(NK, float32, alignment=align)  # Ks[key * (D + 4) + d]
        Vs = cuda.shared.array(NK, float32, alignment=align)
        dST = cuda.shared.array(NS, float32, alignment=align)  # dST[key * (BR + 4) + row]
        sacc = cuda.local.array((TM, TN), float32)
        pacc = cuda.local.array((TM, TN), float32)
        qa = cuda.local.array((TM, 4), float32)
        oa = cuda.local.array((TM, 4), float32)
        kb = cuda.local.array((TN, 4), float32)
        vb = cuda.local.array((TN, 4), float32)
        lrow = cuda.local.array(TM, float32)
        drow = cuda.local.array(TM, float32)
        adq = cuda.local.array((4, CG4), float32)
        qrow0 = (bh * S + i0) * D4  # 16-byte groups: q[b, h, i0, 0]
        for e in range(LQ):  # the block's Q and dO tiles, loaded once
            gi = tid + e * NT
            if gi < BR * D4:
                r = gi // D4
                d4 = gi % D4
                x0 = x1 = x2 = x3 = y0 = y1 = y2 = y3 = ZERO
                if i0 + r < S:
                    x0, x1, x2, x3 = load4(q, qrow0 + r * D4 + d4)
                    y0, y1, y2, y3 = load4(do, qrow0 + r * D4 + d4)
                store4(Qs, r * DP4 + d4, x0, x1, x2, x3)
                store4(dOs, r * DP4 + d4, y0, y1, y2, y3)
        for r in range(TM):  # this thread's rows' L and Dr, in registers for the whole loop
            i = i0 + ty + NTY * r
            lv = POS_INF  # rows past S and rows that see no key: exp(s - inf) = 0
            dv_ = ZERO
            if i < S:
                lv = lse[b, h, i]
                dv_ = dr[b, h, i]
                if lv == NEG_INF:
                    lv = POS_INF
            lrow[r] = lv
            drow[r] = dv_
        for u in range(4):
            for c in range(CG4):
                adq[u, c] = ZERO
        off = T - S
        jlim = min(kv_len[b], T)
        jend = jlim
        if causal:
            jend = min(jend, i0 + BR + off)  # the block's last row sees keys j <= i0 + BR - 1 + off
        jfull = jlim  # keys below this are visible to every row of the block ...
        if causal:
            jfull = min(jfull, i0 + off + 1)  # ... the first row's causal limit included
        kvrow0 = (b * Hkv + hk) * T * D4
        for t in range((max(jend, 0) + BC - 1) // BC):
            j0 = t * BC
            cuda.syncthreads()  # everyone is done with the previous K, V and dST tiles
            for e in range(LK):
                gi = tid + e * NT
                if gi < BC * D4:
                    r = gi // D4
                    d4 = gi % D4
                    x0 = x1 = x2 = x3 = y0 = y1 = y2 = y3 = ZERO
                    if j0 + r < T:
                        x0, x1, x2, x3 = load4(k, kvrow0 + (j0 + r) * D4 + d4)
                        y0, y1, y2, y3 = load4(v, kvrow0 + (j0 + r) * D4 + d4)
                    store4(Ks, r * DP4 + d4, x0, x1, x2, x3)
                    store4(Vs, r * DP4 + d4, y0, y1, y2, y3)
            cuda.syncthreads()
            for r in range(TM):
                for c in range(TN):
                    sacc[r, c] = ZERO
                    pacc[r, c] = ZERO
            for d4 in range(D4):  # s = Q K^T (scaled later), dP = dO V^T
                for r in range(TM):
                    qa[r, 0], qa[r, 1], qa[r, 2], qa[r, 3] = load4(Qs, (ty + NTY * r) * DP4 + d4)
                    oa[r, 0], oa[r, 1], oa[r, 2], oa[r, 3] = load4(dOs, (ty + NTY * r) * DP4 + d4)
                for c in range(TN):
                    kb[c, 0], kb[c, 1], kb[c, 2], kb[c, 3] = load4(Ks, (tx + NTX * c) * DP4 + d4)
                    vb[c, 0], vb[c, 1], vb[c, 2], vb[c, 3] = load4(Vs, (tx + NTX * c) * DP4 + d4)
                for r in range(TM):
                    for c in range(TN):
                        for e in range(4):
                            sacc[r, c] += qa[r, e] * kb[c, e]
                            pacc[r, c] += oa[r, e] * vb[c, e]
            if j0 + BC > jfull:  # a tile on the diagonal or past kv_len: mask
                for r in range(TM):
                    lim = jlim
                    if causal:
                        lim = min(lim, i0 + ty + NTY * r + off + 1)
                    for c in range(TN):
                        if j0 + tx + NTX * c >= lim:
                            sacc[r, c] = NEG_INF
            for r in range(TM):  # dS = exp(s - L) (dP - Dr), stored transposed [key, row]
                for c in range(TN):
                    dST[(tx + NTX * c) * (4 * BRP4) + ty + NTY * r] = (
                        math.exp(sacc[r, c] * scale - lrow[r]) * (pacc[r, c] - drow[r]))
            cuda.syncthreads()
            for j in range(0, BC, UN):  # dQ += dS K: (1 + CG) loads for 16 CG FMAs
                for u in range(UN):
                    jj = j + u
                    s0, s1, s2, s3 = load4(dST, jj * BRP4 + rx)
                    for p in range(CG):
                        a0, a1, a2, a3 = load4(Ks, jj * DP4 + cx + NCX * p)
                        adq[0, 4 * p] += s0 * a0
                        adq[0, 4 * p + 1] += s0 * a1
                        adq[0, 4 * p + 2] += s0 * a2
                        adq[0, 4 * p + 3] += s0 * a3
                        adq[1, 4 * p] += s1 * a0
                        adq[1, 4 * p + 1] += s1 * a1
                        adq[1, 4 * p + 2] += s1 * a2
                        adq[1, 4 * p + 3] += s1 * a3
                        adq[2, 4 * p] += s2 * a0
                        adq[2, 4 * p + 1] += s2 * a1
                        adq[2, 4 * p + 2] += s2 * a2
                        adq[2, 4 * p + 3] += s2 * a3
                        adq[3, 4 * p] += s3 * a0
                        adq[3, 4 * p + 1] += s3 * a1
                        adq[3, 4 * p + 2] += s3 * a2
                        adq[3, 4 * p + 3] += s3 * a3
        for u in range(4):
            if i0 + 4 * rx + u < S:
                for p in range(CG):
                    store4(dq, qrow0 + (4 * rx + u) * D4 + cx + NCX * p, adq[u, 4 * p] * scale,
                           adq[u, 4 * p + 1] * scale, adq[u, 4 * p + 2] * scale, adq[u, 4 * p + 3] * scale)

    def launch(dq, do, q, k, v, lse, dr, kv_len, causal):
        B, H, S, _ = q.shape
        attention_dq2_kernel[(B * H, ceil_div(S, BR)), NT](dq, do, q, k, v, lse, dr, kv_len, causal)

    launch.kernel = attention_dq2_kernel
    launch.config = dict(D=D, BR=BR, BC=BC, NTX=NTX, threads=NT, unroll=UN, smem_bytes=smem,
                         minblocks=minblocks or max(1, FLASH2_REGS // NT))
    return launch


def dkdv2(D, **cfg):
    cfg = cfg or BWD2_CFG[D][0]
    return _cached(("dkdv2", D) + tuple(sorted(cfg.items())), lambda: make_dkdv2_kernel(D, **cfg))


def dq2(D, **cfg):
    cfg = cfg or BWD2_CFG[D][1]
    return _cached(("dq2", D) + tuple(sorted(cfg.items())), lambda: make_dq2_kernel(D, **cfg))


def bwd2(dq, dk, dv, do, q, k, v, o, lse, kv_len, causal, dkdv_cfg=None, dq_cfg=None):
    """Backward rung 2 with the given tiles (None: BWD2_CFG): the pre-pass, then the two kernels."""
    B, H, S, D = q.shape
    dr = _scratch("dr", (B, H, S))
    attention_bwd_pre_kernel[ceil_div(B * H * S, 128), 128](dr, do, o)
    dkdv2(D, **(dkdv_cfg or {}))(dk, dv, do, q, k, v, lse, dr, kv_len, causal)
    dq2(D, **(dq_cfg or {}))(dq, do, q, k, v, lse, dr, kv_len, causal)


@register("attention_bwd", "gpu", "flash2_vec", rung=2,
          ptx=[(attention_bwd_pre_kernel, SIG_BWD_PRE), (dkdv2(64).kernel, SIG_DKDV), (dq2(64).kernel, SIG_DQ),
               (dkdv2(128).kernel, SIG_DKDV), (dq2(128).kernel, SIG_DQ)])
def attention_bwd_flash2_vec(dq, dk, dv, do, q, k, v, o, lse, kv_len, causal):
    """Rung 1's two kernels rewritten like forward rungs 6-7: 16-byte shared loads in every inner product
    (natural [row, d] tiles padded to D + 4 for the score products, dS transposed for dQ), flat indices,
    unrolled constant-trip loops, 128-thread blocks at <= 128 registers, masks only on diagonal/kv_len tiles,
    invisible tiles skipped in both kernels, 16-byte global loads and stores. Still no atomics: bitwise
    reproducible.

    At D = 64 (32 x 32 tiles) a thread of the score product does 64 FMAs per 12 16-byte loads (rung 1: 2
    4-byte loads per FMA) and the accumulations 32 FMAs per 4 loads (dK/dV) and 16 per 2 (dQ); compiled
    for sm_90, 128 registers, no spills, FFMA 70 % (score loops) to 75-82 % (accumulations) of the inner
    loops' instructions. Prediction at B4 H16 S=T=2048 D64: the 14D FLOPs per pair (3.5x the forward's 4D)
    at about forward rung 6's FFMA rate (2.36 ms) take ~8-9 ms non-causal, ~4x rung 1 but only ~0.65-0.7x
    SDPA math (5.74 ms): 48 KiB of static shared memory allows 32 x 32 tiles, so more per-tile overhead
    (loads, barriers, exps) per FMA than rung 6's 64-row tiles. Causal: half the tiles, ~4.5 ms (>= 1.2x
    SDPA math, which does the full S x T). D = 128 gets 16 x 16 tiles and 2 scores per thread: slower."""
    D = q.shape[3]
    if D % 16 or D not in BWD2_CFG or not _aligned16(dq, dk, dv, do, q, k, v):
        attention_bwd_flash2(dq, dk, dv, do, q, k, v, o, lse, kv_len, causal)  # rung 1 takes the rest
        return
    bwd2(dq, dk, dv, do, q, k, v, o, lse, kv_len, causal)
