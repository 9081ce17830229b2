"""qgemv_packed: the quantized GEMV's GPU rungs on repacked weights (chapter 11, rungs 5 and 6).

Rungs 1-4 (``quant.py``) read GGML's blocks as they are stored: 34 (Q8_0) or 18 (Q4_0) bytes, a 2-byte
fp16 scale followed by the quants. A block starts at an even byte, never at a multiple of 16, so the widest
load a lane can issue on them is 2 bytes (Q8_0: the 32 quants start at byte 2 of the block). Rung 3 reached
39 % of copy on the H100 at 8192^2: a warp's load instruction moves 64 bytes, and it takes too many of them
to keep enough bytes in flight.

Fast loaders (llama.cpp's GPU back-ends among them) repack a weight once, when the model loads. These rungs
do the same (:func:`repack_gpu`, cached per weight like chapter 11's other ahead-of-time conversions):

  qs (N, K/4) int32    the quants of row n, contiguous: Q8_0 one byte per weight (K bytes a row), Q4_0 the
                       16 nibble bytes of each block in GGML's order (byte j: element j low, j+16 high)
  d  (N, K/32) float16 the scales, unchanged (so the bytes read are exactly GGML's: 1.0625 / 0.5625 a weight)

A lane now loads 16 bytes of quants with one instruction (``load4`` on the int32 view): a chunk of 16
weights for Q8_0 (half a block) or 32 for Q4_0 (a whole block), plus the block's 2-byte scale.

Each thread block computes ``ROWS`` outputs (rows of the packed weight) with ``WARPS`` warps that split K
between them; a lane keeps its chunk of x in registers and reuses it for all ``ROWS`` rows, and issues
the ``ROWS`` weight loads before it uses the first (no branch between them: a row past the end re-reads
the last row, and its sum is never stored). The partial sums meet in shared memory at the end.

  gpu/packed      rung 5  fp32 x; each weight byte becomes a float by the 2^23 trick (OR, subtract)
  gpu/packed_warp rung 6  a warp owns a few outputs and walks all of K, every load of a trip issued first
  gpu/packed_dp4a rung 7  x quantized to int8 per block of 32 by a first small kernel, then ``dp4a``: 4 int8
                          products summed per instruction, one float scale per block
                          (:mod:`kernels_src.compiler.inline_ptx`)
  gpu/packed_split rung 8 for a decode step's small products: one 16-byte chunk per lane, several warps per
                          long row (rung 6's shapes leave most lanes idle or re-reading at K = 768)
  gpu/packed_prmt rung 9  rung 8 with one ``prmt`` (byte_perm) per weight to make it a float
  gpu/packed_words rung 10 one 4-byte word of quants a lane, consecutive lanes on consecutive words: x read
                          coalesced, every load of a lane issued first
  gpu/packed_words_shfl rung 11  rung 10 with warp sums by shuffles (a real GPU only)
"""
from __future__ import annotations

import functools

import numpy as np

from ..compiler import byte_perm, cuda, dp4a, float32, int32, int_as_float, load4
from .. import device
from ..device import ceil_div
from ..registry import define_op, get_variant, register
from . import activations
from .quant import (FORMATS, GSIZES, MAGIC, QK, _scales, block_reduce_store, packed_bytes, per_array, q8act_tol,
                    qgemv_inputs, qgemv_ref, qgemv_tol, quantize_x8, x_scratch)

OFFSET4 = np.int32(-0x7F7F7F80)  # 0x80808080 as an int32: XOR flips the sign bit of each byte
ROWS = 8  # rung 5: outputs per thread block
WARPS = 4  # rung 5: warps per block, which split K
# rungs 6-7: (outputs per warp, warps per block, chunks per loop trip) for each (format, int8 x), the winners of
# the shape sweep at 8192^2, 4096x14336 and 14336x4096 (book/data/bench/h100/qgemv_sweep_gpu.json)
SHAPES = {("q8_0", False): (2, 4, 2), ("q4_0", False): (4, 4, 2), ("q8_0", True): (1, 8, 4), ("q4_0", True): (2, 8, 4)}

_repacked: dict = {}
# A model's every quantized weight stays repacked: a large capstone has ~60 of them, and a miss costs a host round
# trip (and cannot happen inside a captured CUDA graph at all).
REPACK_KEEP = 256


def repack_host(Wq, fmt):
    """GGML blocks (N, K/32*BB) uint8 -> (qs (N, K/4) int32, d (N, K/32) float16), on the host."""
    Wq = np.asarray(Wq)
    N, BB = Wq.shape[0], FORMATS[fmt]
    blocks = Wq.reshape(N, -1, BB)
    qs = np.ascontiguousarray(blocks[..., 2:]).reshape(N, -1).view(np.int32)
    d = _scales(Wq, BB).astype(np.float16)
    return qs, np.ascontiguousarray(d)


def repack_gpu(Wq, fmt):
    """The repacked weight on the device, built once per packed array and cached (the cache holds the
    array, so its id is not reused while the entry lives)."""
    def build():
        qs, d = repack_host(Wq.copy_to_host() if hasattr(Wq, "copy_to_host") else Wq, fmt)
        return cuda.to_device(qs), cuda.to_device(d)

    return per_array(_repacked, Wq, (id(Wq), fmt), build, keep=REPACK_KEEP)


