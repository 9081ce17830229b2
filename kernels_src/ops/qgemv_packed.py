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
  gpu/packed_dp4a rung 6  x quantized to int8 per block of 32 inside the kernel (each lane quantizes its
                          own chunk: no second launch), then ``dp4a``: 4 int8 products summed per
                          instruction, one float scale per block (:mod:`kernels_src.compiler.inline_ptx`)
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ..compiler import cuda, dp4a, float32, float64, int32, int_as_float, load4
from .. import device
from ..device import ceil_div
from ..registry import register
from .quant import FORMATS, MAGIC, QK, _scales, q8act_tol

OFFSET4 = np.int32(-0x7F7F7F80)  # 0x80808080 as an int32: XOR flips the sign bit of each byte
ROWS = 8  # outputs per thread block
WARPS = 4  # warps per block: they split K
THREADS = 32 * WARPS

_repacked: dict = {}


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
    key = (id(Wq), fmt)
    hit = _repacked.get(key)
    if hit is not None and hit[0] is Wq:
        return hit[1]
    host = Wq.copy_to_host() if hasattr(Wq, "copy_to_host") else Wq
    qs, d = repack_host(host, fmt)
    out = (cuda.to_device(qs), cuda.to_device(d))
    if len(_repacked) >= 8:
        _repacked.pop(next(iter(_repacked)))
    _repacked[key] = (Wq, out)
    return out


@cuda.jit(device=True, inline=True)
def quantize_x8(v, idv):
    """One activation to int8 as llama.cpp's q8 activations do: round half away from zero of v/d."""
    p = v * idv
    r = int32(math.floor(abs(float64(p)) + 0.5))
    return r if p >= 0 else -r


@cuda.jit(device=True, inline=True)
def pack4(a, b, c, d):
    """Four int8 values (as int32) into one word, a in the lowest byte."""
    return int32((a & 0xFF) | ((b & 0xFF) << 8) | ((c & 0xFF) << 16) | ((d & 0xFF) << 24))


@cuda.jit(device=True, inline=True)
def block_reduce_store(y, part, acc, n0, rows, t, threads):
    """part (rows, threads) shared: each thread's partial sums, then a tree over the threads of a row."""
    for r in range(rows):
        part[r, t] = acc[r]
    cuda.syncthreads()
    s = threads // 2
    while s > 0:
        if t < s:
            for r in range(rows):
                part[r, t] += part[r, t + s]
        cuda.syncthreads()
        s //= 2
    if t < rows and n0 + t < y.size:
        y[n0 + t] = part[t, 0]


