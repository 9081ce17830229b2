"""Attention backward on the GPU, rung 1 (chapter 9): a pre-pass (Dr = rowsum(dO * O)), a kernel per key tile
for dK and dV, a kernel per query tile for dQ; no atomics, so the result is bitwise reproducible. Also
attention_bwd_dv's gpu/flash2 (dV alone, an exercise).
"""
from __future__ import annotations
import math
import numpy as np

from ..compiler import cuda, float32
from ..device import ceil_div
from ..registry import register
from .reductions import NEG_INF, ZERO
from .attention_fwd import _cache, _cached, _jit


# ------------------------------------------------------------------------------- GPU: backward
SIG_BWD_PRE = "void(float32[:, :, ::1], float32[:, :, :, ::1], float32[:, :, :, ::1])"
SIG_DKDV = ("void(float32[:, :, :, ::1], float32[:, :, :, ::1], float32[:, :, :, ::1], float32[:, :, :, ::1], "
            "float32[:, :, :, ::1], float32[:, :, :, ::1], float32[:, :, ::1], float32[:, :, ::1], int32[::1], int64)")
SIG_DQ = ("void(float32[:, :, :, ::1], float32[:, :, :, ::1], float32[:, :, :, ::1], float32[:, :, :, ::1], "
          "float32[:, :, :, ::1], float32[:, :, ::1], float32[:, :, ::1], int32[::1], int64)")