@functools.cache
def make_packed_kernel(fmt, rows=ROWS, warps=WARPS):
    """Rung 5: ``warps`` warps split K, ``rows`` outputs per block, fp32 x; a block-wide tree at the end."""
    threads = 32 * warps
    q8 = fmt == "q8_0"
    WPC = 16 if q8 else 32  # weights per chunk (16 bytes of quants)

    @cuda.jit(fastmath=True)
    def kernel(y, x, qs, d):
        t = cuda.threadIdx.y * 32 + cuda.threadIdx.x
        n0 = cuda.blockIdx.x * rows
        N = y.size
        C = x.size // WPC  # chunks in a row
        acc = cuda.local.array(rows, float32)
        xv = cuda.local.array(WPC, float32)
        part = cuda.shared.array((rows, threads), float32)
        for r in range(rows):
            acc[r] = float32(0.0)
        for c in range(t, C, threads):
            for i in range(WPC // 4):
                xv[4 * i], xv[4 * i + 1], xv[4 * i + 2], xv[4 * i + 3] = load4(x, c * (WPC // 4) + i)
            b = c // 2 if q8 else c  # the block this chunk belongs to
            for r in range(rows):
                n = min(n0 + r, N - 1)
                w0, w1, w2, w3 = load4(qs, n * C + c)
                acc[r] += float32(d[n, b]) * chunk_dot_f32(q8, w0, w1, w2, w3, xv)
        block_reduce_store(y, part, acc, n0, rows, t, threads)

    return kernel


@cuda.jit(device=True, inline=True)
def chunk_dot_f32(q8, w0, w1, w2, w3, xv):
    """The dot product of one 16-byte chunk of quants with its x values (fp32), integers turned into floats by
    the 2^23 trick: Q8_0 16 int8 (XOR 0x80 makes them q + 128), Q4_0 32 nibbles (q + 8; byte j holds
    element j low and j + 16 high)."""
    s = float32(0.0)
    if q8:
        for k in range(4):
            v = int32((w0, w1, w2, w3)[k]) ^ OFFSET4
            for j in range(4):
                s += (int_as_float(MAGIC | ((v >> (8 * j)) & 0xFF)) - float32(8388736.0)) * xv[4 * k + j]  # 2^23+128
    else:
        for k in range(4):
            v = (w0, w1, w2, w3)[k]
            for j in range(4):
                lo = int_as_float(MAGIC | ((v >> (8 * j)) & 15)) - float32(8388616.0)  # 2^23 + 8
                hi = int_as_float(MAGIC | ((v >> (8 * j + 4)) & 15)) - float32(8388616.0)
                s += lo * xv[4 * k + j] + hi * xv[16 + 4 * k + j]
    return s


MAGIC_HI = np.int32(0x4B000000)  # 2^23 as a float32's bits: its bytes 0-2 are zero, byte 3 is 0x4B
# byte_perm selectors: byte j of x, then bytes 0, 1 (zero) and 3 (0x4B) of MAGIC_HI: the float 2^23 + byte j
SEL = (0x7540, 0x7541, 0x7542, 0x7543)


@cuda.jit(device=True, inline=True)
def chunk_dot_prmt(q8, w0, w1, w2, w3, xv):
    """chunk_dot_f32 with one ``prmt`` per weight: the byte (Q8_0, after XOR 0x80) or the nibble (Q4_0, after one
    AND for 4 of them) goes straight into the low byte of 2^23's bits, instead of shift, mask and OR."""
    s = float32(0.0)
    t = float32(0.0)  # two sums, each one FMA a weight (one chain would be twice as long)
    if q8:
        for k in range(4):
            v = int32(int32((w0, w1, w2, w3)[k]) ^ OFFSET4)
            for j in range(0, 4, 2):
                s += (int_as_float(byte_perm(v, MAGIC_HI, SEL[j])) - float32(8388736.0)) * xv[4 * k + j]  # 2^23+128
                t += (int_as_float(byte_perm(v, MAGIC_HI, SEL[j + 1])) - float32(8388736.0)) * xv[4 * k + j + 1]
    else:
        for k in range(4):
            v = (w0, w1, w2, w3)[k]
            lo = int32(v & 0x0F0F0F0F)
            hi = int32((v >> 4) & 0x0F0F0F0F)
            for j in range(4):
                s += (int_as_float(byte_perm(lo, MAGIC_HI, SEL[j])) - float32(8388616.0)) * xv[4 * k + j]  # 2^23+8
                t += (int_as_float(byte_perm(hi, MAGIC_HI, SEL[j])) - float32(8388616.0)) * xv[16 + 4 * k + j]
    return s + t


@cuda.jit(device=True, inline=True)
def chunk_dot_i8(q8, w0, w1, w2, w3, xa0, xa1, xa2, xa3, xb0, xb1, xb2, xb3):
    """The int32 dot product of one 16-byte chunk of quants with int8 x (4 per word, xa then xb): Q8_0 four
    dp4a on 16 signed bytes; Q4_0 eight on the 32 unsigned nibbles (0..15: the caller takes 8 * sum(x) off)."""
    if q8:
        return dp4a(w0, xa0, dp4a(w1, xa1, dp4a(w2, xa2, dp4a(w3, xa3, 0))))
    s = dp4a(w0 & 0x0F0F0F0F, xa0, dp4a(w1 & 0x0F0F0F0F, xa1, dp4a(w2 & 0x0F0F0F0F, xa2,
                                                                 dp4a(w3 & 0x0F0F0F0F, xa3, 0))))
    return dp4a((w0 >> 4) & 0x0F0F0F0F, xb0, dp4a((w1 >> 4) & 0x0F0F0F0F, xb1,
                dp4a((w2 >> 4) & 0x0F0F0F0F, xb2, dp4a((w3 >> 4) & 0x0F0F0F0F, xb3, s))))


@cuda.jit(device=True, inline=True)
def warps_reduce_store(y, part, acc, n0, rows, w, lane):
    """part (warps*rows, 32) shared: each warp's lanes sum their own rows (a tree with block barriers, which the
    simulator runs too; once per block, after the K loop)."""
    for r in range(rows):
        part[w * rows + r, lane] = acc[r]
    cuda.syncthreads()
    s = 16
    while s > 0:
        if lane < s:
            for r in range(rows):
                part[w * rows + r, lane] += part[w * rows + r, lane + s]
        cuda.syncthreads()
        s //= 2
    if lane < rows and n0 + lane < y.size:
        y[n0 + lane] = part[w * rows + lane, 0]


@cuda.jit(device=True, inline=True)
def load_trip(qs, d, wq, dq, c, n0, N, C, rows, U, q8):
    """Every DRAM load of one loop trip, none behind a branch: for chunks c, c + 32, ..., c + 32 (U-1) of the
    warp's rows, 16 bytes of quants into wq[u, r, :] and the block's scale into dq[u, r] (0 for a chunk past
    the end, which re-reads chunk C-1; a row past the end re-reads row N-1 and is never stored)."""
    for u in range(U):
        cu = min(c + 32 * u, C - 1)
        keep = float32(1.0) if c + 32 * u < C else float32(0.0)
        bu = cu // 2 if q8 else cu
        for r in range(rows):
            n = min(n0 + r, N - 1)
            wq[u, r, 0], wq[u, r, 1], wq[u, r, 2], wq[u, r, 3] = load4(qs, n * C + cu)
            dq[u, r] = keep * float32(d[n, bu])


@functools.cache
def make_warp_rows_kernel(fmt, int8x, rows=None, warps=None, unroll=None):
    """Rungs 6-7: each warp owns ``rows`` outputs and walks all of K; a lane takes every 32nd chunk, ``unroll``
    at a time (chunks c, c + 32, ...: unroll * rows 16-byte loads issued before the first is used)."""
    R0, W0, U0 = SHAPES[fmt, int8x]
    rows, warps, U = rows or R0, warps or W0, unroll or U0
    q8 = fmt == "q8_0"
    WPC = 16 if q8 else 32
    NR = warps * rows  # a literal for shared.array
    NX = 4 if q8 else 8  # int8 x words per chunk

    if not int8x:
        @cuda.jit(fastmath=True)
        def kernel(y, x, qs, d):
            lane = cuda.threadIdx.x
            w = cuda.threadIdx.y
            n0 = (cuda.blockIdx.x * warps + w) * rows
            N = y.size
            C = x.size // WPC
            acc = cuda.local.array(rows, float32)
            wq = cuda.local.array((U, rows, 4), int32)
            dq = cuda.local.array((U, rows), float32)
            xv = cuda.local.array(WPC, float32)
            part = cuda.shared.array((NR, 32), float32)
            for r in range(rows):
                acc[r] = float32(0.0)
            for c in range(lane, C, 32 * U):
                load_trip(qs, d, wq, dq, c, n0, N, C, rows, U, q8)
                for u in range(U):
                    cu = min(c + 32 * u, C - 1)
                    for i in range(WPC // 4):
                        xv[4 * i], xv[4 * i + 1], xv[4 * i + 2], xv[4 * i + 3] = load4(x, cu * (WPC // 4) + i)
                    for r in range(rows):
                        acc[r] += dq[u, r] * chunk_dot_f32(q8, wq[u, r, 0], wq[u, r, 1], wq[u, r, 2], wq[u, r, 3], xv)
            warps_reduce_store(y, part, acc, n0, rows, w, lane)

        return kernel

    @cuda.jit(fastmath=True)
    def kernel8(y, xq, xd, xs, qs, d):
        # xq: x as int8, viewed as int32 (4 per word); xd: its scale per block of 32; xs: the sum of its int8
        # values per block (Q4_0's -8 offset)
        lane = cuda.threadIdx.x
        w = cuda.threadIdx.y
        n0 = (cuda.blockIdx.x * warps + w) * rows
        N = y.size
        C = xd.size * QK // WPC
        acc = cuda.local.array(rows, float32)
        wq = cuda.local.array((U, rows, 4), int32)
        dq = cuda.local.array((U, rows), float32)
        xi = cuda.local.array(NX, int32)
        part = cuda.shared.array((NR, 32), float32)
        for r in range(rows):
            acc[r] = float32(0.0)
        for c in range(lane, C, 32 * U):
            load_trip(qs, d, wq, dq, c, n0, N, C, rows, U, q8)
            for u in range(U):
                cu = min(c + 32 * u, C - 1)
                bu = cu // 2 if q8 else cu
                for i in range(NX // 4):  # the chunk's int8 x (from L1/L2: x is small and shared)
                    xi[4 * i], xi[4 * i + 1], xi[4 * i + 2], xi[4 * i + 3] = load4(xq, cu * (NX // 4) + i)
                off = int32(0) if q8 else int32(8 * xs[bu])
                dx = xd[bu]
                for r in range(rows):  # Q8_0 reads only xi[0..3] (its last four arguments are unused)
                    s = chunk_dot_i8(q8, wq[u, r, 0], wq[u, r, 1], wq[u, r, 2], wq[u, r, 3], xi[0], xi[1], xi[2],
                                     xi[3], xi[4 % NX], xi[5 % NX], xi[6 % NX], xi[7 % NX])
                    acc[r] += float32(s - off) * (dq[u, r] * dx)
        warps_reduce_store(y, part, acc, n0, rows, w, lane)

    return kernel8


@cuda.jit
def quantize_x_blocks_kernel(xq, xd, xs, x):
    """x (K,) fp32 -> int8 per block of 32 (xq), the block's scale (xd) and the sum of its int8 values (xs).
    One thread per element; the 32 threads of a block meet in shared memory for the block's max |x|."""
    i = cuda.grid(1)
    t = cuda.threadIdx.x
    a = cuda.shared.array(256, float32)
    q = cuda.shared.array(256, int32)
    v = x[i] if i < x.size else float32(0.0)
    a[t] = abs(v)
    cuda.syncthreads()
    s = 16
    while s > 0:  # max over each group of 32 threads (one block of x)
        if (t & 31) < s:
            a[t] = max(a[t], a[t + s])
        cuda.syncthreads()
        s //= 2
    dx = a[t & ~31] / float32(127.0)
    idv = float32(1.0) / dx if dx != 0 else float32(0.0)
    r = quantize_x8(v, idv)
    q[t] = r
    if i < x.size:
        xq[i] = r
    cuda.syncthreads()
    s = 16
    while s > 0:  # and the sum of its int8 values
        if (t & 31) < s:
            q[t] += q[t + s]
        cuda.syncthreads()
        s //= 2
    if (t & 31) == 0 and i < x.size:
        xd[i // QK] = dx
        xs[i // QK] = q[t]


# ------------------------------------------------------------------ rung 8: small products (a decode step's)
SPLIT_WARPS = 8  # rung 8: warps per block
SPLIT_MAX = 8  # rung 8: at most this many warps share one row (longer rows loop)
SPLIT_MAX_WEIGHTS = 1 << 22  # the dispatcher's default qgemv_split_max_weights: rungs 8-9 up to here, rung 6 above


def split_shape(fmt, K):
    """Rung 8's (rows per block R, warps per row S) for rows of K weights: S warps cover a row's 16-byte chunks
    with one chunk per lane (S = ceil(chunks / 32), at most SPLIT_MAX), and R = SPLIT_WARPS // S rows fill the
    block. Q4_0 at K = 768: 24 chunks, (8, 1); at K = 3072: 96 chunks, (2, 3). Q8_0 at K = 768: (4, 2)."""
    C = max(1, K // (16 if fmt == "q8_0" else 32))
    S = min(SPLIT_MAX, max(1, ceil_div(C, 32)))
    return max(1, SPLIT_WARPS // S), S


_gelu_dev = cuda.jit(device=True, inline=True)(activations.gelu_s)  # x Phi(x), float32, erfc (the model's GELU)


@functools.cache
def make_split_kernel(fmt, R, S, prmt=False, act=False):
    """Rung 8: a block of R*S warps computes R outputs; S warps share a row, lane l of warp s takes the row's
    chunks s*32 + l, s*32 + l + 32*S, ... (consecutive lanes, consecutive 16 bytes). One partial sum per lane,
    a tree over each warp's lanes in shared memory, then the S warps' sums added by one thread."""
    q8 = fmt == "q8_0"
    WPC = 16 if q8 else 32
    NW = R * S  # a literal for shared.array

    @cuda.jit(fastmath=True)
    def kernel(y, x, qs, d):
        lane = cuda.threadIdx.x
        w = cuda.threadIdx.y
        r = w // S
        sp = w - r * S
        n = cuda.blockIdx.x * R + r
        N = y.size
        C = x.size // WPC
        nn = min(n, N - 1)  # a row past the end re-reads the last row and is never stored
        xv = cuda.local.array(WPC, float32)
        part = cuda.shared.array((NW, 32), float32)
        acc = float32(0.0)
        for c in range(sp * 32 + lane, C, 32 * S):
            w0, w1, w2, w3 = load4(qs, nn * C + c)
            dd = float32(d[nn, c // 2 if q8 else c])
            for i in range(WPC // 4):
                xv[4 * i], xv[4 * i + 1], xv[4 * i + 2], xv[4 * i + 3] = load4(x, c * (WPC // 4) + i)
            if prmt:
                acc += dd * chunk_dot_prmt(q8, w0, w1, w2, w3, xv)
            else:
                acc += dd * chunk_dot_f32(q8, w0, w1, w2, w3, xv)
        part[w, lane] = acc
        cuda.syncthreads()
        h = 16
        while h > 0:
            if lane < h:
                part[w, lane] += part[w, lane + h]
            cuda.syncthreads()
            h //= 2
        if lane == 0 and sp == 0 and n < N:
            t = part[w, 0]
            for j in range(1, S):
                t += part[w + j, 0]
            if act:  # the MLP's GELU on the finished sum: one launch and one round trip of y fewer
                t = _gelu_dev(t)
            y[n] = t

    return kernel


def launch_split(y, x, qs, d, fmt, R=None, S=None, prmt=False, act=False):
    R0, S0 = split_shape(fmt, x.size)
    R, S = R or R0, S or S0
    make_split_kernel(fmt, R, S, prmt, act)[max(1, ceil_div(y.size, R)), (32, R * S)](y, x, qs, d)


# ------------------------------------------------------------------ rung 10: a word a lane, x read coalesced
WORDS_U = 4  # rung 10: at most this many words a lane per trip (all their loads issued before the first use)


def words_shape(fmt, K):
    """Rung 10's (rows per block R, warps per row S, words per lane U) for rows of K weights: a row has K/8
    (Q4_0) or K/4 (Q8_0) 4-byte words of quants; S warps of 32 lanes with U words each cover it in one trip
    (S = ceil(words / 128), at most SPLIT_MAX, then U = ceil(words / 32S), at most WORDS_U: longer rows loop).
    Q4_0 at K = 768: 96 words, (8, 1, 3); at K = 3072: (2, 3, 4). Q8_0 at K = 768: 192 words, (4, 2, 3)."""
    W = max(1, K // (4 if fmt == "q8_0" else 8))
    S = min(SPLIT_MAX, max(1, ceil_div(W, 32 * WORDS_U)))
    U = min(WORDS_U, max(1, ceil_div(W, 32 * S)))
    return max(1, SPLIT_WARPS // S), S, U


@cuda.jit(device=True, inline=True)
def word_dot_q4(v, xl, xh):
    """One word of Q4_0 quants (byte j: element j low nibble, element j + 16 high) against its 8 x values: the
    4 low-nibble elements take x[4k..4k+3] (xl), the high ones x[16+4k..] (xh). One prmt a weight."""
    lo = int32(v & 0x0F0F0F0F)
    hi = int32((v >> 4) & 0x0F0F0F0F)
    s = float32(0.0)
    t = float32(0.0)
    for j in range(4):
        s += (int_as_float(byte_perm(lo, MAGIC_HI, SEL[j])) - float32(8388616.0)) * xl[j]
        t += (int_as_float(byte_perm(hi, MAGIC_HI, SEL[j])) - float32(8388616.0)) * xh[j]
    return s + t


@cuda.jit(device=True, inline=True)
def word_dot_q8(v, xl):
    """One word of Q8_0 quants (4 int8, XOR 0x80 makes them q + 128) against its 4 x values."""
    u = int32(v ^ OFFSET4)
    s = float32(0.0)
    t = float32(0.0)
    for j in range(0, 4, 2):
        s += (int_as_float(byte_perm(u, MAGIC_HI, SEL[j])) - float32(8388736.0)) * xl[j]
        t += (int_as_float(byte_perm(u, MAGIC_HI, SEL[j + 1])) - float32(8388736.0)) * xl[j + 1]
    return s + t


@functools.cache
def make_words_kernel(fmt, R, S, U, act=False, shfl=False):
    """Rung 10: as rung 8 (R rows a block, S warps a row, a tree per warp, one thread adds the S sums), but the
    unit of a lane is one 4-byte word of quants, and consecutive lanes take consecutive words: lane l of warp
    sp takes words sp*32 + l + 32*S*u (u < U) of each trip. Every load of a trip is issued first."""
    q8 = fmt == "q8_0"
    NW = R * S
    WPB = 8 if q8 else 4  # words per block of 32 weights
    SH = 3 if q8 else 2  # log2(WPB)

    @cuda.jit(fastmath=True)
    def kernel(y, x, qs, d):
        lane = cuda.threadIdx.x
        w = cuda.threadIdx.y
        r = w // S
        sp = w - r * S
        n = cuda.blockIdx.x * R + r
        N = y.size
        Wn = qs.shape[1]  # words in a row
        nn = min(n, N - 1)  # a row past the end re-reads the last row and is never stored
        wv = cuda.local.array(U, int32)
        dv = cuda.local.array(U, float32)
        xl = cuda.local.array((U, 4), float32)
        xh = cuda.local.array((U, 4), float32)
        part = cuda.shared.array((NW, 32), float32)
        acc = float32(0.0)
        for base in range(sp * 32 + lane, Wn, 32 * S * U):
            for u in range(U):  # the trip's loads: quants, scales, x; a word past the row re-reads the last one
                wu = min(base + 32 * S * u, Wn - 1)
                keep = float32(1.0) if base + 32 * S * u < Wn else float32(0.0)
                wv[u] = qs[nn, wu]
                dv[u] = keep * float32(d[nn, wu >> SH])
                if q8:
                    xl[u, 0], xl[u, 1], xl[u, 2], xl[u, 3] = load4(x, wu)
                else:
                    b = wu >> 2
                    k = wu & 3
                    xl[u, 0], xl[u, 1], xl[u, 2], xl[u, 3] = load4(x, 8 * b + k)
                    xh[u, 0], xh[u, 1], xh[u, 2], xh[u, 3] = load4(x, 8 * b + 4 + k)
            for u in range(U):
                if q8:
                    acc += dv[u] * word_dot_q8(wv[u], xl[u])
                else:
                    acc += dv[u] * word_dot_q4(wv[u], xl[u], xh[u])
        if shfl:  # rung 11: the warp's sum by 5 shuffles, one barrier at most (none when a warp owns its row)
            h = 16
            while h > 0:
                acc += cuda.shfl_xor_sync(0xFFFFFFFF, acc, h)
                h //= 2
            if S > 1:
                if lane == 0:
                    part[w, 0] = acc
                cuda.syncthreads()
        else:
            part[w, lane] = acc
            cuda.syncthreads()
            h = 16
            while h > 0:
                if lane < h:
                    part[w, lane] += part[w, lane + h]
                cuda.syncthreads()
                h //= 2
        if lane == 0 and sp == 0 and n < N:
            if shfl and S == 1:
                t = acc
            else:
                t = part[w, 0]
                for j in range(1, S):
                    t += part[w + j, 0]
            if act:
                t = _gelu_dev(t)
            y[n] = t

    return kernel


def launch_words(y, x, qs, d, fmt, R=None, S=None, U=None, act=False, shfl=False):
    R0, S0, U0 = words_shape(fmt, x.size)
    R, S, U = R or R0, S or S0, U or U0
    make_words_kernel(fmt, R, S, U, act, shfl)[max(1, ceil_div(y.size, R)), (32, R * S)](y, x, qs, d)


SIG = "void(float32[::1], float32[::1], int32[:, ::1], float16[:, ::1])"
SIG8 = "void(float32[::1], int32[::1], float32[::1], int32[::1], int32[:, ::1], float16[:, ::1])"
SIGX = "void(int8[::1], float32[::1], int32[::1], float32[::1])"


def launch_packed(y, x, qs, d, fmt, rows=ROWS, warps=WARPS):
    make_packed_kernel(fmt, rows, warps)[max(1, ceil_div(y.size, rows)), (32, warps)](y, x, qs, d)


def launch_warp_rows(y, x, qs, d, fmt, int8x, rows=None, warps=None, unroll=None):
    R0, W0, U0 = SHAPES[fmt, int8x]
    rows, warps, unroll = rows or R0, warps or W0, unroll or U0
    grid = max(1, ceil_div(y.size, rows * warps))
    if not int8x:
        make_warp_rows_kernel(fmt, False, rows, warps, unroll)[grid, (32, warps)](y, x, qs, d)
        return
    xq, xd, xs = x_scratch(x.size)
    quantize_x_blocks_kernel[max(1, ceil_div(x.size, 256)), 256](xq, xd, xs, x)
    make_warp_rows_kernel(fmt, True, rows, warps, unroll)[grid, (32, warps)](y, xq.view(np.int32), xd, xs, qs, d)


def _register(fmt):
    op = f"qgemv_{fmt}"
    bpw = {"q8_0": "1.0625", "q4_0": "0.5625"}[fmt]

    def r5(y, x, Wq):
        qs, d = repack_gpu(Wq, fmt)
        launch_packed(y, x, qs, d, fmt)

    r5.__doc__ = f"""Weights repacked once (quants apart from the fp16 scales, as llama.cpp's loaders do), so that a
        lane loads 16 bytes of quants in one instruction instead of 2; otherwise rung 3's plan: {WARPS} warps
        split K, {ROWS} outputs per block, x reused from registers, a block-wide tree at the end. Same bytes
        as GGML's layout ({bpw} a weight). Predicted: >= 80 % of copy at 8192^2 (4x fewer load instructions)."""
    register(op, "gpu", "packed", rung=5, ptx=[(make_packed_kernel(fmt), SIG)])(r5)

    def r6(y, x, Wq):
        qs, d = repack_gpu(Wq, fmt)
        launch_warp_rows(y, x, qs, d, fmt, False)

    R, Wp, U = SHAPES[fmt, False]
    r6.__doc__ = f"""Rung 5 measured 42 % of copy, its warps stalled on loads (Nsight: long-scoreboard) with 4 loop
        trips a thread at 8192^2. Here a warp owns {R} outputs and walks the whole row, {U} chunks per trip:
        {U * R} 16-byte loads in flight per lane before the first is used, more trips, and no block-wide
        tree ({Wp} warps a block; the shape is the sweep's winner). Predicted: >= 80 % of copy for Q8_0; Q4_0 turns ~5 instructions into floats per
        weight, which at 0.5625 bytes a weight is more than the SM can issue at copy speed."""
    register(op, "gpu", "packed_warp", rung=6, ptx=[(make_warp_rows_kernel(fmt, False), SIG)])(r6)

    def r7(y, x, Wq):
        qs, d = repack_gpu(Wq, fmt)
        launch_warp_rows(y, x, qs, d, fmt, True)

    r7.__doc__ = f"""Rung 6 with integer products, as llama.cpp's GPU path does: a first small kernel quantizes x
        to int8 per block of 32 (scale and sum per block), then the GEMV multiplies with dp4a, 4 byte
        products summed per instruction, one float multiply per block and row. About 1.5 (Q8_0) and 2.5
        (Q4_0) instructions per 4 weights instead of ~20. Predicted: >= 85 % of copy, less the second
        launch (~2 us)."""
    register(op, "gpu", "packed_dp4a", rung=7, tol=q8act_tol,
             edge_exempt="activations quantized to 8 bits per block of 32: a huge value in a block rounds the "
                         "block's other values away, by design",
             ptx=[(quantize_x_blocks_kernel, SIGX), (make_warp_rows_kernel(fmt, True), SIG8)])(r7)


    def r8(y, x, Wq):
        qs, d = repack_gpu(Wq, fmt)
        launch_split(y, x, qs, d, fmt)

    r8.__doc__ = f"""Rung 6 shaped for a decode step's small products: one 16-byte chunk per lane, S warps per row
        (S = ceil(chunks/32): K = 3072 splits each row over 3 warps), no unrolled trip. Rung 6's Q4_0 shape
        (4 rows a warp, 2 chunks a trip) at K = 768: a row has 24 chunks, so lanes 24-31 idle and every lane's
        second chunk is a clamped re-read multiplied by 0: ~1,300 instructions a lane, half wasted, and only
        N/16 blocks (48 for N = 768, on 132 SMs). Such a product moves 0.3-1.3 MB (0.1-0.45 us at copy
        speed): it is bound by one warp's instruction latency, not DRAM. Here a lane runs ~150 instructions
        and there are N*S warps. Predicted: a decode GEMV of the large model from ~5.9 us (Q4_0, rung 6; Q8_0
        ~3.9) to ~3 us in a graph, the Q4_0 step from 579 to ~440 us (1.65x fp32); at 8192^2 within 10 % of
        rung 6 (one chunk a lane still keeps 16 bytes a lane in flight)."""
    register(op, "gpu", "packed_split", rung=8,
             ptx=[(make_split_kernel(fmt, *split_shape(fmt, 768)), SIG),
                  (make_split_kernel(fmt, *split_shape(fmt, 3072)), SIG)])(r8)

    def r9(y, x, Wq):
        qs, d = repack_gpu(Wq, fmt)
        launch_split(y, x, qs, d, fmt, prmt=True)

    r9.__doc__ = f"""Rung 8 with each weight made a float by one ``prmt`` (byte_perm): the byte or nibble is moved into
        the low byte of 2^23's bits in one instruction, where rungs 5-8 shift, mask and OR (PTX: shr, and, or
        per weight; Q4_0 now one AND per 4 nibbles). Per weight ~3 instructions (prmt, the 2^23 subtraction,
        the FMA) instead of ~4.5. Rung 8's products are bound by instruction latency, so predicted: ~25 % off
        each decode GEMV's kernel time beyond the launch (~3 us -> ~2.6 us), and ~15 % at 8192^2 for Q4_0,
        whose rung 6 issued more instructions than copy speed allows."""
    register(op, "gpu", "packed_prmt", rung=9,
             ptx=[(make_split_kernel(fmt, *split_shape(fmt, 768), True), SIG),
                  (make_split_kernel(fmt, *split_shape(fmt, 3072), True), SIG)])(r9)

    def r10(y, x, Wq):
        qs, d = repack_gpu(Wq, fmt)
        launch_words(y, x, qs, d, fmt)

    r10.__doc__ = f"""Rung 9 with one 4-byte word of quants a lane, consecutive lanes on consecutive words, so that x is
        read coalesced. Rungs 8-9 measured no faster with prmt (so not instruction bound) and Q4_0 slower than
        Q8_0 at every decode shape (4.4 against 3.5 us a GEMV in the step's graph). What differs is how x is
        read: a lane owning a 16-byte chunk (32 Q4_0 weights) loads 128 bytes of x, and the lanes of a warp are
        128 bytes apart, so each 16-byte load of the warp touches 24-32 different 128-byte lines: 192 L1
        wavefronts of x per 768-weight row for Q4_0, 96 for Q8_0. At about one wavefront a clock per SM that
        is 1.9 us of x for a 2304-row Q4_0 product (0.95 for Q8_0), the size of the gap measured. Here a row
        costs 48 (Q4_0) or 24 (Q8_0) wavefronts of x. Predicted: Q4_0's decode GEMVs from 4.4 to ~3.0 us in
        the graph, Q8_0's from 3.5 to ~2.9, the Q4_0 step ~70 us shorter."""
    register(op, "gpu", "packed_words", rung=10,
             ptx=[(make_words_kernel(fmt, *words_shape(fmt, 768)), SIG),
                  (make_words_kernel(fmt, *words_shape(fmt, 3072)), SIG)])(r10)

    def r11(y, x, Wq):
        qs, d = repack_gpu(Wq, fmt)
        launch_words(y, x, qs, d, fmt, shfl=True)

    r11.__doc__ = """Rung 10 with each warp's sum made by 5 register shuffles instead of a tree in shared memory: one block
        barrier where rung 10 has six (none when one warp owns its row, as at K = 768 for Q4_0). The decode
        step's products take ~3 us each in a graph, of which the 6 barriers and shared-memory steps of 8 warps
        are a few hundred clocks. Predicted: ~0.2 us off each, ~10 us off a decode step of 49 products."""
    register(op, "gpu", "packed_words_shfl", rung=11, requires=device.needs_real_gpu,
             ptx=[(make_words_kernel(fmt, *words_shape(fmt, 768), False, True), SIG),
                  (make_words_kernel(fmt, *words_shape(fmt, 3072), False, True), SIG)])(r11)


for _f in FORMATS:
    _register(_f)


# ------------------------------------------------------------------ the MLP's up projection with its GELU
def qgemv_gelu_ref(fmt):
    def reference(x, Wq):
        """float64 oracle: gelu(x . dequant(Wq)^T), the exact GELU x Phi(x)."""
        return activations.gelu_ref(qgemv_ref(fmt)(x, Wq))

    reference.__name__ = f"qgemv_gelu_{fmt}_reference"
    return reference


def qgemv_gelu_tol(size, dtype):
    """The GEMV's tolerance (GELU's slope is between -0.13 and 1.13, so it carries the product's error over
    about unchanged), plus float32 erfc's few ulps on an output of size ~sqrt(K) |W|."""
    rtol, atol = qgemv_tol(size, dtype)
    return rtol + 1e-6, atol


def _register_gelu(fmt):
    op = f"qgemv_gelu_{fmt}"
    define_op(op, reference=qgemv_gelu_ref(fmt), make_inputs=qgemv_inputs(fmt), chapter=14,
              title=f"dequantizing GEMV with the MLP's GELU: y = gelu(x W), W in {fmt.upper()}", size_names=("K", "N"),
              kind="memory", output_names=("y",), tol=qgemv_gelu_tol, flops=lambda s: 2 * s[0] * s[1] + 20 * s[1],
              bytes=packed_bytes(fmt), sizes={**GSIZES, "bench_gpu": [(768, 3072), (1024, 4096), (4096, 14336)]})

    def cpu(y, x, Wq):
        get_variant(f"qgemv_{fmt}/cpu/fused_prange").fn(y, x, Wq)
        get_variant("gelu/cpu/simd").fn(y, y)

    cpu.__doc__ = "The CPU product (chapter 11, rung 3) and then the GELU (chapter 6) in place: the CPU path."
    register(op, "cpu", "fused_prange", rung=1)(cpu)

    def unfused(y, x, Wq):
        rung = "packed_words" if x.size * y.size <= SPLIT_MAX_WEIGHTS else "packed_warp"
        get_variant(f"qgemv_{fmt}/gpu/{rung}").fn(y, x, Wq)
        get_variant("gelu/gpu/thread").fn(y, y)

    unfused.__doc__ = """Two launches, as the model ran them: chapter 11's rung 10 (rung 6 above SPLIT_MAX_WEIGHTS, as the
        dispatcher's default), then chapter 6's GELU in place (the yardstick of the fused rung)."""
    register(op, "gpu", "unfused", baseline=True)(unfused)

    def fused(y, x, Wq):
        qs, d = repack_gpu(Wq, fmt)
        launch_words(y, x, qs, d, fmt, act=True)

    fused.__doc__ = """Rung 10 with the GELU applied by the thread that stores each output: one launch instead of two.
        The decode step runs it 12 times (the large model's 768 x 3072 up projections). Predicted: the
        GELU launch's ~1.6 us (measured in a graph, chapter 14's profile) disappears and the product takes no
        measurable longer (one erfc per output, 3072 of them): ~19 us off the Q4_0 and Q8_0 steps."""
    register(op, "gpu", "packed_words", rung=1,
             ptx=[(make_words_kernel(fmt, *words_shape(fmt, 768), True), SIG)])(fused)

    def fused_shfl(y, x, Wq):
        qs, d = repack_gpu(Wq, fmt)
        launch_words(y, x, qs, d, fmt, act=True, shfl=True)

    fused_shfl.__doc__ = """Rung 1 on chapter 11's rung 11 (warp sums by shuffles): the same prediction as rung 11's."""
    register(op, "gpu", "packed_words_shfl", rung=2, requires=device.needs_real_gpu,
             ptx=[(make_words_kernel(fmt, *words_shape(fmt, 768), True, True), SIG)])(fused_shfl)


for _f in FORMATS:
    _register_gelu(_f)


# Candidate shapes (outputs per warp, warps per block, chunks per trip) for rungs 6-7, timed by :func:`sweep`.
SWEEP = [(4, 4, 2), (2, 4, 2), (2, 8, 4), (4, 4, 4), (1, 8, 2), (1, 8, 4), (1, 8, 8), (2, 8, 2), (1, 4, 4)]
SWEEP_SIZES = [(8192, 8192), (4096, 14336), (14336, 4096), (4096, 4096)]


def sweep(out=None, sizes=SWEEP_SIZES, configs=SWEEP, repeat=20):
    """Time rungs 6-7 for each shape in SWEEP on the GPU (K, N sizes), with the GB/s on GGML's bytes and the
    largest difference from the float64 reference (a wrong shape shows up here)."""
    from .. import bench
    from .quant import QUANT, packed_bytes, qgemv_ref

    rows = []
    rng = np.random.default_rng(0)
    for K, N in sizes:
        x = rng.standard_normal(K).astype(np.float32)
        W = rng.standard_normal((N, K)).astype(np.float32)
        for fmt in FORMATS:
            Wq = QUANT[fmt](W)
            ref = qgemv_ref(fmt)(x, Wq)
            qs, d = repack_gpu(Wq, fmt)
            xd = cuda.to_device(x)
            y = cuda.device_array(N, np.float32)
            nbytes = packed_bytes(fmt)((K, N), 4)
            for int8x in (False, True):
                for R, Wp, U in configs:
                    try:
                        def launch(y, x, qs, d, R=R, Wp=Wp, U=U, int8x=int8x):
                            launch_warp_rows(y, x, qs, d, fmt, int8x, R, Wp, U)

                        t = bench._median(bench.time_gpu(launch, [(y, xd, qs, d)], repeat=repeat))
                        err = float(np.max(np.abs(y.copy_to_host() - ref)) / (np.max(np.abs(ref)) + 1e-30))
                        regs = None
                        try:
                            kern = make_warp_rows_kernel(fmt, int8x, R, Wp, U)
                            regs = int(next(iter(kern.get_regs_per_thread().values())))
                        except Exception:  # noqa: BLE001
                            pass
                        rows.append({"K": K, "N": N, "fmt": fmt, "int8x": int8x, "rows": R, "warps": Wp, "unroll": U,
                                     "median_s": t, "gbps": nbytes / t / 1e9, "registers": regs,
                                     "max_rel_err": err})
                    except Exception as e:  # noqa: BLE001  (a shape that fails is a result too)
                        rows.append({"K": K, "N": N, "fmt": fmt, "int8x": int8x, "rows": R, "warps": Wp, "unroll": U,
                                     "error": f"{type(e).__name__}: {e}"[:300]})
                    print(rows[-1], flush=True)
    res = {"what": "quantized GEMV rungs 6-7 (make_warp_rows_kernel) shape sweep: outputs per warp, warps per block, "
                   "chunks per trip",
           "rows": rows, "copy": None if device.SIMULATED else bench.measure_copy(), "meta": bench.environment()}
    if out:
        bench.save_json(res, out)
    return res


# The large capstone's decode products (K, N): QKV, attention out, MLP up, MLP down, the tied head (vocabulary 96).
DECODE_SIZES = [(768, 2304), (768, 768), (768, 3072), (3072, 768), (768, 96)]
SPLIT_SWEEP = [(16, 1), (8, 1), (4, 1), (4, 2), (2, 3), (2, 4), (1, 8)]


def split_sweep(out=None, sizes=DECODE_SIZES, configs=SPLIT_SWEEP, repeat=15):
    """Time rung 9 with each (rows per block, warps per row) in SPLIT_SWEEP, beside rungs 6 and 8 (default shapes), at
    the decode step's products (GPU, L2 flushed, CUDA events): GB/s on GGML's bytes and the error against the
    float64 reference. Which split a small product wants, measured rather than guessed."""
    from .. import bench
    from .quant import QUANT, packed_bytes, qgemv_ref

    rows = []
    rng = np.random.default_rng(0)
    for K, N in sizes:
        x = rng.standard_normal(K).astype(np.float32)
        W = rng.standard_normal((N, K)).astype(np.float32)
        for fmt in FORMATS:
            Wq = QUANT[fmt](W)
            ref = qgemv_ref(fmt)(x, Wq)
            qs, d = repack_gpu(Wq, fmt)
            xd = cuda.to_device(x)
            y = cuda.device_array(N, np.float32)
            nbytes = packed_bytes(fmt)((K, N), 4)
            cands = ([("packed_warp", None), ("packed_split", split_shape(fmt, K))]
                     + [("packed_prmt", c) for c in configs])
            for name, c in cands:
                def launch(y, x, qs, d, name=name, c=c):
                    if name == "packed_warp":
                        launch_warp_rows(y, x, qs, d, fmt, False)
                    else:
                        launch_split(y, x, qs, d, fmt, *c, prmt=name == "packed_prmt")

                try:
                    t = bench._median(bench.time_gpu(launch, [(y, xd, qs, d)], repeat=repeat))
                    err = float(np.max(np.abs(y.copy_to_host() - ref)) / (np.max(np.abs(ref)) + 1e-30))
                    rows.append({"K": K, "N": N, "fmt": fmt, "variant": name, "split": c,
                                 "default": c is None or tuple(c) == split_shape(fmt, K), "median_s": t,
                                 "gbps": nbytes / t / 1e9, "max_rel_err": err})
                except Exception as e:  # noqa: BLE001  (a shape that fails is a result too)
                    rows.append({"K": K, "N": N, "fmt": fmt, "variant": name, "split": c,
                                 "error": f"{type(e).__name__}: {e}"[:300]})
                print(rows[-1], flush=True)
    res = {"what": "quantized GEMV at the large capstone's decode shapes: rungs 6 and 8 (default shapes) and rung 9 "
                   "for each (rows per block, warps per row)",
           "rows": rows, "meta": bench.environment()}
    if out:
        bench.save_json(res, out)
    return res


WORDS_SWEEP = [(8, 1, 1), (8, 1, 2), (4, 2, 2), (2, 3, 1), (2, 4, 1), (1, 8, 1)]


def words_sweep(out=None, sizes=DECODE_SIZES, configs=WORDS_SWEEP, repeat=15):
    """Rung 10 with its default (rows per block, warps per row, words per lane) and each shape in WORDS_SWEEP, beside
    rungs 6 and 9, at the decode step's products (GPU, L2 flushed, CUDA events)."""
    from .. import bench
    from .quant import QUANT

    rows = []
    rng = np.random.default_rng(0)
    for K, N in sizes:
        x = rng.standard_normal(K).astype(np.float32)
        W = rng.standard_normal((N, K)).astype(np.float32)
        for fmt in FORMATS:
            Wq = QUANT[fmt](W)
            ref = qgemv_ref(fmt)(x, Wq)
            qs, d = repack_gpu(Wq, fmt)
            xd = cuda.to_device(x)
            y = cuda.device_array(N, np.float32)
            nbytes = packed_bytes(fmt)((K, N), 4)
            cands = ([("packed_warp", None), ("packed_prmt", split_shape(fmt, K)), ("packed_words", words_shape(fmt, K))]
                     + [("packed_words", c) for c in configs if c != words_shape(fmt, K)])
            for name, c in cands:
                def launch(y, x, qs, d, name=name, c=c):
                    if name == "packed_warp":
                        launch_warp_rows(y, x, qs, d, fmt, False)
                    elif name == "packed_prmt":
                        launch_split(y, x, qs, d, fmt, *c, prmt=True)
                    else:
                        launch_words(y, x, qs, d, fmt, *c)

                try:
                    t = bench._median(bench.time_gpu(launch, [(y, xd, qs, d)], repeat=repeat))
                    err = float(np.max(np.abs(y.copy_to_host() - ref)) / (np.max(np.abs(ref)) + 1e-30))
                    rows.append({"K": K, "N": N, "fmt": fmt, "variant": name, "shape": c,
                                 "default": name != "packed_words" or tuple(c) == words_shape(fmt, K),
                                 "median_s": t, "gbps": nbytes / t / 1e9, "max_rel_err": err})
                except Exception as e:  # noqa: BLE001
                    rows.append({"K": K, "N": N, "fmt": fmt, "variant": name, "shape": c,
                                 "error": f"{type(e).__name__}: {e}"[:300]})
                print(rows[-1], flush=True)
    res = {"what": "quantized GEMV at the large capstone's decode shapes: rungs 6 and 9 (default shapes) and rung 10 "
                   "for its default and other (rows per block, warps per row, words per lane)",
           "rows": rows, "meta": bench.environment()}
    if out:
        bench.save_json(res, out)
    return res