@functools.cache
def make_packed_kernel(fmt, int8x, rows=ROWS, warps=WARPS):
    """The rung-5 (int8x=False) or rung-6 (int8x=True) kernel for one format and block shape."""
    threads = 32 * warps
    q8 = fmt == "q8_0"
    WPC = 16 if q8 else 32  # weights per chunk (16 bytes of quants)

    if not int8x:
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
                    w0, w1, w2, w3 = load4(qs, n * (x.size // WPC) + c)
                    s = float32(0.0)
                    if q8:
                        for k in range(4):
                            v = int32((w0, w1, w2, w3)[k]) ^ OFFSET4  # int8 -> offset binary q + 128
                            for j in range(4):
                                f = int_as_float(MAGIC | ((v >> (8 * j)) & 0xFF)) - float32(8388736.0)  # 2^23+128
                                s += f * xv[4 * k + j]
                    else:
                        for k in range(4):
                            v = (w0, w1, w2, w3)[k]
                            for j in range(4):
                                lo = int_as_float(MAGIC | ((v >> (8 * j)) & 15)) - float32(8388616.0)  # 2^23+8
                                hi = int_as_float(MAGIC | ((v >> (8 * j + 4)) & 15)) - float32(8388616.0)
                                s += lo * xv[4 * k + j] + hi * xv[16 + 4 * k + j]
                    acc[r] += float32(d[n, b]) * s
            block_reduce_store(y, part, acc, n0, rows, t, threads)

        return kernel

    NX = 4 if q8 else 8  # words of int8 x a lane holds: its 16 (Q8_0) or 32 (Q4_0) activations

    @cuda.jit(fastmath=True)
    def kernel8(y, x, qs, d):
        t = cuda.threadIdx.y * 32 + cuda.threadIdx.x
        n0 = cuda.blockIdx.x * rows
        N = y.size
        C = x.size // WPC
        acc = cuda.local.array(rows, float32)
        xi = cuda.local.array(NX, int32)  # this lane's chunk of x as int8, 4 per word
        part = cuda.shared.array((rows, threads), float32)
        for r in range(rows):
            acc[r] = float32(0.0)
        for c in range(t, C, threads):
            b = c // 2 if q8 else c
            amax = float32(0.0)  # the block's scale needs all 32 of its activations
            for i in range(QK // 4):
                a0, a1, a2, a3 = load4(x, b * (QK // 4) + i)
                amax = max(amax, abs(a0), abs(a1), abs(a2), abs(a3))
            dx = amax / float32(127.0)
            idv = float32(1.0) / dx if dx != 0 else float32(0.0)
            first = (c - 2 * b) * 4 if q8 else 0  # Q8_0: the half of the block this lane owns
            for i in range(NX):
                a0, a1, a2, a3 = load4(x, b * (QK // 4) + first + i)
                xi[i] = pack4(quantize_x8(a0, idv), quantize_x8(a1, idv), quantize_x8(a2, idv),
                              quantize_x8(a3, idv))
            sx = int32(0)  # Q4_0 quants are stored as q + 8 (0..15): 8 * sum(x) comes off once per block
            if not q8:
                for i in range(NX):
                    sx = dp4a(xi[i], 0x01010101, sx)
            for r in range(rows):
                n = min(n0 + r, N - 1)
                w0, w1, w2, w3 = load4(qs, n * C + c)
                if q8:
                    s = dp4a(w0, xi[0], dp4a(w1, xi[1], dp4a(w2, xi[2], dp4a(w3, xi[3], 0))))
                else:  # byte j of the chunk holds element j (low nibble) and element j + 16 (high)
                    s = int32(-8 * sx)
                    s = dp4a(w0 & 0x0F0F0F0F, xi[0], s)
                    s = dp4a(w1 & 0x0F0F0F0F, xi[1], s)
                    s = dp4a(w2 & 0x0F0F0F0F, xi[2], s)
                    s = dp4a(w3 & 0x0F0F0F0F, xi[3], s)
                    s = dp4a((w0 >> 4) & 0x0F0F0F0F, xi[4], s)
                    s = dp4a((w1 >> 4) & 0x0F0F0F0F, xi[5], s)
                    s = dp4a((w2 >> 4) & 0x0F0F0F0F, xi[6], s)
                    s = dp4a((w3 >> 4) & 0x0F0F0F0F, xi[7], s)
                acc[r] += float32(d[n, b]) * dx * float32(s)
        block_reduce_store(y, part, acc, n0, rows, t, threads)

    return kernel8


SIG = "void(float32[::1], float32[::1], int32[:, ::1], float16[:, ::1])"
DOCS = {
    False: """Weights repacked once (quants apart from the fp16 scales, as llama.cpp's loaders do), so that a
        lane loads 16 bytes of quants in one instruction instead of 2; each block of {warps} warps computes
        {rows} outputs, x chunk reused from registers for all of them, the {rows} loads issued before the first
        is used. Same bytes as GGML's layout ({bpw} a weight). Predicted: >= 80 % of copy at 8192^2.""",
    True: """Rung 5 with integer products: each lane quantizes its own chunk of x to int8 (the scale of its
        block of 32, llama.cpp's q8 activations: no second launch) and multiplies with dp4a, 4 byte
        products summed per instruction, one float multiply per block. Rung 5 spends {ops} instructions per
        16 bytes of quants turning them into floats; this one about {ops8}. Predicted: >= 85 % of copy.""",
}


def _register(fmt):
    op = f"qgemv_{fmt}"
    bpw = {"q8_0": "1.0625 bytes", "q4_0": "0.5625 bytes"}[fmt]
    ops = {"q8_0": "~64", "q4_0": "~130"}[fmt]
    ops8 = {"q8_0": "6", "q4_0": "14"}[fmt]
    for rung, int8x in ((5, False), (6, True)):
        kern = make_packed_kernel(fmt, int8x)

        def fn(y, x, Wq, kern=kern):
            qs, d = repack_gpu(Wq, fmt)
            kern[max(1, ceil_div(y.size, ROWS)), (32, WARPS)](y, x, qs, d)

        fn.__doc__ = DOCS[int8x].format(warps=WARPS, rows=ROWS, bpw=bpw, ops=ops, ops8=ops8)
        extra = dict(tol=q8act_tol, edge_exempt="activations quantized to 8 bits per block of 32: a huge value "
                     "in a block rounds the block's other values away, by design") if int8x else {}
        register(op, "gpu", "packed_dp4a" if int8x else "packed", rung=rung, ptx=[(kern, SIG)], **extra)(fn)


for _f in FORMATS:
    _register(_f)


# Candidate block shapes (rows per block, warps per block) for rungs 5-6, timed by :func:`sweep`.
SWEEP = [(4, 4), (8, 4), (16, 4), (8, 2), (4, 8), (8, 8), (16, 2), (32, 4)]
SWEEP_SIZES = [(8192, 8192), (4096, 14336), (14336, 4096), (4096, 4096)]


def sweep(out=None, sizes=SWEEP_SIZES, configs=SWEEP, repeat=20):
    """Time rungs 5-6 for each block shape in SWEEP on the GPU (K, N sizes), with the GB/s on GGML's bytes
    and the largest difference from the float64 reference (a wrong shape shows up here)."""
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
                for R, Wp in configs:
                    try:
                        kern = make_packed_kernel(fmt, int8x, R, Wp)
                        grid = max(1, ceil_div(N, R))

                        def launch(y, x, qs, d, kern=kern, grid=grid, Wp=Wp):
                            kern[grid, (32, Wp)](y, x, qs, d)

                        t = bench._median(bench.time_gpu(launch, [(y, xd, qs, d)], repeat=repeat))
                        err = float(np.max(np.abs(y.copy_to_host() - ref)) / (np.max(np.abs(ref)) + 1e-30))
                        regs = None
                        try:
                            regs = int(next(iter(kern.get_regs_per_thread().values())))
                        except Exception:  # noqa: BLE001
                            pass
                        rows.append({"K": K, "N": N, "fmt": fmt, "int8x": int8x, "rows": R, "warps": Wp,
                                     "median_s": t, "gbps": nbytes / t / 1e9, "registers": regs,
                                     "max_rel_err": err})
                    except Exception as e:  # noqa: BLE001  (a shape that fails is a result too)
                        rows.append({"K": K, "N": N, "fmt": fmt, "int8x": int8x, "rows": R, "warps": Wp,
                                     "error": f"{type(e).__name__}: {e}"[:300]})
                    print(rows[-1], flush=True)
    res = {"what": "quantized GEMV rungs 5-6 (make_packed_kernel) block-shape sweep", "rows": rows,
           "copy": None if device.SIMULATED else bench.measure_copy(), "meta": bench.environment()}
    if out:
        bench.save_json(res, out)
    return res
