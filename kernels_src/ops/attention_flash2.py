"""Attention forward on the GPU, rungs 6-7 (chapter 9): the flash kernel rewritten after profiling (16-byte
shared loads, unrolled loops, launch bounds, masks only where needed); rung 7 adds warp shuffles.
"""
from __future__ import annotations
import functools
import math
import numpy as np

from ..compiler import cuda, float32, load4, store4
from .. import device
from ..device import ceil_div, needs_real_gpu
from ..registry import register
from .reductions import FAST_MATH, NEG_INF, ONE, ZERO
from .softmax import _aligned16
from .attention_fwd import SIG_FWD, SMEM_LIMIT, _cached, _tuned_cfg, flash


# ------------------------------------------------------------------ GPU rungs 6-7: the profiled rewrite
# Nsight Compute on rungs 3-5 (book/data/bench/h100/attention_ncu_gpu.json) found three things the tile
# shape cannot fix: 64-bit index arithmetic and negative-index fix-ups on every shared access (42 integer
# instructions per 32 FFMA), inner loops that were not unrolled, and 167 registers (18.75 % occupancy).
# Rungs 6-7 keep the algorithm and change how the work is written down, as chapter 5's GEMM ladder did:
#   - Q and K tiles are stored transposed (QT[d, row], KT[d, key]) and P transposed (PT[key, row]), so each
#     thread reads its 4 consecutive rows or keys with one 16-byte shared load (load4): 3 loads per 32 FMA;
#   - every shared and global access goes through load4/store4 on a flat index (no wrap-around check);
#   - loops have constant trip counts in groups of 4 (unrolled; offsets become immediates);
#   - launch bounds ask for FLASH2_MIN_BLOCKS blocks per SM, which caps registers at 65536 / (4 * 128);
#   - only tiles that cross the causal diagonal or kv_len evaluate the mask; the others skip it;
#   - causal blocks run from the last query block to the first, so the longest blocks start first.
# PT is written with its 16-byte row groups XOR-swizzled by the key's thread column, so the eight lanes of
# a quarter-warp that store one column group hit eight different bank groups (unswizzled: all the same).
SMEM_ALIGN = None if device.SIMULATED else 16  # the simulator refuses alignment=; 16-byte loads need it
FLASH2_REGS = 512  # launch bounds ask for 512 // threads blocks per SM: at most 128 registers per thread


def flash2_config(D, shuffle):
    """Tile shape of rungs 6-7 per head size: (BR, BC, TM, TN). Shared memory (static, 48 KiB at most):
    QT D*BR + KT/PT max(D*BC, BC*BR) + V BC*D floats (+ BR*NTX for the shared-memory row max of rung 6)."""
    if D <= 32:
        return dict(BR=64, BC=max(16, D), TM=8, TN=4)
    if D <= 64:
        return dict(BR=64, BC=64, TM=8, TN=4) if shuffle else dict(BR=64, BC=32, TM=4, TN=4)
    # D = 128: Q, K and V tiles of 32 rows fill the 48 KiB; without shuffles the row-max buffer needs 16-row blocks
    return dict(BR=32, BC=32, TM=4, TN=4) if shuffle else dict(BR=16, BC=32, TM=4, TN=4)