@_jit(128)
def attention_bwd_pre_kernel(dr, do, o):
    # dO, O (B,H,S,D) -> Dr (B,H,S) = rowsum(dO * O): one thread per row
    r = cuda.grid(1)
    H, S, D = o.shape[1], o.shape[2], o.shape[3]
    if r < o.shape[0] * H * S:
        b = r // (H * S)
        h = (r // S) % H
        i = r % S
        x = ZERO
        for d in range(D):
            x += do[b, h, i, d] * o[b, h, i, d]
        dr[b, h, i] = x


PARTS = 4  # threads per key (dK/dV kernel) or per query row (dQ kernel), each owning D/4 columns


def _bwd_tiles(D):
    return (32, 32) if D <= 64 else (16, 16)


def make_dkdv_kernel(D, BR, BC, want_dk=True):
    NT = BC * PARTS
    DC = ceil_div(D, PARTS)
    DP = D + 1
    BCP = BC + 1
    E = ceil_div(BR * BC, NT)
    LQ = ceil_div(BR * D, NT)
    LK = ceil_div(BC * D, NT)
    scale = np.float32(1.0 / math.sqrt(D))

    @_jit(NT)
    def attention_dkdv_kernel(dk, dv, do, q, k, v, lse, dr, kv_len, causal):
        # block = BC keys of (b, kv head); loops over the g query heads of the group and every query
        # tile that can see these keys; thread (jj, part) owns dK, dV[j0 + jj, part + PARTS*c]
        tid = cuda.threadIdx.x & (NT - 1)
        jj = tid // PARTS
        part = tid % PARTS
        Hkv, T = k.shape[1], k.shape[2]
        H, S = q.shape[1], q.shape[2]
        g = H // Hkv
        b = cuda.blockIdx.y // Hkv
        hk = cuda.blockIdx.y % Hkv
        j0 = cuda.blockIdx.x * BC
        Ks = cuda.shared.array((BC, DP), float32)
        Vs = cuda.shared.array((BC, DP), float32)
        Qs = cuda.shared.array((BR, DP), float32)
        dOs = cuda.shared.array((BR, DP), float32)
        Ps = cuda.shared.array((BR, BCP), float32)
        dSs = cuda.shared.array((BR, BCP), float32)
        Ls = cuda.shared.array(BR, float32)
        Ds = cuda.shared.array(BR, float32)
        adk = cuda.local.array(DC, float32)
        adv = cuda.local.array(DC, float32)
        for c in range(DC):
            adk[c] = ZERO
            adv[c] = ZERO
        for e in range(LK):
            x = tid + e * NT
            if x < BC * D:
                r = x // D
                c = x % D
                inside = j0 + r < T
                Ks[r, c] = k[b, hk, j0 + r, c] if inside else ZERO
                Vs[r, c] = v[b, hk, j0 + r, c] if inside else ZERO
        kv = kv_len[b]
        off = T - S
        istart = 0
        if causal:
            istart = max(0, j0 - off)  # query i sees key j0 only if i >= j0 - (T - S)
        for h in range(hk * g, (hk + 1) * g):
            for i0 in range((istart // BR) * BR, S, BR):
                cuda.syncthreads()
                for e in range(LQ):
                    x = tid + e * NT
                    if x < BR * D:
                        r = x // D
                        c = x % D
                        inside = i0 + r < S
                        Qs[r, c] = q[b, h, i0 + r, c] if inside else ZERO
                        dOs[r, c] = do[b, h, i0 + r, c] if inside else ZERO
                for r in range(tid, BR, NT):
                    inside = i0 + r < S
                    Ls[r] = lse[b, h, i0 + r] if inside else NEG_INF
                    Ds[r] = dr[b, h, i0 + r] if inside else ZERO
                cuda.syncthreads()
                for e in range(E):  # recompute P, then dS, for BR x BC pairs
                    x = tid + e * NT
                    if x < BR * BC:
                        r = x // BC
                        c = x % BC
                        s = ZERO
                        dp = ZERO
                        for d in range(D):
                            s += Qs[r, d] * Ks[c, d]
                            dp += dOs[r, d] * Vs[c, d]
                        lim = kv
                        if causal:
                            lim = min(lim, i0 + r + off + 1)
                        p = ZERO
                        if j0 + c < lim and Ls[r] != NEG_INF:
                            p = math.exp(s * scale - Ls[r])
                        Ps[r, c] = p
                        dSs[r, c] = p * (dp - Ds[r])
                cuda.syncthreads()
                for r in range(BR):
                    p = Ps[r, jj]
                    ds = dSs[r, jj]
                    for c in range(DC):
                        dd = part + PARTS * c
                        if dd < D:
                            adv[c] += p * dOs[r, dd]
                            if want_dk:
                                adk[c] += ds * Qs[r, dd]
        j = j0 + jj
        if j < T:
            for c in range(DC):
                dd = part + PARTS * c
                if dd < D:
                    dv[b, hk, j, dd] = adv[c]
                    if want_dk:
                        dk[b, hk, j, dd] = adk[c] * scale

    return attention_dkdv_kernel


def make_dq_kernel(D, BR, BC):
    NT = BR * PARTS
    DC = ceil_div(D, PARTS)
    DP = D + 1
    BCP = BC + 1
    E = ceil_div(BR * BC, NT)
    LQ = ceil_div(BR * D, NT)
    LK = ceil_div(BC * D, NT)
    scale = np.float32(1.0 / math.sqrt(D))

    @_jit(NT)
    def attention_dq_kernel(dq, do, q, k, v, lse, dr, kv_len, causal):
        # block = BR query rows of (b, h), looping over the key tiles they can see;
        # thread (ii, part) owns dQ[i0 + ii, part + PARTS*c]
        tid = cuda.threadIdx.x & (NT - 1)
        ii = tid // PARTS
        part = tid % PARTS
        H, S = q.shape[1], q.shape[2]
        T = k.shape[2]
        b = cuda.blockIdx.y // H
        h = cuda.blockIdx.y % H
        hk = h // (H // k.shape[1])
        i0 = cuda.blockIdx.x * BR
        Ks = cuda.shared.array((BC, DP), float32)
        Vs = cuda.shared.array((BC, DP), float32)
        Qs = cuda.shared.array((BR, DP), float32)
        dOs = cuda.shared.array((BR, DP), float32)
        dSs = cuda.shared.array((BR, BCP), float32)
        Ls = cuda.shared.array(BR, float32)
        Ds = cuda.shared.array(BR, float32)
        adq = cuda.local.array(DC, float32)
        for c in range(DC):
            adq[c] = ZERO
        for e in range(LQ):
            x = tid + e * NT
            if x < BR * D:
                r = x // D
                c = x % D
                inside = i0 + r < S
                Qs[r, c] = q[b, h, i0 + r, c] if inside else ZERO
                dOs[r, c] = do[b, h, i0 + r, c] if inside else ZERO
        for r in range(tid, BR, NT):
            inside = i0 + r < S
            Ls[r] = lse[b, h, i0 + r] if inside else NEG_INF
            Ds[r] = dr[b, h, i0 + r] if inside else ZERO
        kv = kv_len[b]
        off = T - S
        jend = kv
        if causal:
            jend = min(jend, i0 + BR + off)
        for j0 in range(0, max(jend, 0), BC):
            cuda.syncthreads()
            for e in range(LK):
                x = tid + e * NT
                if x < BC * D:
                    r = x // D
                    c = x % D
                    inside = j0 + r < T
                    Ks[r, c] = k[b, hk, j0 + r, c] if inside else ZERO
                    Vs[r, c] = v[b, hk, j0 + r, c] if inside else ZERO
            cuda.syncthreads()
            for e in range(E):
                x = tid + e * NT
                if x < BR * BC:
                    r = x // BC
                    c = x % BC
                    s = ZERO
                    dp = ZERO
                    for d in range(D):
                        s += Qs[r, d] * Ks[c, d]
                        dp += dOs[r, d] * Vs[c, d]
                    lim = kv
                    if causal:
                        lim = min(lim, i0 + r + off + 1)
                    ds = ZERO
                    if j0 + c < lim and Ls[r] != NEG_INF:
                        ds = math.exp(s * scale - Ls[r]) * (dp - Ds[r])
                    dSs[r, c] = ds
            cuda.syncthreads()
            for c2 in range(BC):
                ds = dSs[ii, c2]
                for c in range(DC):
                    dd = part + PARTS * c
                    if dd < D:
                        adq[c] += ds * Ks[c2, dd]
        i = i0 + ii
        if i < S:
            for c in range(DC):
                dd = part + PARTS * c
                if dd < D:
                    dq[b, h, i, dd] = adq[c] * scale

    return attention_dq_kernel


def dkdv_kernel(D, want_dk=True):
    return _cached(("dkdv", D, want_dk), lambda: make_dkdv_kernel(D, *_bwd_tiles(D), want_dk))


def dq_kernel(D):
    return _cached(("dq", D), lambda: make_dq_kernel(D, *_bwd_tiles(D)))


def _scratch(name, shape):
    key = ("scratch", name)
    buf = _cache.get(key)
    if buf is None or buf.shape != tuple(shape):
        buf = _cache[key] = cuda.device_array(shape, dtype=np.float32)
    return buf


@register("attention_bwd", "gpu", "flash2", rung=1,
          ptx=[(attention_bwd_pre_kernel, SIG_BWD_PRE), (dkdv_kernel(64), SIG_DKDV), (dq_kernel(64), SIG_DQ)])
def attention_bwd_flash2(dq, dk, dv, do, q, k, v, o, lse, kv_len, causal):
    """Two-kernel flash backward: Dr = rowsum(dO*O); a dK/dV kernel (block = 32 keys, looping over the
    query tiles and heads of its group) and a dQ kernel (block = 32 queries, looping over key tiles),
    both recomputing P from L. Unlike FlashAttention-2's single kernel (which adds dQ with atomics), no
    atomics: deterministic, bit for bit.

    Each pair's s and dP are computed twice (once per kernel): 14D FLOPs per visible pair, 3.5x the
    forward's 4D (the algorithm's minimum is 10D = 2.5x), as dot products read from shared memory (two
    loads per FMA), so predict ~5-8 TFLOP/s-equivalent."""
    B, H, S, D = q.shape
    Hkv, T = k.shape[1], k.shape[2]
    dr = _scratch("dr", (B, H, S))
    attention_bwd_pre_kernel[ceil_div(B * H * S, 128), 128](dr, do, o)
    br, bc = _bwd_tiles(D)
    dkdv_kernel(D)[(ceil_div(T, bc), B * Hkv), bc * PARTS](dk, dv, do, q, k, v, lse, dr, kv_len, causal)
    dq_kernel(D)[(ceil_div(S, br), B * H), br * PARTS](dq, do, q, k, v, lse, dr, kv_len, causal)


@register("attention_bwd_dv", "gpu", "flash2", rung=1, ptx=[(dkdv_kernel(64, False), SIG_DKDV)])
def attention_bwd_dv_gpu(dv, do, q, k, v, o, lse, kv_len, causal):
    """The dK/dV kernel of the flash2 backward with dK switched off: dV_j = sum_i P_ij dO_i."""
    B, H, S, D = q.shape
    Hkv, T = k.shape[1], k.shape[2]
    br, bc = _bwd_tiles(D)
    dr = _scratch("dr", (B, H, S))
    dkdv_kernel(D, False)[(ceil_div(T, bc), B * Hkv), bc * PARTS](dv, dv, do, q, k, v, lse, dr, kv_len, causal)