def make_flash2_kernel(D, BR, BC, TM, TN, shuffle, minblocks=None, unroll=2):
    """Rung 6 (``shuffle=False``: the row max of a tile through shared memory) and rung 7 (``shuffle=True``:
    through 4 warp shuffles). Threads form an NTY x NTX grid, tid = ty * NTX + tx (the NTX threads of a row
    group are lanes of one warp). Thread (ty, tx) owns score rows ty*TM + r and keys tx*TN + c, and O rows
    ty*TM + r, columns p*4*NTX + 4*tx + u (p < DC4, u < 4)."""
    NTX, NTY = BC // TN, BR // TM
    NT = NTX * NTY
    D4, BR4, BC4, TM4, TN4 = D // 4, BR // 4, BC // 4, TM // 4, TN // 4
    DC4 = D // (4 * NTX)
    DC = 4 * DC4
    UN = unroll
    if minblocks is None:  # enough blocks per SM that a thread gets at most 128 registers
        minblocks = max(1, FLASH2_REGS // NT)
    assert NT & (NT - 1) == 0 and TM % 4 == 0 and TN % 4 == 0 and D % (4 * NTX) == 0 and 32 % NTX == 0
    assert BR4 & (BR4 - 1) == 0 and BR4 >= 2 and TN % UN == 0 and D % UN == 0
    SW = min(8, BR4) - 1  # the swizzle: row group g of key j is stored at g ^ ((j // TN) & SW)
    KPN = max(D * BC, BC * BR)
    NQ, NV = D * BR, BC * D  # shared-array sizes must be plain constants
    RED = 1 if shuffle else BR * NTX
    LQ = ceil_div(BR * D4, NT)  # 16-byte groups of the Q tile per thread
    LK = ceil_div(BC * D4, NT)
    scale = np.float32(1.0 / math.sqrt(D))
    smem = 4 * (D * BR + KPN + BC * D + (0 if shuffle else RED))
    if smem > SMEM_LIMIT:
        raise ValueError(f"flash2 tiles BR={BR} BC={BC} at D={D} need {smem} bytes of shared memory "
                         f"(> {SMEM_LIMIT}, the static limit)")
    opts = {"fastmath": FAST_MATH}
    if not device.SIMULATED:
        opts["launch_bounds"] = (NT, minblocks)
    align = SMEM_ALIGN

    @cuda.jit(**opts)
    def attention_flash2_kernel(o, lse, q, k, v, kv_len, causal):
        tid = cuda.threadIdx.x & (NT - 1)
        ty = tid // NTX
        tx = tid % NTX
        H, S = q.shape[1], q.shape[2]
        Hkv, T = k.shape[1], k.shape[2]
        bh = cuda.blockIdx.x  # (b, h) varies fastest, so the blocks the GPU starts first are ...
        b = bh // H
        h = bh % H
        hk = h // (H // Hkv)
        blk = cuda.blockIdx.y
        if causal:  # ... every head's last query block: the ones that see the most keys start first
            blk = cuda.gridDim.y - 1 - blk
        i0 = blk * BR
        QT = cuda.shared.array(NQ, float32, alignment=align)  # QT[d * BR + row]
        KP = cuda.shared.array(KPN, float32, alignment=align)  # KT[d * BC + key], then PT[key * BR + row]
        Vs = cuda.shared.array(NV, float32, alignment=align)  # Vs[key * D + d]
        red = cuda.shared.array(RED, float32)
        sacc = cuda.local.array((TM, TN), float32)
        oacc = cuda.local.array((TM, DC), float32)
        mrow = cuda.local.array(TM, float32)
        lrow = cuda.local.array(TM, float32)
        ra = cuda.local.array(TM, float32)
        rb = cuda.local.array(TN, float32)
        rv = cuda.local.array(DC, float32)
        qrow0 = (bh * S + i0) * D4  # 16-byte groups: q[b, h, i0, 0]
        for e in range(LQ):  # the Q tile, pre-scaled and transposed, loaded once
            g = tid + e * NT
            if g < BR * D4:
                r = g % BR  # consecutive threads: consecutive rows (the transposed store is conflict-free)
                d4 = g // BR
                x0 = x1 = x2 = x3 = ZERO
                if i0 + r < S:
                    x0, x1, x2, x3 = load4(q, qrow0 + r * D4 + d4)
                QT[(4 * d4) * BR + r] = x0 * scale
                QT[(4 * d4 + 1) * BR + r] = x1 * scale
                QT[(4 * d4 + 2) * BR + r] = x2 * scale
                QT[(4 * d4 + 3) * BR + r] = x3 * scale
        for r in range(TM):
            mrow[r] = NEG_INF
            lrow[r] = ZERO
            for c in range(DC):
                oacc[r, c] = ZERO
        kv = kv_len[b]
        off = T - S
        jend = min(kv, T)
        if causal:
            jend = min(jend, i0 + BR + off)  # the block's last row sees keys j <= i0 + BR - 1 + off
        ntiles = (max(jend, 0) + BC - 1) // BC
        jfull = min(kv, T)  # keys below this are visible to every row of the block ...
        if causal:
            jfull = min(jfull, i0 + off + 1)  # ... the first row's causal limit included
        kvrow0 = (b * Hkv + hk) * T * D4
        for t in range(ntiles):
            j0 = t * BC
            cuda.syncthreads()  # everyone is done with the previous V and P tiles
            for e in range(LK):
                g = tid + e * NT
                if g < BC * D4:
                    r = g % BC
                    d4 = g // BC
                    x0 = x1 = x2 = x3 = ZERO
                    if j0 + r < T:
                        x0, x1, x2, x3 = load4(k, kvrow0 + (j0 + r) * D4 + d4)
                    KP[(4 * d4) * BC + r] = x0
                    KP[(4 * d4 + 1) * BC + r] = x1
                    KP[(4 * d4 + 2) * BC + r] = x2
                    KP[(4 * d4 + 3) * BC + r] = x3
                    r = g // D4  # V keeps its layout: consecutive threads, consecutive 16 bytes
                    d4 = g % D4
                    y0 = y1 = y2 = y3 = ZERO
                    if j0 + r < T:
                        y0, y1, y2, y3 = load4(v, kvrow0 + (j0 + r) * D4 + d4)
                    store4(Vs, r * D4 + d4, y0, y1, y2, y3)
            cuda.syncthreads()
            for r in range(TM):
                for c in range(TN):
                    sacc[r, c] = ZERO
            for d0 in range(0, D, UN):  # S = Q K^T: (TM + TN) / 4 16-byte loads for TM * TN FMAs
                for u in range(UN):  # a constant trip count: unrolled
                    d = d0 + u
                    for p in range(TM4):
                        a0, a1, a2, a3 = load4(QT, d * BR4 + ty * TM4 + p)
                        ra[4 * p] = a0
                        ra[4 * p + 1] = a1
                        ra[4 * p + 2] = a2
                        ra[4 * p + 3] = a3
                    for p in range(TN4):
                        b0, b1, b2, b3 = load4(KP, d * BC4 + tx * TN4 + p)
                        rb[4 * p] = b0
                        rb[4 * p + 1] = b1
                        rb[4 * p + 2] = b2
                        rb[4 * p + 3] = b3
                    for r in range(TM):
                        for c in range(TN):
                            sacc[r, c] += ra[r] * rb[c]
            if j0 + BC > jfull:  # a tile on the diagonal or past kv_len: mask (the same for the whole block)
                for r in range(TM):
                    lim = kv
                    if causal:
                        lim = min(lim, i0 + ty * TM + r + off + 1)
                    for c in range(TN):
                        if j0 + tx * TN + c >= lim:
                            sacc[r, c] = NEG_INF
            for r in range(TM):  # this thread's max of each of its rows, then the row's max over NTX threads
                mx = NEG_INF
                for c in range(TN):
                    mx = max(mx, sacc[r, c])
                if shuffle:
                    w = NTX // 2
                    while w > 0:
                        mx = max(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, w))
                        w //= 2
                    ra[r] = mx
                else:
                    red[(ty * TM + r) * NTX + tx] = mx
            cuda.syncthreads()  # every thread is done reading the K tile (and the partial maxima are visible)
            for r in range(TM):
                mx = mrow[r]
                if shuffle:
                    mx = max(mx, ra[r])
                else:
                    for x in range(NTX):
                        mx = max(mx, red[(ty * TM + r) * NTX + x])
                alpha = math.exp(mrow[r] - mx) if mx != NEG_INF else ONE
                ms = mx if mx != NEG_INF else ZERO
                mrow[r] = mx
                ls = ZERO
                for c in range(TN):
                    pc = math.exp(sacc[r, c] - ms)  # exp(-inf) = 0 for masked entries
                    sacc[r, c] = pc
                    ls += pc
                lrow[r] = lrow[r] * alpha + ls  # this thread's partial sum, rescaled to the new max
                for c in range(DC):
                    oacc[r, c] *= alpha
            for c in range(TN):  # PT[key, row]: 16-byte groups of 4 rows, swizzled by the key's column
                j = tx * TN + c
                sw = (j // TN) & SW
                for p in range(TM4):
                    gq = (ty * TM4 + p) ^ sw
                    store4(KP, j * BR4 + gq, sacc[4 * p, c], sacc[4 * p + 1, c], sacc[4 * p + 2, c],
                           sacc[4 * p + 3, c])
            cuda.syncthreads()  # the P tile is complete
            for j0c in range(0, BC, UN):  # O += P V: (TM + DC) / 4 16-byte loads for TM * DC FMAs
                sw = (j0c // TN) & SW  # UN divides TN: the same swizzle for the UN keys
                for u in range(UN):
                    j = j0c + u
                    for p in range(TM4):
                        a0, a1, a2, a3 = load4(KP, j * BR4 + ((ty * TM4 + p) ^ sw))
                        ra[4 * p] = a0
                        ra[4 * p + 1] = a1
                        ra[4 * p + 2] = a2
                        ra[4 * p + 3] = a3
                    for p in range(DC4):
                        b0, b1, b2, b3 = load4(Vs, j * D4 + p * NTX + tx)
                        rv[4 * p] = b0
                        rv[4 * p + 1] = b1
                        rv[4 * p + 2] = b2
                        rv[4 * p + 3] = b3
                    for r in range(TM):
                        for c in range(DC):
                            oacc[r, c] += ra[r] * rv[c]
        for r in range(TM):  # the row sum is split over the NTX threads of the row: add the parts once
            tot = lrow[r]
            if shuffle:
                w = NTX // 2
                while w > 0:
                    tot += cuda.shfl_xor_sync(0xFFFFFFFF, tot, w)
                    w //= 2
                lrow[r] = tot
        if not shuffle:
            cuda.syncthreads()
            for r in range(TM):
                red[(ty * TM + r) * NTX + tx] = lrow[r]
            cuda.syncthreads()
            for r in range(TM):
                tot = ZERO
                for x in range(NTX):
                    tot += red[(ty * TM + r) * NTX + x]
                lrow[r] = tot
        orow0 = (bh * S + i0) * D4
        for r in range(TM):
            i = i0 + ty * TM + r
            if i < S:
                tot = lrow[r]
                inv = ONE / tot if tot > ZERO else ZERO
                for p in range(DC4):
                    store4(o, orow0 + (ty * TM + r) * D4 + p * NTX + tx, oacc[r, 4 * p] * inv,
                           oacc[r, 4 * p + 1] * inv, oacc[r, 4 * p + 2] * inv, oacc[r, 4 * p + 3] * inv)
                if tx == 0:
                    lse[b, h, i] = mrow[r] + math.log(tot) if tot > ZERO else NEG_INF

    def launch(o, lse, q, k, v, kv_len, causal):
        B, H, S, _ = q.shape
        attention_flash2_kernel[(B * H, ceil_div(S, BR)), NT](o, lse, q, k, v, kv_len, causal)

    launch.kernel = attention_flash2_kernel
    launch.config = dict(D=D, BR=BR, BC=BC, TM=TM, TN=TN, threads=NT, shuffle=shuffle, smem_bytes=smem,
                         minblocks=minblocks, unroll=UN)
    return launch


def flash2(D, shuffle, **cfg):
    cfg = cfg or flash2_config(D, shuffle)
    cfg = {k: v for k, v in cfg.items() if not (k == "minblocks" and not v)}  # 0/None: the default launch bounds
    key = ("flash2", D, shuffle) + tuple(sorted(cfg.items()))
    return _cached(key, lambda: make_flash2_kernel(D, shuffle=shuffle, **cfg))


# ------------------------------------------------------------ the tile, from the runtime's autotune table
# Rungs 6-7 launch the tile that `kernels autotune --attention` measured fastest on this GPU for (rung, D, causal)
# and wrote into the device's table (kernels_src.runtime.tiles); without a table, or without an entry for that
# key, the documented default flash2_config(D, shuffle). The candidates are every tile the kernel can build.
TILE_BR = (16, 32, 64, 128)
TILE_BC = (16, 32, 64)
TILE_TM = (4, 8)
TILE_TN = (4, 8)
TILE_MAX_ACC = 64  # at most 64 accumulators per thread for O (TM x D/NTX) and for S (TM x TN): no spills
TILE_THREADS = (32, 64, 128, 256)


def tile_error(D, shuffle, BR, BC, TM, TN, minblocks=0):
    """Why make_flash2_kernel cannot build this tile at head size D (None if it can)."""
    if BR % TM or BC % TN:
        return "BR must be a multiple of TM and BC of TN"
    ntx, nty = BC // TN, BR // TM
    nt = ntx * nty
    if nt not in TILE_THREADS:
        return f"{nt} threads (must be one of {TILE_THREADS})"
    if TM % 4 or TN % 4 or 32 % ntx or D % (4 * ntx):
        return "TM and TN multiples of 4, BC/TN dividing 32 and D a multiple of 4*BC/TN"
    br4 = BR // 4
    if br4 < 2 or br4 & (br4 - 1) or TN % 2 or D % 2:
        return "BR/4 a power of two >= 2"
    if TM * (D // ntx) > TILE_MAX_ACC or TM * TN > TILE_MAX_ACC:
        return f"more than {TILE_MAX_ACC} accumulators per thread"
    smem = 4 * (D * BR + max(D * BC, BC * BR) + BC * D + (0 if shuffle else BR * ntx))
    if smem > SMEM_LIMIT:
        return f"{smem} bytes of shared memory (> {SMEM_LIMIT})"
    if minblocks and minblocks * nt > 2048:
        return f"{minblocks} blocks of {nt} threads exceed 2048 threads per SM"
    return None


@functools.lru_cache(maxsize=None)
def flash2_tiles(D, shuffle, minblocks=(0,)):
    """Every tile rungs 6-7 can build at head size D: dicts BR, BC, TM, TN, minblocks (0: 512 // threads)."""
    out = []
    for br in TILE_BR:
        for bc in TILE_BC:
            for tm in TILE_TM:
                for tn in TILE_TN:
                    for mb in minblocks:
                        if tile_error(D, shuffle, br, bc, tm, tn, mb) is None:
                            out.append(dict(BR=br, BC=bc, TM=tm, TN=tn, minblocks=mb))
    return out


TILE_MINBLOCKS = (0, 2, 3)  # the launch bounds the autotune tries (0: 512 // threads, at most 128 registers)


def flash2_tile(D, causal, shuffle, table=None, dev="gpu"):
    """(tile, source) for rung 6 (``shuffle=False``) or 7 at head size D: the autotune table's entry for
    (variant, D, causal) if the device has one, else flash2_config(D, shuffle). A table naming a tile that
    flash2_tiles does not list raises kernels_src.runtime.tiles.TileTableError."""
    from ..runtime.tiles import choose_tile

    variant = "attention/gpu/" + ("flash_shfl" if shuffle else "flash_vec")
    default = dict(flash2_config(D, shuffle), minblocks=0)
    return choose_tile("attention", {"variant": variant, "D": int(D), "causal": int(bool(causal))}, default,
                       lambda: flash2_tiles(D, shuffle, TILE_MINBLOCKS), table=table, dev=dev)


def flash2_fits(D, shuffle) -> bool:
    """Rungs 6-7 handle head size D: 16-byte rows, a thread's output columns a whole number of float4 groups
    (D a multiple of 4 * keys-per-row-group), and the tiles inside the 48 KiB of static shared memory."""
    cfg = flash2_config(D, shuffle)
    ntx = cfg["BC"] // cfg["TN"]
    smem = 4 * (D * cfg["BR"] + max(D * cfg["BC"], cfg["BC"] * cfg["BR"]) + cfg["BC"] * D
                + (0 if shuffle else cfg["BR"] * ntx))
    return D % 16 == 0 and D % (4 * ntx) == 0 and smem <= SMEM_LIMIT


def _launch_flash2(shuffle, o, lse, q, k, v, kv_len, causal):
    D = q.shape[3]
    if not flash2_fits(D, shuffle) or not _aligned16(o, q, k, v):  # rung 5 takes the rest
        flash(D, skip=True, **_tuned_cfg(D))(o, lse, q, k, v, kv_len, causal)
        return
    tile, _ = flash2_tile(D, causal, shuffle, dev="sim" if device.SIMULATED else "gpu")
    flash2(D, shuffle, **tile)(o, lse, q, k, v, kv_len, causal)


@register("attention", "gpu", "flash_vec", rung=6,
          ptx=[(flash2(64, False).kernel, SIG_FWD), (flash2(128, False).kernel, SIG_FWD)])
def attention_flash_vec(o, lse, q, k, v, kv_len, causal):
    """The profile's fixes: transposed Q/K/P tiles read by 16-byte shared loads, flat indices, unrolled loops,
    at most 128 registers (4 blocks of 128 threads per SM), the mask only on diagonal tiles.

    Rung 4's 64-thread blocks held 167 registers (18.75 % occupancy) and issued 42 integer instructions per
    32 FFMA. Here a thread does 8 x 4 scores and 8 x 4 outputs per 32-key tile from 3 16-byte loads per 32
    FMAs, in 128-thread blocks. Predict FFMA >= 60 % of issued instructions and ~1.5-2x rung 4."""
    _launch_flash2(False, o, lse, q, k, v, kv_len, causal)


@register("attention", "gpu", "flash_shfl", rung=7,
          ptx=[(flash2(64, True).kernel, SIG_FWD), (flash2(128, True).kernel, SIG_FWD)], requires=needs_real_gpu)
def attention_flash_shfl(o, lse, q, k, v, kv_len, causal):
    """Rung 6 with each tile's row max taken by 4 warp shuffles instead of a shared-memory round trip, which
    frees the 8 KiB of the reduction buffer for 64-key tiles (D = 64): half the barriers per key.
    Predict ~1.2x rung 6 on the non-causal shape."""
    _launch_flash2(True, o, lse, q, k, v, kv_len, causal)
