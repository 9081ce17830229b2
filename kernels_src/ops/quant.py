"""quant: int8 quantization, llama.cpp's Q8_0 / Q4_0 block formats, and GEMV on packed weights (chapter 11).

Shapes (fixed letters)
  W (K,N) fp32 weights of a linear layer, x (K,) activations, y (N,) = x W          (as in chapter 4)
  A quantized W is stored the way GGML stores a weight tensor: quantized *along K*, the reduction axis,
  one packed row per output column:   Wq (N, K/32 * BB) uint8,  row n = the blocks of W[:, n]
  so a block's scale multiplies 32 consecutive terms of one dot product. K must be a multiple of 32.

Block formats (bit-compatible with ggml/src/ggml-quants.c, quantize_row_q8_0_ref / quantize_row_q4_0_ref)
  Q8_0  34 bytes / 32 weights: d (fp16, little-endian) = amax/127, then qs[32] int8 = roundf(x * (1/d))
  Q4_0  18 bytes / 32 weights: d (fp16) = max/-8 (max = the signed value of largest magnitude, first one
        wins a tie), then qs[16] bytes: element j in the low nibble of byte j, element j+16 in the high
        nibble; q = min(15, (int8)(x * (1/d) + 8.5f)) (truncation), value = (q - 8) * d
  GGML computes in float32: id = 1/d from the *unrounded* float32 d, x*id and +8.5f rounded to float32,
  and only the stored d is rounded to fp16 (round to nearest even). The references below do the same.

How a packed weight reaches a registered variant: one C-contiguous uint8 array (N, K/32*BB). Kernels
read it through zero-copy views of the same bytes (every block starts at an even byte offset):
  Wq.view(float16)  (N, K/32*BB/2): the scale of block b of row n is element [n, b*BB/2]
  Wq.view(uint16)   the quants two bytes at a time (little-endian: the lower byte is the earlier one)
  Wq.view(int8)     Q8_0 quants one at a time

Ops
  q8_0_quantize, q4_0_quantize      X (M,K) fp32 -> Xq (M, K/32*BB) uint8     (bit-exact)
  q8_0_dequantize, q4_0_dequantize  Xq -> X (M,K) fp32                        (exact: q*d in fp32)
  quantize ladder (CPU): njit (1), prange (2), fused (3: one pass, fp16 scale in the kernel), simd (4: a
  block is two 16-float registers, kernels_src/compiler/cpuint8.py's integer-vector intrinsics)
  qgemv_q8_0, qgemv_q4_0            y (N,) = x (K,) . dequant(Wq)^T, the dequantizing GEMV
Cost of the GEMV: 2KN FLOPs; bytes = packed weights (N*K/32*BB) + 4K + 4N: 1.0625 (Q8_0) and 0.5625
(Q4_0) bytes per weight instead of 4, so a memory-bound GEMV should be 3.76x / 7.1x faster than fp32.

Ladder (both formats)
  cpu/numpy           baseline  x @ W in fp32 on the dequantized weights (BLAS sgemv, 4 bytes per weight)
  cpu/dequant_then_dot rung 1   dequantize all of W to fp32, then a dot product per column
  cpu/fused           rung 2    dequantize in registers inside the dot product: fp32 W never exists
  cpu/fused_prange    rung 3    rung 2 with the columns split over cores
  cpu/q8act_prange    rung 4    llama.cpp's CPU path: x quantized to int8 blocks, int32 dot per block
  cpu/packed_rows4    rung 5    weights repacked once (quants apart from float32 scales, as fast loaders
                                do); 4 rows per step share each x load, so the 32-term loop vectorizes
  cpu/packed_simd     rung 6    rung 5 on explicit 16-lane vectors, one accumulator per output for all of K
  cpu/packed_q8act    rung 7    rung 6 with x quantized to int8 blocks: exact int32 block dot products with
                                vpmaddwd (cpuint8.vdot_i8x32 / vdot_q4x32), one conversion and one FMA per block
  gpu/torch           baseline  torch fp32 x @ W on the dequantized weights (cuBLAS)
  gpu/fp32_gemv       baseline  chapter 4's best fp32 x@W GEMV (gemv/splitk_grid) on the dequantized weights
  gpu/thread_per_row  rung 1    one thread per output walks its packed row: lanes 34/18*K/32 bytes apart
  gpu/warp_per_row    rung 2    one warp per output, lane = element of a block: coalesced byte loads
  gpu/rows            rung 3    8 weights per lane from 2-byte loads, x reused from registers for 8 outputs
  gpu/q8act           rung 4    rung 3 with x first quantized to int8 blocks (llama.cpp's q8 activations):
                                integer products, int32 sums, one float scale per block
  gpu/packed          rung 5    weights repacked (quants apart from the fp16 scales): 16-byte loads  (qgemv_packed.py)
  gpu/packed_warp     rung 6    a warp owns a few rows and walks all of K, every load of a trip issued first
  gpu/packed_dp4a     rung 7    rung 6 with x quantized to int8 first and dp4a (inline PTX) products
  gpu/packed_split    rung 8    small products (a decode step's): one 16-byte chunk a lane, warps split long rows
  gpu/packed_prmt     rung 9    rung 8 with one prmt (byte_perm) per weight to make it a float
"""
from __future__ import annotations

import math

import numpy as np
from ..compiler import cuda, float32, float32_bits, float32_from_bits, float64, int32, njit, prange
from ..compiler.cpuint8 import (vabsmax_bits16, vandi16, vcvt16, vdot_i8x32, vdot_q4x32, vfirst_absbits16, vload_i8x16,
                               vload_i8x32_i16, vload_u8x16, vmini16, vmul16, vround_away16, vshri16, vstore_bytes16,
                               vstore_nibbles16, vsub16, vsum16, vtrunc16)
from ..compiler.cpusimd import vadd16, vfma16, vload16, vsplat16, vzero16

from ..paths import BENCH_DATA
from .. import device
from ..device import ceil_div
from ..registry import define_op, register

QK = 32  # weights per block, both formats
FORMATS = {"q8_0": 34, "q4_0": 18}  # bytes per block
EPS32 = float(np.finfo(np.float32).eps)


# ============================================================================ float64/float32 references
# Non-finite inputs, the course's rule (issue 36); every quantize rung follows it, tests/test_quant_edge_blocks.py
# checks them all on such blocks, byte for byte.
#   * Q4_0 follows GGML's loop exactly: `if (amax < fabsf(v)) { amax = fabsf(v); max = v; }` is false for a NaN,
#     so a NaN never becomes the block's max, and a block with no |v| > 0 keeps the initial max = +0, so
#     d = +0/-8 = -0.0 (fp16 0x8000) whatever the signs of its zeros.
#   * Q8_0: GGML's `amax = MAX(amax, fabsf(v))`, MAX(a, b) = a > b ? a : b, lets a NaN *reset* the running max
#     (the scale then depends on where the NaN sits; GGML's SIMD quantizers, built on maxps, which returns its
#     second operand when either is NaN, depend on the lane). The course gives Q8_0 Q4_0's rule: a NaN never
#     sets amax (Python's and Numba's max(amax, |v|) already do that). Blocks with a NaN are the only ones
#     where our Q8_0 bytes may differ from GGML's reference.
#   * A quantized value that is not finite (a NaN input; inf * 0 when the scale is infinite; x * an infinite
#     1/d when d is a tiny subnormal) stores 0. C's (int8_t) conversion of it is undefined; x86's cvttss2si
#     gives 0x80000000, whose low byte 0 is what GGML's compiled loop, and our scalar CPU rungs, store.
def _round_half_away(v32):
    """C's roundf on float32 values (ties away from zero), exactly: done in float64, where |v| + 0.5 is exact."""
    v = np.asarray(v32, dtype=np.float64)
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def q8_0_quantize_ref(X):
    """GGML's quantize_row_q8_0_ref, row by row: X (M,K) -> bytes (M, K/32*34). float32 arithmetic
    on purpose: bit-compatibility is defined by GGML's float32 steps. Non-finite values follow the course's
    rule (above): a NaN never sets amax, and a quantized value that is not finite stores 0."""
    X = np.asarray(X, dtype=np.float32)
    M, K = X.shape
    xb = X.reshape(M, K // QK, QK)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        a = np.abs(xb)
        amax = np.where(np.isnan(a), np.float32(0), a).max(axis=2) if K else np.zeros((M, 0), np.float32)
        d = (amax / np.float32(127)).astype(np.float32)
        idv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
        p = (xb * idv[..., None]).astype(np.float32)  # inf * 0 or NaN: NaN; x * an overflowed id: inf
        q = np.where(np.isfinite(p), _round_half_away(np.where(np.isfinite(p), p, np.float32(0))), 0)
    out = np.empty((M, K // QK, 34), dtype=np.uint8)
    out[..., 0:2] = d.astype(np.float16)[..., None].view(np.uint8)
    out[..., 2:] = q.astype(np.int8).view(np.uint8)
    return out.reshape(M, -1)


def q4_0_quantize_ref(X):
    """GGML's quantize_row_q4_0_ref, row by row: X (M,K) -> bytes (M, K/32*18), in float32 arithmetic.
    GGML's loop is `amax = max = 0; for v in block: if (amax < fabsf(v)) { amax = fabsf(v); max = v; }`:
    the first of equal magnitudes wins, a NaN never wins (the comparison is false), and a block with no
    |v| > 0 keeps max = +0, so d = +0/-8 = -0.0 (fp16 bits 0x8000) whatever the signs of its zeros.
    A quantized value x*id + 8.5 that is not finite stores 0 (the rule above)."""
    X = np.asarray(X, dtype=np.float32)
    M, K = X.shape
    nb = K // QK
    xb = X.reshape(M, nb, QK)
    a = np.abs(xb)
    a = np.where(np.isnan(a), np.float32(0), a)  # `amax < NaN` is false: a NaN is never the max
    i = a.argmax(axis=2) if nb else np.zeros((M, 0), np.int64)  # the first of equal magnitudes, as GGML
    mx = np.take_along_axis(xb, i[..., None], axis=2)[..., 0] if nb else np.zeros((M, 0), np.float32)
    if nb:
        mx = np.where(a.max(axis=2) > 0, mx, np.float32(0))  # no |v| > 0: GGML's max stays the initial +0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = (mx / np.float32(-8)).astype(np.float32)
        idv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
        v = ((xb * idv[..., None]).astype(np.float32) + np.float32(8.5)).astype(np.float32)
        # (int8_t) truncates toward zero; a finite v lies in [0.49, 16.5], a non-finite one stores 0
        q = np.where(np.isfinite(v), np.minimum(15, np.trunc(np.where(np.isfinite(v), v, 0))), 0).astype(np.uint8)
    out = np.empty((M, nb, 18), dtype=np.uint8)
    out[..., 0:2] = d.astype(np.float16)[..., None].view(np.uint8)
    out[..., 2:] = q[..., :16] | (q[..., 16:] << 4)
    return out.reshape(M, -1)


def q8_0_dequantize_ref(Xq):
    """Q8_0 bytes (M, nb*34) -> float64 (M, nb*32): qs * d."""
    Xq = np.ascontiguousarray(Xq, dtype=np.uint8)
    M = Xq.shape[0]
    b = Xq.reshape(M, -1, 34)
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    q = b[..., 2:].copy().view(np.int8).astype(np.float64)
    return (q * d[..., None]).reshape(M, -1)


def q4_0_unpack(Xq):
    """Q4_0 bytes (M, nb*18) -> (q (M, nb, 32) in 0..15, d (M, nb) as float64)."""
    Xq = np.ascontiguousarray(Xq, dtype=np.uint8)
    M = Xq.shape[0]
    b = Xq.reshape(M, -1, 18)
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    qs = b[..., 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=2)  # elements 0..15 low nibbles, 16..31 high nibbles
    return q, d


def q4_0_dequantize_ref(Xq):
    """Q4_0 bytes (M, nb*18) -> float64 (M, nb*32): (q - 8) * d."""
    q, d = q4_0_unpack(Xq)
    return ((q.astype(np.float64) - 8.0) * d[..., None]).reshape(q.shape[0], -1)


DEQUANT = {"q8_0": q8_0_dequantize_ref, "q4_0": q4_0_dequantize_ref}
QUANT = {"q8_0": q8_0_quantize_ref, "q4_0": q4_0_quantize_ref}


def qgemv_ref(fmt):
    def reference(x, Wq):
        """float64 oracle: y = x . dequant(Wq)^T (Wq row n holds column n of W)."""
        return DEQUANT[fmt](Wq) @ np.asarray(x, dtype=np.float64)

    reference.__name__ = f"qgemv_{fmt}_reference"
    return reference


# ============================================================================ int8 from first principles
def int8_symmetric(w, axis=None, block=None):
    """Symmetric (absmax) int8: scale = amax/127, q = round(w/scale) in [-127, 127], w_hat = q*scale.
    Scales per tensor (axis=None, block=None), per row (axis=1) or per block of `block` along the last
    axis. Returns (w_hat float64, q int8, scale)."""
    w = np.asarray(w, dtype=np.float64)
    g = _groups(w, axis, block)
    amax = np.abs(g).max(axis=-1, keepdims=True)
    scale = np.where(amax > 0, amax / 127.0, 1.0)
    q = np.clip(np.rint(g / scale), -127, 127)
    return (q * scale).reshape(w.shape), q.astype(np.int8).reshape(w.shape), scale[..., 0]


def int8_asymmetric(w, axis=None, block=None):
    """Asymmetric (zero-point) int8: the range [lo, hi] (stretched to include 0, so 0 is exact) maps onto
    [-128, 127]: scale = (hi - lo)/255, zp = round(-lo/scale) - 128, q = clip(round(w/scale) + zp),
    w_hat = (q - zp)*scale. Returns (w_hat, q, scale, zp)."""
    w = np.asarray(w, dtype=np.float64)
    g = _groups(w, axis, block)
    lo = np.minimum(g.min(axis=-1, keepdims=True), 0.0)
    hi = np.maximum(g.max(axis=-1, keepdims=True), 0.0)
    scale = np.where(hi > lo, (hi - lo) / 255.0, 1.0)
    zp = np.rint(-lo / scale) - 128
    q = np.clip(np.rint(g / scale) + zp, -128, 127)
    return ((q - zp) * scale).reshape(w.shape), q.astype(np.int8).reshape(w.shape), scale[..., 0], zp[..., 0]


def _groups(w, axis, block):
    if block is not None:
        return w.reshape(*w.shape[:-1], w.shape[-1] // block, block)
    if axis is None:
        return w.reshape(1, -1)
    return w.reshape(w.shape[0], -1)


def errors(w, w_hat):
    """MSE, max |error| and SNR in dB (10 log10 of signal power over error power)."""
    w = np.asarray(w, dtype=np.float64)
    e = np.asarray(w_hat, dtype=np.float64) - w
    mse = float(np.mean(e * e))
    snr = 10 * math.log10(float(np.mean(w * w)) / mse) if mse > 0 else math.inf
    return {"mse": mse, "max": float(np.abs(e).max()), "snr_db": snr}


def outlier_weights(shape, rng, outlier_frac=0.001, outlier_scale=20.0, std=0.02):
    """Gaussian weights (std 0.02, as in an initialised transformer) with a few heavy-tailed outliers:
    a fraction `outlier_frac` of entries multiplied by `outlier_scale` (the "massive weights" seen in LLMs)."""
    w = rng.standard_normal(shape) * std
    mask = rng.random(shape) < outlier_frac
    w[mask] *= outlier_scale
    return w.astype(np.float32)


def int8_asym_roundtrip_ref(X):
    """Asymmetric per-row int8 quantize then dequantize (the exercise's oracle), float64."""
    return int8_asymmetric(np.asarray(X, dtype=np.float64), axis=1)[0]


# ============================================================================ inputs, sizes, tolerances
def quant_inputs(size, dtype, rng):
    M, K = size
    return (rng.standard_normal((M, K)) * rng.choice([0.02, 1.0, 30.0])).astype(np.float32),


def make_quant_edge_inputs(size, dtype, rng):
    """Blocks where hand-rolled quantizers go wrong: all zeros (d = 0, so 1/d must not be taken), a
    tie between +a and -a (the first wins, and it sets the sign of a Q4_0 scale), values that land on
    .5 after scaling (roundf's ties), a lone outlier, a block so small that d underflows fp16 to 0."""
    (X,) = quant_inputs(size, dtype, rng)
    M, K = X.shape
    blocks = X.reshape(M, K // QK, QK)
    flat = blocks.reshape(-1, QK)
    kinds = [np.zeros(QK), np.r_[[-3.0, 3.0], rng.uniform(-2, 2, QK - 2)],
             np.r_[[127.0, 63.5, -0.5, 1.5], np.arange(QK - 4) - 12.5], np.r_[[1e3], rng.standard_normal(QK - 1)],
             rng.standard_normal(QK) * 1e-7, -np.abs(rng.standard_normal(QK)), np.r_[[8.0, -4.0], np.full(QK - 2, 0.5)]]
    for i, p in enumerate(rng.permutation(flat.shape[0])[: len(kinds)]):
        flat[p] = kinds[i % len(kinds)]
    return (blocks.reshape(M, K).astype(np.float32),)


def nonfinite_blocks(rng):
    """Blocks of 32 on which the rule above the references decides the bytes (issue 36): NaN first, last, before
    and after the max, alone, among zeros; +inf, -inf, both, inf with NaN; -0.0 only, +0 only, mixed zeros; a
    max so small (subnormal) that 1/d overflows to inf; and one block with a bit of everything."""
    nan, inf, z = np.nan, np.inf, np.zeros(QK)

    def put(base, pos, vals):
        b = np.array(base, dtype=np.float64)
        b[pos] = vals
        return b

    r = lambda: rng.standard_normal(QK)  # noqa: E731
    return [put(r(), [3], [nan]), put(r(), [0], [nan]), put(r(), [31], [nan]), put(r(), [5, 20], [nan, 40.0]),
            put(r(), [5, 20], [40.0, nan]), np.full(QK, nan), put(z, [7], [nan]), put(z, [7, 8], [-0.0, nan]),
            put(r(), [4], [inf]), put(r(), [4], [-inf]), put(r(), [2, 9], [-inf, inf]), put(r(), [1, 6], [nan, inf]),
            np.full(QK, -inf), np.full(QK, -0.0), z.copy(), put(z, [0, 3], [-0.0, -0.0]), put(-z, [10], [0.0]),
            r() * 1e-39, put(z, [0, 1], [-1e-40, 5e-41]), np.full(QK, 1.4e-45), put(-z, [30], [-1.4e-45]),
            put(r() * 1e-39, [8], [nan]), np.r_[[-0.0, nan, inf, -inf, 0.0, 1e-40, -3.0, 3.0], r()[: QK - 8]]]


def make_quant_nonfinite_edge_inputs(size, dtype, rng):
    """The quantize ops' edge inputs: the blocks of nonfinite_blocks first, then make_quant_edge_inputs' kinds,
    in as many random blocks as the size holds (its largest simulator size takes the first 14).
    (make_quant_edge_inputs itself stays as it is: the chapter's graded exercise reads it.)"""
    (X,) = quant_inputs(size, dtype, rng)
    M, K = X.shape
    flat = X.reshape(-1, QK)
    kinds = nonfinite_blocks(rng) + [np.zeros(QK), np.r_[[-3.0, 3.0], rng.uniform(-2, 2, QK - 2)],
                                     np.r_[[1e3], rng.standard_normal(QK - 1)], rng.standard_normal(QK) * 1e-7]
    for i, p in enumerate(rng.permutation(flat.shape[0])[: len(kinds)]):
        flat[p] = kinds[i]
    return (X.astype(np.float32),)


def dequant_inputs(fmt):
    def make(size, dtype, rng):
        M, K = size
        return QUANT[fmt](quant_inputs((M, K), dtype, rng)[0]),
    return make


def dequant_edge_inputs(fmt):
    def make(size, dtype, rng):
        """Packed blocks with random bytes (every nibble and int8 value, including -128, which GGML never
        writes but must still decode), and scales of 0, negative, tiny (subnormal fp16) and large."""
        M, K = size
        nb, BB = K // QK, FORMATS[fmt]
        b = rng.integers(0, 256, size=(M, nb, BB), dtype=np.uint8)
        d = rng.choice([0.0, -0.0, 1e-3, -2.5e-2, 6e-8, -1.0e3, 0.1, -0.1], size=(M, nb)).astype(np.float16)
        b[..., 0:2] = d[..., None].view(np.uint8)
        return (b.reshape(M, nb * BB),)
    return make


def qgemv_inputs(fmt):
    def make(size, dtype, rng):
        K, N = size
        W = rng.standard_normal((N, K)).astype(np.float32)  # column n of W, stored as row n (GGML layout)
        return rng.standard_normal(K).astype(np.float32), QUANT[fmt](W)
    return make


def make_qgemv_edge_inputs(size, dtype, rng):
    """Q8_0 GEMV edge inputs: x with zeros, huge (1e30: products stay finite) and tiny values; weight
    blocks with d = 0 and with a single outlier."""
    K, N = size
    x = rng.standard_normal(K).astype(np.float32)
    x[rng.permutation(K)[:3]] = [0.0, 1e-30, 1e30][: min(3, K)] if K >= 3 else 0.0
    W = rng.standard_normal((N, K)).astype(np.float32)
    W[rng.permutation(N)[0], :QK] = 0.0
    W[rng.permutation(N)[0], rng.integers(K)] = 1e4
    return x, q8_0_quantize_ref(W)


def qgemv_tol(size, dtype):
    """The kernels compute exactly what the reference does, in float32: d*q is exact in float32 and
    the K-term dot product picks up rounding like chapter 4's GEMV: ~eps*sqrt(K) relative, plus an
    absolute term for sums that cancel (the output has size ~sqrt(K) * |W|, |W| ~ 3 after Q4_0)."""
    K = size[0]
    return 1e-5 + 4 * EPS32 * math.sqrt(K), 1e-6 + 16 * EPS32 * K


def q8act_tol(size, dtype):
    """The int8-activation rung computes x_hat . W, with x rounded to int8 per block of 32: each x_k moves
    by at most d_x/2 = amax_block/254, a uniform error of std ~ amax/440 ~ 0.01 for unit normals
    (amax of 32 normals < 4.5), and y moves by a random walk of K such errors times |W| ~ 1 (Q4_0: ~1.2):
    std ~ 0.012 sqrt(K). Allowed: 8x that. A dropped block of 32 terms moves y by ~sqrt(32) = 5.7, far
    outside the band at every K we check."""
    K = size[0]
    return 1e-5, 0.1 * math.sqrt(K)


QSIZES = {"check": [(1, 32), (7, 96), (13, 224), (3, 1184), (129, 64)],
          "check_sim": [(1, 32), (7, 64), (3, 96)],
          "bench": [(4096, 4096)], "bench_gpu": [(8192, 8192)], "bench_sim": [(7, 64)]}
GSIZES = {"check": [(32, 1), (96, 7), (224, 13), (1184, 129), (4096, 37), (64, 999)],
          "check_sim": [(32, 1), (64, 7), (96, 3), (160, 33)],
          "bench": [(4096, 4096)], "bench_cpu": [(4096, 4096), (8192, 8192)],
          "bench_gpu": [(4096, 4096), (8192, 8192), (4096, 14336), (14336, 4096)], "bench_sim": [(64, 7)]}


def packed_bytes(fmt):
    BB = FORMATS[fmt]
    return lambda s, b: s[1] * (s[0] // QK) * BB + 4 * s[0] + 4 * s[1]


def fp32_bytes(s, b):
    return (s[0] * s[1] + s[0] + s[1]) * 4


for _f, _BB in FORMATS.items():
    define_op(f"{_f}_quantize", reference=QUANT[_f], make_inputs=quant_inputs, chapter=11,
              title=f"{_f.upper()} quantize: X (M,K) fp32 -> GGML blocks", size_names=("M", "K"), kind="memory",
              output_names=("Xq",), tol=(0.0, 0.0), flops=lambda s: 4 * s[0] * s[1],
              bytes=(lambda BB: lambda s, b: s[0] * s[1] * 4 + s[0] * s[1] // QK * BB)(_BB), sizes=QSIZES)
    define_op(f"{_f}_dequantize", reference=DEQUANT[_f], make_inputs=dequant_inputs(_f), chapter=11,
              title=f"{_f.upper()} dequantize: GGML blocks -> X (M,K) fp32", size_names=("M", "K"),
              kind="memory", output_names=("X",), tol=(0.0, 0.0), flops=lambda s: s[0] * s[1],
              bytes=(lambda BB: lambda s, b: s[0] * s[1] * 4 + s[0] * s[1] // QK * BB)(_BB), sizes=QSIZES)
    define_op(f"qgemv_{_f}", reference=qgemv_ref(_f), make_inputs=qgemv_inputs(_f), chapter=11,
              title=f"dequantizing GEMV y = x W, W in {_f.upper()}", size_names=("K", "N"), kind="memory",
              output_names=("y",), tol=qgemv_tol, flops=lambda s: 2 * s[0] * s[1], bytes=packed_bytes(_f),
              sizes=GSIZES)


def make_edge_inputs(size, dtype, rng):
    """Edge inputs for the graded ops of this module (the grader looks this name up): quantize ops get
    tricky blocks; dequantize ops random bytes with odd scales; GEMVs odd x and weight blocks."""
    return make_quant_edge_inputs(size, dtype, rng)


# ============================================================================ CPU kernels (numba)
@njit(cache=True)
def f16_to_f32(h):
    """fp16 bits (a uint16) -> float32, for CPU kernels (Numba's CPU target has no float16 type):
    sign, 5 exponent bits (bias 15), 10 mantissa bits; exponent 0 means subnormal, 31 inf/NaN."""
    h = np.int32(h)
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0:
        v = math.ldexp(np.float64(m), -24)
    elif e == 31:
        v = np.inf if m == 0 else np.nan
    else:
        v = math.ldexp(np.float64(m | 0x400), e - 25)
    return np.float32(-v if h & 0x8000 else v)


@njit(cache=True)
def _q8_0_quantize_rows(out, X, dh):
    # X (M,K) f32 -> out (M, nb*34) u8; dh (M, nb) f16 receives the scales (written into out afterwards)
    M, K = X.shape
    for m in range(M):
        for b in range(K // QK):
            amax = np.float32(0.0)
            for j in range(QK):
                amax = max(amax, abs(X[m, b * QK + j]))  # max(a, b) keeps a unless b > a: a NaN never wins
            d = amax / np.float32(127.0)
            idv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
            dh[m, b] = d
            o = b * 34
            for j in range(QK):
                v = np.float64(X[m, b * QK + j] * idv)  # the product is rounded to float32 first, as in C
                r = math.floor(abs(v) + 0.5)  # roundf: ties away from zero
                q = int(r) if v >= 0 else -int(r)  # v not finite: int() gives 0x8000000000000000, low byte 0
                out[m, o + 2 + j] = q & 0xFF


@njit(cache=True)
def _q4_0_quantize_rows(out, X, dh):
    M, K = X.shape
    for m in range(M):
        for b in range(K // QK):
            amax = np.float32(0.0)
            mx = np.float32(0.0)
            for j in range(QK):
                v = X[m, b * QK + j]
                if amax < abs(v):  # strict: the first of equal magnitudes wins, as in GGML
                    amax = abs(v)
                    mx = v
            d = mx / np.float32(-8.0)
            idv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
            dh[m, b] = d
            o = b * 18
            for j in range(16):
                v0 = np.float32(np.float64(X[m, b * QK + j] * idv) + 8.5)  # float32 multiply, float32 add
                v1 = np.float32(np.float64(X[m, b * QK + 16 + j] * idv) + 8.5)
                q0 = min(15, int(v0))  # int() truncates toward zero, like (int8_t)
                q1 = min(15, int(v1))
                out[m, o + 2 + j] = q0 | (q1 << 4)


def _write_scales(out, dh, BB):
    M, nb = dh.shape
    out.reshape(M, nb, BB)[..., 0:2] = dh.view(np.uint8).reshape(M, nb, 2)


@register("q8_0_quantize", "cpu", "njit", rung=1, dtypes=("float32",))
def q8_0_quantize_cpu(out, X):
    """GGML's reference loop compiled with @njit: amax, d = amax/127, q = roundf(x * (1/d)), per block.
    Bit-exact by construction (same float32 steps); a scalar loop, predicted ~1 GB/s of input."""
    dh = np.empty((X.shape[0], X.shape[1] // QK), np.float16)
    dq = np.empty(dh.shape, np.float32)
    _q8_0_quantize_rows(out, X, dq)
    dh[...] = dq  # float32 -> fp16, round to nearest even (what GGML_FP32_TO_FP16 does)
    _write_scales(out, dh, 34)


@register("q4_0_quantize", "cpu", "njit", rung=1)
def q4_0_quantize_cpu(out, X):
    """GGML's reference loop compiled with @njit: signed max, d = max/-8, q = min(15, int(x*(1/d) + 8.5)),
    two nibbles per byte. Bit-exact by construction; predicted ~1 GB/s of input."""
    dq = np.empty((X.shape[0], X.shape[1] // QK), np.float32)
    _q4_0_quantize_rows(out, X, dq)
    _write_scales(out, dq.astype(np.float16), 18)


@njit(cache=True)
def _q8_0_dequant_rows(out, qs, dh):
    M, nb = dh.shape
    for m in range(M):
        for b in range(nb):
            d = np.float32(dh[m, b])
            for j in range(QK):
                out[m, b * QK + j] = np.float32(qs[m, b * 34 + 2 + j]) * d


@njit(cache=True)
def _q4_0_dequant_rows(out, Xq, dh):
    M, nb = dh.shape
    for m in range(M):
        for b in range(nb):
            d = np.float32(dh[m, b])
            o = b * 18 + 2
            for j in range(16):
                byte = Xq[m, o + j]
                out[m, b * QK + j] = np.float32((byte & 0x0F) - 8) * d
                out[m, b * QK + j + 16] = np.float32((byte >> 4) - 8) * d


def _scales(Xq, BB):
    M = Xq.shape[0]
    return np.ascontiguousarray(Xq.reshape(M, -1, BB)[..., 0:2]).view(np.float16)[..., 0]


@register("q8_0_dequantize", "cpu", "njit", rung=1)
def q8_0_dequantize_cpu(out, Xq):
    """qs * d per block, compiled: one int8 and a shared scale per 32 outputs. Predicted: a few GB/s."""
    _q8_0_dequant_rows(out, Xq.view(np.int8), _scales(Xq, 34).astype(np.float32))


@register("q4_0_dequantize", "cpu", "njit", rung=1)
def q4_0_dequantize_cpu(out, Xq):
    """(nibble - 8) * d, low nibbles to elements 0..15 and high nibbles to 16..31 of each block."""
    _q4_0_dequant_rows(out, Xq, _scales(Xq, 18).astype(np.float32))


# ------------------------------------------------ CPU rung 2 (issue 36): the same loops, rows over the cores
# Rung 1's code with the row loop made a prange: each core takes whole rows (K/32 blocks each), long contiguous
# runs of reads and writes. (A first version spread single 32-value blocks over the cores with vectorized
# 32-iteration loops; on one core it ran ~1.8x slower than rung 1: the alias checks and loop set-up per 32
# values cost more than the SIMD saved.)
@njit(cache=True, parallel=True)
def _q8_0_quantize_prange(out, X, dh):
    M, K = X.shape
    for m in prange(M):
        for b in range(K // QK):
            amax = np.float32(0.0)
            for j in range(QK):
                amax = max(amax, abs(X[m, b * QK + j]))
            d = amax / np.float32(127.0)
            idv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
            dh[m, b] = d
            o = b * 34
            for j in range(QK):
                v = np.float64(X[m, b * QK + j] * idv)  # the product is rounded to float32 first, as in C
                r = math.floor(abs(v) + 0.5)  # roundf: ties away from zero
                q = int(r) if v >= 0 else -int(r)
                out[m, o + 2 + j] = q & 0xFF


@njit(cache=True, parallel=True)
def _q4_0_quantize_prange(out, X, dh):
    M, K = X.shape
    for m in prange(M):
        for b in range(K // QK):
            amax = np.float32(0.0)
            mx = np.float32(0.0)
            for j in range(QK):
                v = X[m, b * QK + j]
                if amax < abs(v):  # strict: the first of equal magnitudes wins, as in GGML
                    amax = abs(v)
                    mx = v
            d = mx / np.float32(-8.0)
            idv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
            dh[m, b] = d
            o = b * 18
            for j in range(16):
                v0 = np.float32(np.float64(X[m, b * QK + j] * idv) + 8.5)  # float32 multiply, float32 add
                v1 = np.float32(np.float64(X[m, b * QK + 16 + j] * idv) + 8.5)
                q0 = min(15, int(v0))  # int() truncates toward zero, like (int8_t)
                q1 = min(15, int(v1))
                out[m, o + 2 + j] = q0 | (q1 << 4)


@njit(cache=True, parallel=True)
def _q8_0_dequant_prange(out, qs, dh):
    M, nb = dh.shape
    for m in prange(M):
        for b in range(nb):
            d = np.float32(dh[m, b])
            for j in range(QK):
                out[m, b * QK + j] = np.float32(qs[m, b * 34 + 2 + j]) * d


@njit(cache=True, parallel=True)
def _q4_0_dequant_prange(out, Xq, dh):
    M, nb = dh.shape
    for m in prange(M):
        for b in range(nb):
            d = np.float32(dh[m, b])
            o = b * 18 + 2
            for j in range(16):
                byte = Xq[m, o + j]
                out[m, b * QK + j] = np.float32((byte & 0x0F) - 8) * d
                out[m, b * QK + j + 16] = np.float32((byte >> 4) - 8) * d


@register("q8_0_quantize", "cpu", "prange", rung=2, dtypes=("float32",))
def q8_0_quantize_prange(out, X):
    """Rung 1's loop with its rows over the cores (prange; blocks are independent, so the bytes are the same).
    Reads 4 B and writes 1.06 B per value; rung 1 ran at ~3 % of copy, bound by its scalar float64 roundf per
    value (what keeps it bit-exact), so predict ~2x rung 1 on 2 cores, still compute-bound."""
    dq = np.empty((X.shape[0], X.shape[1] // QK), np.float32)
    _q8_0_quantize_prange(out, X, dq)
    _write_scales(out, dq.astype(np.float16), 34)


@register("q4_0_quantize", "cpu", "prange", rung=2)
def q4_0_quantize_prange(out, X):
    """Rung 1's loop with its rows over the cores. Compute-bound like Q8_0's: predict ~2x rung 1 on 2 cores."""
    dq = np.empty((X.shape[0], X.shape[1] // QK), np.float32)
    _q4_0_quantize_prange(out, X, dq)
    _write_scales(out, dq.astype(np.float16), 18)


@register("q8_0_dequantize", "cpu", "prange", rung=2)
def q8_0_dequantize_prange(out, Xq):
    """Rung 1's loop with its rows over the cores: 32 int8 -> float32 conversions and multiplies per scale.
    Rung 1 ran at ~10-14 % of copy on one core; predict ~2x that on 2 cores."""
    _q8_0_dequant_prange(out, Xq.view(np.int8), _scales(Xq, 34).astype(np.float32))


@register("q4_0_dequantize", "cpu", "prange", rung=2)
def q4_0_dequantize_prange(out, Xq):
    """Rung 1's loop with its rows over the cores: predict ~2x rung 1 on 2 cores."""
    _q4_0_dequant_prange(out, Xq, _scales(Xq, 18).astype(np.float32))


# ------------------------------------------------ CPU rung 3 (issue 36): one pass, SIMD, still bit-exact
# `kernels asm` and a profile of rung 2 show three costs besides the bytes: (1) the fp16 scales go through NumPy
# passes around the kernel (a strided copy of the scale bytes and an astype to float32 before a dequantize; a
# float32 array, an astype to fp16 and a strided write into the blocks after a quantize), each a pass over
# M*K/32 scales at NumPy speed; (2) Q8_0's roundf is scalar float64 (floor, compare, two conversions per value);
# (3) the block's amax is a chain of scalar compares. Rung 3:
#   * converts the scales inside the kernel, one per 32 values, with integer bit operations (_f16_bits,
#     _f16_value): round to nearest even, as NumPy's astype(float16), and exact the other way;
#   * takes the amax from the bits: |x| is x's int32 bits with the sign bit cleared, and for non-negative floats
#     integer order is float order. An integer max reduction vectorizes without fast-math flags (vpmaxsd). NaN's
#     bits lie above inf's, so a block whose max comes out a NaN is scanned again without its NaNs (the rule
#     above the references: a NaN never sets the scale), a rare branch per block;
#   * does Q8_0's roundf in float32: t = trunc(v), f = v - t is exact (same binade), and q = t + (f >= 0.5) -
#     (f <= -0.5) is round-half-away-from-zero bit for bit, on packed registers (vcvttps2dq, vsubps, vcmpps);
#     (an infinite v, from a scale whose inverse overflows, keeps the reference's cast result, byte 0).
#   * indexes 1-D views of one row and one block (xr[c:c+32]): with `X[m, c + j]` Numba's negative-index check
#     made LLVM compute every address and gather (vpgatherqd); a loop index from range() over a view needs none.
@njit(cache=True, inline="always")
def _f16_bits(x):
    """float32 -> fp16 bit pattern (int32), round to nearest even; overflow -> inf; NaN -> a quiet NaN with
    the top mantissa bits kept (NumPy's rule). Integer operations only (F. Giesen's float_to_half_rtne)."""
    u = np.int32(float32_bits(x))
    sign = (u >> 16) & 0x8000
    u = u & 0x7FFFFFFF
    if u >= 0x7F800000:  # inf or NaN
        h = 0x7C00 + ((u & 0x7FFFFF) >> 13)
        if u > 0x7F800000 and h == 0x7C00:
            h = 0x7C01
    elif u >= 0x477FF000:  # rounds to >= 65520: inf
        h = 0x7C00
    elif u < 0x38800000:  # below 2^-14: an fp16 subnormal; adding 0.5 rounds at 2^-24 (fp16's last bit), RNE
        h = np.int32(float32_bits(float32_from_bits(u) + np.float32(0.5))) - 0x3F000000
    else:  # normal: rebias the exponent (-112 << 23), add half an fp16 ulp - 1 + the odd bit (ties to even)
        h = (u + np.int32(-0x37FFF001) + ((u >> 13) & 1)) >> 13
    return np.int32(h | sign)


@njit(cache=True, inline="always")
def _f16_value(lo, hi):
    """The fp16 whose little-endian bytes are lo, hi -> float32, exactly (subnormals, inf, NaN included)."""
    h = np.int32(lo) | (np.int32(hi) << 8)
    sign = (h & 0x8000) << 16
    e = (h >> 10) & 0x1F
    mnt = h & 0x3FF
    if e == 0:  # zero or subnormal: mnt * 2^-24, exact in float32
        v = np.float32(mnt) * np.float32(5.960464477539063e-08)
        return float32_from_bits(np.int32(float32_bits(v)) | sign)
    if e == 31:
        return float32_from_bits(sign | 0x7F800000 | (mnt << 13))
    return float32_from_bits(sign | ((e + 112) << 23) | (mnt << 13))


@njit(cache=True, inline="always")
def _absbits_max_no_nan(xr, c):
    """The largest |x| bits of the block xr[c:c+32], NaNs skipped (the course's rule: a NaN never sets a block's
    scale). The vector rungs take max|x| as an integer max of the bits, where a NaN (bits above inf's) would
    win; they call this scalar scan only for a block whose max is a NaN's, a branch per block, not per value."""
    a = np.int32(0)
    for j in range(c, c + QK):
        u = np.int32(float32_bits(xr[j])) & np.int32(0x7FFFFFFF)
        if u <= 0x7F800000 and u > a:
            a = u
    return a


@njit(cache=True, parallel=True)
def _q8_0_quantize_fused(out, X, Xi, qk):
    M, K = X.shape
    half = np.float32(0.5)
    one = np.float32(1.0)
    mask = np.int32(0x7FFFFFFF)
    for m in prange(M):
        for b in range(K // QK):
            c = b * QK
            a = np.int32(0)
            for j in range(c, c + qk):  # integer max of the |x| bits: packed vpmaxsd (qk = 32, passed in)
                a = max(a, np.int32(Xi[m, j] & mask))
            if a > 0x7F800000:  # a NaN's bits lie above inf's, but a NaN never sets amax: rescan, once per block
                a = _absbits_max_no_nan(X[m], c)
            d = float32_from_bits(a) / np.float32(127.0)
            idv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
            o = b * 34
            h = _f16_bits(d)
            out[m, o] = np.uint8(h & 0xFF)
            out[m, o + 1] = np.uint8((h >> 8) & 0xFF)
            for j in range(QK):
                v = X[m, c + j] * idv  # float32, as GGML
                t = np.int32(v)  # truncation toward zero
                f = v - np.float32(t)  # exact; inf or NaN when v is (then t is 0x80000000, whose low byte 0 is
                up = np.int32((f >= half) & (f < one))  # what the reference's cast gives, so f must not move it)
                out[m, o + 2 + j] = np.uint8((t + up - np.int32((f <= -half) & (f > -one))) & 0xFF)


@njit(cache=True, parallel=True)
def _q4_0_quantize_fused(out, X):
    M, K = X.shape
    for m in prange(M):
        for b in range(K // QK):
            amax = np.float32(0.0)
            mx = np.float32(0.0)
            for j in range(QK):
                v = X[m, b * QK + j]
                if amax < abs(v):  # strict: the first of equal magnitudes wins, as in GGML
                    amax = abs(v)
                    mx = v
            d = mx / np.float32(-8.0)
            idv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
            o = b * 18
            h = _f16_bits(d)
            out[m, o] = np.uint8(h & 0xFF)
            out[m, o + 1] = np.uint8((h >> 8) & 0xFF)
            for j in range(16):
                v0 = X[m, b * QK + j] * idv + np.float32(8.5)  # float32 multiply, float32 add (no FMA)
                v1 = X[m, b * QK + 16 + j] * idv + np.float32(8.5)
                q0 = min(15, int(v0))  # int() truncates toward zero, like (int8_t)
                q1 = min(15, int(v1))
                out[m, o + 2 + j] = q0 | (q1 << 4)


@njit(cache=True, parallel=True)
def _q8_0_dequant_fused(out, Xq, qs, qk):
    M, K = out.shape
    for m in prange(M):
        for b in range(K // QK):
            o, c = b * 34, b * QK
            d = _f16_value(Xq[m, o], Xq[m, o + 1])
            for j in range(qk):  # int8 -> float32 (vpmovsxbd, vcvtdq2ps) and one multiply; qk = 32, passed in
                out[m, c + j] = np.float32(qs[m, o + 2 + j]) * d


@njit(cache=True, parallel=True)
def _q4_0_dequant_fused(out, Xq, hq):
    M, K = out.shape
    for m in prange(M):
        for b in range(K // QK):
            o, c = b * 18, b * QK
            d = _f16_value(Xq[m, o], Xq[m, o + 1])
            for j in range(hq):  # 16 bytes -> 32 floats: the low nibbles, then the high ones; hq = 16, passed in
                byte = np.int32(Xq[m, o + 2 + j])
                out[m, c + j] = np.float32((byte & 0x0F) - 8) * d
                out[m, c + 16 + j] = np.float32((byte >> 4) - 8) * d


@register("q8_0_quantize", "cpu", "fused", rung=3, dtypes=("float32",))
def q8_0_quantize_fused(out, X):
    """One pass, on packed registers, bit-exact (issue 36): the fp16 scale rounded and stored inside the kernel
    (rung 2 had three NumPy passes over the scales after it), the block's amax as an integer max of the |x|
    bits, roundf as trunc plus a comparison of the exact fraction with 0.5 in float32. `kernels asm`: rung 2's
    scalar roundf and compares become zmm vpmaxsd, vcvttps2dq, vcmpps. Predict >= 2x rung 2."""
    _q8_0_quantize_fused(out, X, X.view(np.int32), QK)


@register("q4_0_quantize", "cpu", "fused", rung=3)
def q4_0_quantize_fused(out, X):
    """One pass, bit-exact (issue 36): the fp16 scale rounded and stored inside the kernel, amax from the bits
    (integer max), GGML's first-wins signed max found by a short scan for those bits. Its float32
    x*(1/d) + 8.5 and truncation were already cheap in rung 2; predict the NumPy scale passes saved (~1.5x)."""
    _q4_0_quantize_fused(out, X)


@register("q8_0_dequantize", "cpu", "fused", rung=3)
def q8_0_dequantize_fused(out, Xq):
    """One pass (issue 36): each block's fp16 scale decoded in the kernel from its two bytes (integer bit
    operations), where rung 2 first copied the strided scale bytes out and converted them with NumPy: two
    extra passes. The 32-value loop is packed int8 -> float32 converts and multiplies. Predict >= 1.5x rung 2."""
    _q8_0_dequant_fused(out, Xq, Xq.view(np.int8), QK)


@register("q4_0_dequantize", "cpu", "fused", rung=3)
def q4_0_dequantize_fused(out, Xq):
    """One pass (issue 36): the fp16 scale decoded in the kernel, the 16 bytes unpacked to 32 floats with
    masks and shifts on packed registers. Predict >= 1.5x rung 2 (its NumPy scale passes gone)."""
    _q4_0_dequant_fused(out, Xq, QK // 2)


# ------------------------------------------------ CPU rung 4 (issue 36): a block is two vector registers
# `kernels asm q8_0_quantize --variants fused` on the AVX-512 board machine: rung 3's block loops of 32 are
# vectorized, but each one separately, behind a runtime alias check between X and out, with scalar remainders,
# and Q4_0's first-wins signed max is a scalar compare chain. Rung 4 says the block's steps on whole vectors
# (kernels_src/compiler/cpuint8.py): two 16-float loads, max|x| as an integer max of the bits (vpmaxsd and a
# reduction), Q4_0's first lane of that magnitude by a compare to a mask and a trailing-zero count, roundf or
# trunc on packed lanes, and the int8 or nibble bytes packed (vpmovdb) and stored 16 at a time. Same float32
# steps as rung 3, so bit-exact.
@njit(cache=True, parallel=True)
def _q8_0_quantize_simd(out, X):
    M, K = X.shape
    for m in prange(M):
        xr = X[m]  # 1-D views: one row of floats, one row of packed blocks
        orow = out[m]
        for b in range(K // QK):
            c, o = b * QK, b * 34
            v0 = vload16(xr, c)
            v1 = vload16(xr, c + 16)
            a = vabsmax_bits16(v0, v1)
            if a > 0x7F800000:  # a NaN won the integer max; the course's rule skips it (one branch per block)
                a = _absbits_max_no_nan(xr, c)
            d = float32_from_bits(a) / np.float32(127.0)
            idv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
            h = _f16_bits(d)
            orow[o] = np.uint8(h & 0xFF)
            orow[o + 1] = np.uint8((h >> 8) & 0xFF)
            s = vsplat16(idv)
            vstore_bytes16(orow, o + 2, vround_away16(vmul16(v0, s)))
            vstore_bytes16(orow, o + 18, vround_away16(vmul16(v1, s)))


@njit(cache=True, parallel=True)
def _q4_0_quantize_simd(out, X):
    M, K = X.shape
    for m in prange(M):
        xr = X[m]
        orow = out[m]
        for b in range(K // QK):
            c, o = b * QK, b * 18
            v0 = vload16(xr, c)
            v1 = vload16(xr, c + 16)
            a = vabsmax_bits16(v0, v1)
            if a > 0x7F800000:  # a NaN won the integer max; GGML's `amax < fabsf(v)` never picks one
                a = _absbits_max_no_nan(xr, c)
            mx = np.float32(0.0)  # no |x| > 0: GGML's max stays its initial +0, so d = -0.0 (not the sign of a -0)
            if a != 0:
                i0 = vfirst_absbits16(v0, a)  # the first lane of that magnitude: GGML's first-wins signed max
                i1 = vfirst_absbits16(v1, a)
                mx = xr[c + (i0 if i0 < 16 else 16 + i1)]
            d = mx / np.float32(-8.0)
            idv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
            h = _f16_bits(d)
            orow[o] = np.uint8(h & 0xFF)
            orow[o + 1] = np.uint8((h >> 8) & 0xFF)
            s = vsplat16(idv)
            e = vsplat16(np.float32(8.5))  # x * id rounded, then + 8.5 rounded: two roundings, as GGML
            # a lane that is not finite truncates to 0x80000000 (vcvttps2dq), min keeps it, its nibble is 0
            t0 = vmini16(vtrunc16(vadd16(vmul16(v0, s), e)), 15)
            t1 = vmini16(vtrunc16(vadd16(vmul16(v1, s), e)), 15)
            vstore_nibbles16(orow, o + 2, t0, t1)


@register("q8_0_quantize", "cpu", "simd", rung=4, dtypes=("float32",))
def q8_0_quantize_simd(out, X):
    """Rung 3 written on whole vectors (issue 36): a block of 32 is two 16-float registers, its max|x| an
    integer max of the bits and one reduction, roundf exact on packed lanes, the 32 int8 bytes packed with
    vpmovdb and stored 16 at a time, with no gathers (rung 3 has vpgatherqd on AVX-512), alias checks or
    remainder loops: ~45 vector and ~12 scalar instructions per block of 32 (128 bytes read, 34 written).
    Predict memory-bound, >= 70 % of copy bandwidth (>= 2x rung 3)."""
    _q8_0_quantize_simd(out, np.ascontiguousarray(X))


@register("q4_0_quantize", "cpu", "simd", rung=4)
def q4_0_quantize_simd(out, X):
    """Rung 3 written on whole vectors (issue 36): two 16-float registers a block, max|x| from the bits, the
    first lane of that magnitude found with a compare mask and a trailing-zero count instead of a scalar
    scan of 32, x*(1/d) + 8.5 truncated on packed lanes, and the nibbles packed and stored 16 bytes at a
    time. Predict memory-bound (128 bytes read, 18 written per block), >= 70 % of copy bandwidth (>= 2x
    rung 3)."""
    _q4_0_quantize_simd(out, np.ascontiguousarray(X))


# ---------------------------------------------------------------------------- CPU GEMV
_fp32_cache: dict = {}


def per_array(cache, Wq, key, build, keep=8):
    """``build()``, computed once per packed array and kept in ``cache`` (the ``keep`` newest entries). An entry
    holds the array itself, so its id cannot be reused while the entry lives."""
    hit = cache.get(key)
    if hit is not None and hit[0] is Wq:
        return hit[1]
    value = build()
    if len(cache) >= keep:
        cache.pop(next(iter(cache)))
    cache[key] = (Wq, value)
    return value


def dequantized_fp32(Wq, fmt, layout="KN", device_array=False):
    """The fp32 W (K,N) of a packed weight, built once per array and cached, for the fp32 baselines.
    The cache holds the array itself, so its id cannot be reused while the entry lives."""
    def build():
        host = Wq.copy_to_host() if hasattr(Wq, "copy_to_host") else np.asarray(Wq)
        W = DEQUANT[fmt](host).astype(np.float32)  # (N, K)
        W = np.ascontiguousarray(W.T) if layout == "KN" else np.ascontiguousarray(W)
        return cuda.to_device(W) if device_array else W

    return per_array(_fp32_cache, Wq, (id(Wq), layout, device_array), build)


def _numpy_baseline(fmt):
    def fn(y, x, Wq):
        """numpy x @ W in fp32 on the dequantized weights (BLAS sgemv): 4 bytes per weight."""
        np.dot(x, dequantized_fp32(Wq, fmt), out=y)
    return fn


@njit(fastmath=True, cache=True)
def _rowdot(y, Wf, x):
    for n in range(Wf.shape[0]):
        acc = np.float32(0.0)
        for k in range(x.size):
            acc += Wf[n, k] * x[k]
        y[n] = acc


@njit(fastmath=True, cache=True)
def _dot_q8_0(x, qs, dh, n):
    # one output: sum over blocks of d * sum_j q_j x_j; qs the int8 view, dh the fp16 view
    acc = np.float32(0.0)
    for b in range(x.size // QK):
        s = np.float32(0.0)
        o = b * 34 + 2
        for j in range(QK):
            s += np.float32(qs[n, o + j]) * x[b * QK + j]
        acc += f16_to_f32(dh[n, b * 17]) * s
    return acc


@njit(fastmath=True, cache=True)
def _dot_q4_0(x, Wq, dh, n):
    acc = np.float32(0.0)
    for b in range(x.size // QK):
        s = np.float32(0.0)
        o = b * 18 + 2
        for j in range(16):
            byte = Wq[n, o + j]
            s += np.float32((byte & 0x0F) - 8) * x[b * QK + j] + np.float32((byte >> 4) - 8) * x[b * QK + 16 + j]
        acc += f16_to_f32(dh[n, b * 9]) * s
    return acc


@njit(fastmath=True, cache=True)
def _fused_q8_0(y, x, qs, dh):
    for n in range(y.size):
        y[n] = _dot_q8_0(x, qs, dh, n)


@njit(fastmath=True, cache=True, parallel=True)
def _fused_q8_0_par(y, x, qs, dh):
    for n in prange(y.size):
        y[n] = _dot_q8_0(x, qs, dh, n)


@njit(fastmath=True, cache=True)
def _fused_q4_0(y, x, Wq, dh):
    for n in range(y.size):
        y[n] = _dot_q4_0(x, Wq, dh, n)


@njit(fastmath=True, cache=True, parallel=True)
def _fused_q4_0_par(y, x, Wq, dh):
    for n in prange(y.size):
        y[n] = _dot_q4_0(x, Wq, dh, n)


@njit(cache=True)
def quantize_x_q8(xq, xd, x):
    """Activations to int8 blocks (Q8_0's rule, the scale kept as float32): xq (K,) int8, xd (K/32,)."""
    for b in range(x.size // QK):
        amax = np.float32(0.0)
        for j in range(QK):
            amax = max(amax, abs(x[b * QK + j]))
        d = amax / np.float32(127.0)
        idv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
        xd[b] = d
        for j in range(QK):
            v = np.float64(x[b * QK + j] * idv)
            r = int(math.floor(abs(v) + 0.5))
            xq[b * QK + j] = r if v >= 0 else -r


@njit(cache=True, parallel=True)
def _q8act_q8_0(y, xq, xd, qs, dh):
    nb = xd.size
    for n in prange(y.size):
        acc = np.float32(0.0)
        for b in range(nb):
            s = 0  # int accumulation: 32 products of |q| <= 127 fit easily in int32
            o = b * 34 + 2
            for j in range(QK):
                s += np.int32(qs[n, o + j]) * np.int32(xq[b * QK + j])
            acc += f16_to_f32(dh[n, b * 17]) * xd[b] * np.float32(s)
        y[n] = acc


@njit(cache=True, parallel=True)
def _q8act_q4_0(y, xq, xd, Wq, dh):
    nb = xd.size
    for n in prange(y.size):
        acc = np.float32(0.0)
        for b in range(nb):
            s = 0
            o = b * 18 + 2
            for j in range(16):
                byte = np.int32(Wq[n, o + j])
                s += ((byte & 0x0F) - 8) * np.int32(xq[b * QK + j]) + ((byte >> 4) - 8) * np.int32(xq[b * QK + 16 + j])
            acc += f16_to_f32(dh[n, b * 9]) * xd[b] * np.float32(s)
        y[n] = acc



# ---------------------------------------------------------------------------- CPU: repacked weights
# Fast CPU implementations do not run on GGML's 34/18-byte blocks as stored: when a model is loaded they
# repack each weight tensor once (llama.cpp's "repack" buffer type interleaves rows for its AVX/NEON GEMV),
# and every later GEMV reads the repacked bytes. Our repack keeps the same numbers and puts them where a
# vector loop wants them:
#   qs (N, K) int8 (Q8_0) or (N, K/2) uint8 (Q4_0: block b of a row is bytes 16b..16b+15, byte j holding
#       element j in its low nibble and j+16 in its high nibble, GGML's order within the block);
#   d  (N, K/32) float32, the fp16 scales converted once (exactly: every fp16 is a float32).
# 1.125 (Q8_0) and 0.625 (Q4_0) bytes per weight instead of 1.0625 and 0.5625: the float32 scales cost 1/16
# of a byte per weight more than fp16 ones, and save a conversion per block in the inner loop.
_packed_cache: dict = {}


def repack_cpu(Wq, fmt):
    """(qs, d) of a packed GGML weight, built once per array and cached (like :func:`dequantized_fp32`)."""
    def build():
        N, BB = Wq.shape[0], FORMATS[fmt]
        blocks = Wq.reshape(N, -1, BB)
        qs = np.ascontiguousarray(blocks[..., 2:]).reshape(N, -1)
        qs = qs.view(np.int8) if fmt == "q8_0" else qs
        return qs, _scales(Wq, BB).astype(np.float32)

    return per_array(_packed_cache, Wq, (id(Wq), fmt), build)


@njit(inline="always")
def _group4(N, t):
    """The rows of step t of a 4-rows-per-step GEMV over N rows. The last group of an N that is not a multiple of 4
    reads row N-1 again (clamped), so that its loop has no branch; _put4 does not store the copies."""
    n0 = 4 * t
    return n0, min(n0 + 1, N - 1), min(n0 + 2, N - 1), min(n0 + 3, N - 1)


@njit(inline="always")
def _put4(y, n0, y0, y1, y2, y3):
    """y[n0:n0+4] = y0..y3, the rows past y's end (a clamped group's copies) left out."""
    N = y.size
    y[n0] = y0
    if n0 + 1 < N:
        y[n0 + 1] = y1
    if n0 + 2 < N:
        y[n0 + 2] = y2
    if n0 + 3 < N:
        y[n0 + 3] = y3


@njit(fastmath=True, cache=True, parallel=True)
def _rows4_q8_0(y, x, qs, d):
    # y (N,), x (K,), qs (N, K) int8, d (N, K/32) f32. Four rows per step: each x[k] is loaded once for 4
    # weights, and the 32-term block loop is 4 independent sums, which LLVM vectorizes along j
    # (vpmovsxbd: 8 int8 -> 8 int32, vcvtdq2ps: -> 8 floats, vfmadd231ps). With one row the same loop is
    # small enough to be unrolled whole, and LLVM then vectorizes the block loop with stride-32 gathers.
    N = y.size
    nb = x.size // QK
    for t in prange((N + 3) // 4):
        n0, n1, n2, n3 = _group4(N, t)
        a0 = np.float32(0.0)
        a1 = np.float32(0.0)
        a2 = np.float32(0.0)
        a3 = np.float32(0.0)
        for b in range(nb):
            s0 = np.float32(0.0)
            s1 = np.float32(0.0)
            s2 = np.float32(0.0)
            s3 = np.float32(0.0)
            for j in range(QK):
                xv = x[b * QK + j]
                s0 += np.float32(qs[n0, b * QK + j]) * xv
                s1 += np.float32(qs[n1, b * QK + j]) * xv
                s2 += np.float32(qs[n2, b * QK + j]) * xv
                s3 += np.float32(qs[n3, b * QK + j]) * xv
            a0 += d[n0, b] * s0
            a1 += d[n1, b] * s1
            a2 += d[n2, b] * s2
            a3 += d[n3, b] * s3
        _put4(y, n0, a0, a1, a2, a3)


@njit(fastmath=True, cache=True, parallel=True)
def _rows4_q4_0(y, x, qs, d):
    # y (N,), x (K,), qs (N, K/2) uint8, d (N, K/32) f32; 4 rows per step as for Q8_0. The nibbles are
    # separated with float arithmetic: Numba widens integer & and >> to int64 (8 lanes of a zmm register),
    # float32 keeps 8 or 16 lanes and needs no int64 -> float conversion.
    N = y.size
    nb = x.size // QK
    xs = np.empty(nb, np.float32)  # per-block sums of x, for the -8 offset
    for b in range(nb):
        t = np.float32(0.0)
        for j in range(QK):
            t += x[b * QK + j]
        xs[b] = t
    for t in prange((N + 3) // 4):
        n0, n1, n2, n3 = _group4(N, t)
        a0 = np.float32(0.0)
        a1 = np.float32(0.0)
        a2 = np.float32(0.0)
        a3 = np.float32(0.0)
        for b in range(nb):
            s0 = np.float32(0.0)
            s1 = np.float32(0.0)
            s2 = np.float32(0.0)
            s3 = np.float32(0.0)
            for j in range(16):
                xl = x[b * QK + j]
                xh = x[b * QK + 16 + j]
                q = np.float32(qs[n0, b * 16 + j])
                h = np.floor(q * np.float32(0.0625))
                s0 += (q - np.float32(16.0) * h) * xl + h * xh
                q = np.float32(qs[n1, b * 16 + j])
                h = np.floor(q * np.float32(0.0625))
                s1 += (q - np.float32(16.0) * h) * xl + h * xh
                q = np.float32(qs[n2, b * 16 + j])
                h = np.floor(q * np.float32(0.0625))
                s2 += (q - np.float32(16.0) * h) * xl + h * xh
                q = np.float32(qs[n3, b * 16 + j])
                h = np.floor(q * np.float32(0.0625))
                s3 += (q - np.float32(16.0) * h) * xl + h * xh
            x8 = np.float32(8.0) * xs[b]
            a0 += d[n0, b] * (s0 - x8)
            a1 += d[n1, b] * (s1 - x8)
            a2 += d[n2, b] * (s2 - x8)
            a3 += d[n3, b] * (s3 - x8)
        _put4(y, n0, a0, a1, a2, a3)


@njit(cache=True, parallel=True)
def _rows4_q8_0_simd(y, x, qs, d):
    # y (N,), x (K,), qs (N, K) int8, d (N, K/32) f32, as rung 5; one 16-float accumulator per output.
    N = y.size
    nb = x.size // QK
    for t in prange((N + 3) // 4):
        n0, n1, n2, n3 = _group4(N, t)
        q0, q1, q2, q3 = qs[n0], qs[n1], qs[n2], qs[n3]
        d0, d1, d2, d3 = d[n0], d[n1], d[n2], d[n3]
        a0 = vzero16()
        a1 = vzero16()
        a2 = vzero16()
        a3 = vzero16()
        for b in range(nb):
            c = b * QK
            xl = vload16(x, c)
            xh = vload16(x, c + 16)
            s = vfma16(vcvt16(vload_i8x16(q0, c + 16)), xh, vmul16(vcvt16(vload_i8x16(q0, c)), xl))
            a0 = vfma16(vsplat16(d0[b]), s, a0)
            s = vfma16(vcvt16(vload_i8x16(q1, c + 16)), xh, vmul16(vcvt16(vload_i8x16(q1, c)), xl))
            a1 = vfma16(vsplat16(d1[b]), s, a1)
            s = vfma16(vcvt16(vload_i8x16(q2, c + 16)), xh, vmul16(vcvt16(vload_i8x16(q2, c)), xl))
            a2 = vfma16(vsplat16(d2[b]), s, a2)
            s = vfma16(vcvt16(vload_i8x16(q3, c + 16)), xh, vmul16(vcvt16(vload_i8x16(q3, c)), xl))
            a3 = vfma16(vsplat16(d3[b]), s, a3)
        _put4(y, n0, vsum16(a0), vsum16(a1), vsum16(a2), vsum16(a3))


@njit(cache=True, parallel=True)
def _rows4_q8_0_q8act(y, xq, xd, qs, d):
    # y (N,), xq (K,) int8 and xd (K/32,) f32 (x quantized per block), qs (N, K) int8, d (N, K/32) f32. Per row and
    # block: the exact int32 dot product as 16 lanes of pair sums, converted once and scaled by d_w * d_x.
    N = y.size
    nb = xd.size
    for t in prange((N + 3) // 4):
        n0, n1, n2, n3 = _group4(N, t)
        q0, q1, q2, q3 = qs[n0], qs[n1], qs[n2], qs[n3]
        d0, d1, d2, d3 = d[n0], d[n1], d[n2], d[n3]
        a0 = vzero16()
        a1 = vzero16()
        a2 = vzero16()
        a3 = vzero16()
        for b in range(nb):
            c = b * QK
            xs = vload_i8x32_i16(xq, c)  # x's block widened to int16 once, for 4 rows
            dx = xd[b]
            a0 = vfma16(vcvt16(vdot_i8x32(q0, c, xs)), vsplat16(d0[b] * dx), a0)
            a1 = vfma16(vcvt16(vdot_i8x32(q1, c, xs)), vsplat16(d1[b] * dx), a1)
            a2 = vfma16(vcvt16(vdot_i8x32(q2, c, xs)), vsplat16(d2[b] * dx), a2)
            a3 = vfma16(vcvt16(vdot_i8x32(q3, c, xs)), vsplat16(d3[b] * dx), a3)
        _put4(y, n0, vsum16(a0), vsum16(a1), vsum16(a2), vsum16(a3))


@njit(cache=True, parallel=True)
def _rows4_q4_0_q8act(y, xq, xd, qs, d):
    # y (N,), xq (K,) int8 and xd (K/32,) f32 (x quantized per block), qs (N, K/2) uint8, d (N, K/32) f32: as the
    # Q8_0 kernel above, the weights' nibbles - 8 widened to int16 in the dot product (vdot_q4x32).
    N = y.size
    nb = xd.size
    for t in prange((N + 3) // 4):
        n0, n1, n2, n3 = _group4(N, t)
        q0, q1, q2, q3 = qs[n0], qs[n1], qs[n2], qs[n3]
        d0, d1, d2, d3 = d[n0], d[n1], d[n2], d[n3]
        a0 = vzero16()
        a1 = vzero16()
        a2 = vzero16()
        a3 = vzero16()
        for b in range(nb):
            xs = vload_i8x32_i16(xq, b * QK)  # x's block widened to int16 once, for 4 rows
            dx = xd[b]
            c = b * 16
            a0 = vfma16(vcvt16(vdot_q4x32(q0, c, xs)), vsplat16(d0[b] * dx), a0)
            a1 = vfma16(vcvt16(vdot_q4x32(q1, c, xs)), vsplat16(d1[b] * dx), a1)
            a2 = vfma16(vcvt16(vdot_q4x32(q2, c, xs)), vsplat16(d2[b] * dx), a2)
            a3 = vfma16(vcvt16(vdot_q4x32(q3, c, xs)), vsplat16(d3[b] * dx), a3)
        _put4(y, n0, vsum16(a0), vsum16(a1), vsum16(a2), vsum16(a3))


@njit(cache=True, parallel=True)
def _rows4_q4_0_simd(y, x, qs, d):
    # y (N,), x (K,), qs (N, K/2) uint8, d (N, K/32) f32, as rung 5; one 16-float accumulator per output,
    # summed across lanes once per output (rung 5 folded its 16 lanes into a float after every block).
    N = y.size
    nb = x.size // QK
    eight = vsplat16(np.float32(8.0))
    for t in prange((N + 3) // 4):
        n0, n1, n2, n3 = _group4(N, t)
        q0, q1, q2, q3 = qs[n0], qs[n1], qs[n2], qs[n3]
        d0, d1, d2, d3 = d[n0], d[n1], d[n2], d[n3]
        a0 = vzero16()
        a1 = vzero16()
        a2 = vzero16()
        a3 = vzero16()
        for b in range(nb):
            xl = vload16(x, b * QK)  # elements 0-15 of the block: the low nibbles
            xh = vload16(x, b * QK + 16)  # elements 16-31: the high nibbles
            x8 = vmul16(vadd16(xl, xh), eight)  # the -8 offset of every weight, once for 4 rows
            w = vload_u8x16(q0, b * 16)
            s = vfma16(vcvt16(vshri16(w, 4)), xh, vmul16(vcvt16(vandi16(w, 15)), xl))
            a0 = vfma16(vsplat16(d0[b]), vsub16(s, x8), a0)
            w = vload_u8x16(q1, b * 16)
            s = vfma16(vcvt16(vshri16(w, 4)), xh, vmul16(vcvt16(vandi16(w, 15)), xl))
            a1 = vfma16(vsplat16(d1[b]), vsub16(s, x8), a1)
            w = vload_u8x16(q2, b * 16)
            s = vfma16(vcvt16(vshri16(w, 4)), xh, vmul16(vcvt16(vandi16(w, 15)), xl))
            a2 = vfma16(vsplat16(d2[b]), vsub16(s, x8), a2)
            w = vload_u8x16(q3, b * 16)
            s = vfma16(vcvt16(vshri16(w, 4)), xh, vmul16(vcvt16(vandi16(w, 15)), xl))
            a3 = vfma16(vsplat16(d3[b]), vsub16(s, x8), a3)
        _put4(y, n0, vsum16(a0), vsum16(a1), vsum16(a2), vsum16(a3))


def repacked_bytes(fmt):
    qbytes = {"q8_0": 1.0, "q4_0": 0.5}[fmt]
    return lambda s, b: int(s[1] * s[0] * qbytes) + s[1] * (s[0] // QK) * 4 + 4 * s[0] + 4 * s[1]



PACKED_DOC = {
    "q8_0": """Weights repacked once, ahead of time (as llama.cpp does when it loads a model), and 4 rows per step.

    The repack (repack_cpu) puts the int8 quants of a row in one contiguous array and the scales, as float32,
    in another; it is cached per weight, so only the GEMV is timed, and bytes = the repacked bytes it reads
    (1.125 per weight: 3.56x fewer than fp32). The kernel computes 4 outputs at once: each x[k] is loaded
    once for 4 weights, and the 32-term block loop becomes 4 independent sums that LLVM vectorizes along k
    (vpmovsxbd, vcvtdq2ps, vfmadd231ps: 3 instructions per 8 weights) instead of unrolling it and then
    vectorizing across blocks with gathers, as it does for one row (rungs 2-4, which also convert an fp16
    scale per block through ldexp calls). x stays float32, so the answer is the exact one (rungs 1-3's
    tolerance). Predicted: memory-bound at ~30 GB/s on 2 cores, ~3.5x the fp32 NumPy GEMV.""",
    "q4_0": """Weights repacked once, ahead of time (as llama.cpp does when it loads a model), and 4 rows per step.

    The repack (repack_cpu) keeps each block's 16 nibble bytes (GGML's order) contiguous per row and moves
    the scales, as float32, to an array of their own; cached per weight, so only the GEMV is timed, and
    bytes = the repacked bytes it reads (0.625 per weight: 6.4x fewer than fp32, against 7.1x for GGML's
    fp16 scales). 4 outputs per step share each x load. The nibbles are split in float32 (h = floor(q/16),
    l = q - 16h, exact for 0..255) because Numba widens integer & and >> to int64, which LLVM converts 8
    lanes at a time; the -8 offset is taken out once per block as -8 * sum(x over the block) (an error of
    ~eps * 15 * sum|x| per block, inside the op's tolerance). Predicted: ~6 vector instructions per 8
    weights, compute-bound rather than memory-bound on 2 cores: ~2x the fp32 NumPy GEMV.""",
}

def _cpu_rungs(fmt):
    BB = FORMATS[fmt]
    op = f"qgemv_{fmt}"
    fused, fused_par = {"q8_0": (_fused_q8_0, _fused_q8_0_par), "q4_0": (_fused_q4_0, _fused_q4_0_par)}[fmt]
    q8act = {"q8_0": _q8act_q8_0, "q4_0": _q8act_q4_0}[fmt]
    quants = (lambda Wq: Wq.view(np.int8)) if fmt == "q8_0" else (lambda Wq: Wq)

    register(op, "cpu", "numpy", baseline=True, bytes=fp32_bytes)(_numpy_baseline(fmt))

    def dequant_then_dot(y, x, Wq):
        """Dequantize all of W to fp32 first, then one dot product per output: the fp32 W (4 bytes a
        weight) is written and read back, so this moves more bytes than the plain fp32 GEMV."""
        Wf = np.empty((Wq.shape[0], x.size), np.float32)
        (q8_0_dequantize_cpu if fmt == "q8_0" else q4_0_dequantize_cpu)(Wf, Wq)
        _rowdot(y, Wf, x)

    register(op, "cpu", "dequant_then_dot", rung=1,
             bytes=lambda s, b: s[1] * (s[0] // QK) * BB + 8 * s[0] * s[1] + 4 * s[0] + 4 * s[1])(dequant_then_dot)

    def fused_fn(y, x, Wq):
        """Fused: dequantize in registers inside the dot product (fp32 W never exists), one core.
        Predicted: bound by the integer-to-float conversions, not by memory, on one core."""
        fused(y, x, quants(Wq), Wq.view(np.uint16))

    register(op, "cpu", "fused", rung=2)(fused_fn)

    def fused_par_fn(y, x, Wq):
        """Rung 2 with the outputs (packed rows) split over cores with prange. Predicted: ~2x on 2 cores."""
        fused_par(y, x, quants(Wq), Wq.view(np.uint16))

    register(op, "cpu", "fused_prange", rung=3)(fused_par_fn)

    def q8act_fn(y, x, Wq):
        """llama.cpp's CPU path: x quantized to int8 blocks once, then int32 dot products per block and
        one float multiply by d_w*d_x per block. Integer multiply-adds vectorise well (what GGML's
        AVX2/NEON kernels use); the answer moves by x's rounding error (see q8act_tol)."""
        xq = np.empty(x.size, np.int8)
        xd = np.empty(x.size // QK, np.float32)
        quantize_x_q8(xq, xd, x)
        q8act(y, xq, xd, quants(Wq), Wq.view(np.uint16))

    register(op, "cpu", "q8act_prange", rung=4, tol=q8act_tol,
             edge_exempt="activations quantized to 8 bits per block of 32: a huge value in a block rounds the block's other values away, by design")(q8act_fn)

    rows4 = {"q8_0": _rows4_q8_0, "q4_0": _rows4_q4_0}[fmt]

    def packed_rows4(y, x, Wq):
        qs, d = repack_cpu(Wq, fmt)  # done once per weight and cached: not part of the timed GEMV
        rows4(y, x, qs, d)

    packed_rows4.__doc__ = PACKED_DOC[fmt]
    register(op, "cpu", "packed_rows4", rung=5, bytes=repacked_bytes(fmt))(packed_rows4)

    if fmt == "q8_0":
        def packed_simd(y, x, Wq):
            """Rung 5 on explicit vectors (issue 36; kernels_src/compiler/cpuint8.py), 4 rows per step as before.

            `kernels asm` of rung 5 on the AVX-512 machine: each row's block of 32 is two vpmovsxbd/vcvtdq2ps
            pairs, a vmulps and a vfmadd, and then the 16 lanes are folded into one float (vextractf64x4,
            vextractf128, vshufpd, vmovshdup, 4 adds) before a scalar FMA by the scale: 14 vector and 1 scalar
            instructions per row and block. Here each output keeps a 16-float accumulator for all of K,
            acc += d * (q_lo*x_lo + q_hi*x_hi) with the scale broadcast from memory, and its lanes are summed
            once per output: 7 instructions per row and block. Predict memory-bound on 2 cores (>= 70 % of
            copy; rung 5 was at ~57 %)."""
            qs, d = repack_cpu(Wq, fmt)
            _rows4_q8_0_simd(y, np.ascontiguousarray(x), qs, d)

        register(op, "cpu", "packed_simd", rung=6, bytes=repacked_bytes(fmt))(packed_simd)

        def packed_q8act(y, x, Wq):
            """Rung 6 with llama.cpp's int8 activations (rung 4's quantize_x_q8): integer dot products on vectors.

            On AVX2 (no AVX-512) rung 6 is bound by instructions, not memory: per row and block of 32 it widens
            the weights with 4 vpmovsxbd and converts them with 4 vcvtdq2ps before its FMAs (~15 instructions,
            on two-ymm vectors). Here x is quantized once per call to int8 blocks with a float32 scale, each block
            of x is widened to int16 once for 4 rows (vpmovsxbw), and a row's block is 2 vpmovsxbw + 2 vpmaddwd
            (the exact int32 sums of adjacent products: vdot_i8x32 in cpuint8.py) + 2 vcvtdq2ps + 2 vfmadd with
            d_w * d_x broadcast (vmulss, vbroadcastss): ~10 instructions, 2/3 of rung 6's, and no float work on
            the weights before the products. bytes = the repacked weights and scales plus x's int8 quants and
            scales. The answer moves by x's rounding to 8 bits (q8act_tol, as rung 4). Predicted on 2 AVX2
            cores: ~1.5x rung 6, so >= 2x the fp32 NumPy GEMV, still short of the memory's speed."""
            qs, d = repack_cpu(Wq, fmt)
            xq = np.empty(x.size, np.int8)
            xd = np.empty(x.size // QK, np.float32)
            quantize_x_q8(xq, xd, np.ascontiguousarray(x))
            _rows4_q8_0_q8act(y, xq, xd, qs, d)

        register(op, "cpu", "packed_q8act", rung=7, tol=q8act_tol,
                 edge_exempt="activations quantized to 8 bits per block of 32: a huge value in a block rounds the block's other values away, by design",
                 bytes=lambda s, b: s[1] * s[0] + s[1] * (s[0] // QK) * 4 + s[0] + (s[0] // QK) * 4 + 4 * s[1]
                 )(packed_q8act)
    if fmt == "q4_0":
        def packed_simd(y, x, Wq):
            """Rung 5 on explicit vectors (issue 36; kernels_src/compiler/cpuint8.py), 4 rows per step as before.

            `kernels asm` of rung 5 on the AVX-512 machine: its 16-wide block loop is vectorized, but each block's
            16 partial sums are folded into one float right away (vextractf64x4, vextractf128, vshufpd,
            vmovshdup and 4 adds) and the -8 offset and the scale are then applied in scalar code: ~17 vector and
            ~4 scalar instructions per row and block of 32 weights. Here each output keeps a 16-float
            accumulator for all of K (acc += d * (lo*xl + hi*xh - 8*(xl + xh)), the scale a broadcast), the
            nibbles are split with integer vpandd/vpsrld on 32-bit lanes (vpmovzxbd loads 16 bytes into 16
            lanes) and converted with vcvtdq2ps, and the lanes are summed once per output: 9 vector
            instructions per row and block. Predict ~2x rung 5, near the memory's speed on 2 cores."""
            qs, d = repack_cpu(Wq, fmt)
            _rows4_q4_0_simd(y, np.ascontiguousarray(x), qs, d)

        register(op, "cpu", "packed_simd", rung=6, bytes=repacked_bytes(fmt))(packed_simd)

        def packed_q8act(y, x, Wq):
            """Rung 6 with llama.cpp's int8 activations (rung 4's quantize_x_q8): integer dot products on vectors.

            As Q8_0's rung 7: x quantized once per call to int8 blocks with a float32 scale and widened to int16
            once per block for 4 rows. A row's block is one vpmovzxbw (16 bytes to 16 int16), vpand and vpsrlw
            for the two nibbles, two vpsubw for the -8, two vpmaddwd (vdot_q4x32 in cpuint8.py: exact int32 sums
            of adjacent products), two vcvtdq2ps and two vfmadd with d_w * d_x broadcast: ~13 instructions on
            AVX2, where rung 6 needs ~19 (two ymm per 16-lane step, and 4 vcvtdq2ps of the nibbles). bytes = the
            repacked weights and scales plus x's int8 quants and scales. The answer moves by x's rounding to 8
            bits (q8act_tol, as rung 4). Predicted on 2 AVX2 cores: ~1.4x rung 6."""
            qs, d = repack_cpu(Wq, fmt)
            xq = np.empty(x.size, np.int8)
            xd = np.empty(x.size // QK, np.float32)
            quantize_x_q8(xq, xd, np.ascontiguousarray(x))
            _rows4_q4_0_q8act(y, xq, xd, qs, d)

        register(op, "cpu", "packed_q8act", rung=7, tol=q8act_tol,
                 edge_exempt="activations quantized to 8 bits per block of 32: a huge value in a block rounds the block's other values away, by design",
                 bytes=lambda s, b: s[1] * s[0] // 2 + s[1] * (s[0] // QK) * 4 + s[0] + (s[0] // QK) * 4 + 4 * s[1]
                 )(packed_q8act)


for _f in FORMATS:
    _cpu_rungs(_f)


# ============================================================================ GPU kernels
# Bit-exact float32 steps on the GPU: NVVM contracts a multiply followed by an add into one fused
# multiply-add (one rounding instead of two), which changes GGML's x*id + 8.5f in rare cases. libdevice's
# __nv_fmul_rn / __nv_fadd_rn are never contracted. The simulator has no libdevice: plain float32 there.
from ..compiler import fadd_rn, fmul_rn, int_as_float  # noqa: E402  (plain float32 in the simulator)

# Small integers to float without the int-to-float instruction (a quarter-rate one on the H100): the bits
# 0x4B000000 | u are the float 2^23 + u for 0 <= u < 2^23, so one OR and one subtraction give u exactly.
MAGIC = 0x4B000000

THREADS = 128
ROWS = 8  # outputs per block in rungs 3 and 4
WARPS = 4  # warps per block in rungs 3 and 4: they split K
RED = WARPS * 32  # threads per block in rungs 3 and 4 (a literal for shared.array)


@cuda.jit
def q8_0_quantize_kernel(qs, dh, X):
    # one warp per block of 32: qs (M, nb*34) int8 view, dh (M, nb*17) f16 view, X (M,K)
    lane = cuda.threadIdx.x
    w = cuda.threadIdx.y
    red = cuda.shared.array((4, 32), float32)
    nb = X.shape[1] // QK
    g = cuda.blockIdx.x * 4 + w  # global block index over all rows
    m = g // max(nb, 1)
    b = g - m * nb
    ok = g < X.shape[0] * nb
    v = float32(0.0)
    if ok:
        v = X[m, b * QK + lane]
    a = abs(v)
    red[w, lane] = a if a == a else float32(0.0)  # a NaN never sets amax (the rule above the references)
    cuda.syncthreads()
    s = 16
    while s > 0:
        if lane < s:
            red[w, lane] = max(red[w, lane], red[w, lane + s])
        cuda.syncthreads()
        s //= 2
    if ok:
        d = red[w, 0] / float32(127.0)
        idv = float32(1.0) / d if d != 0 else float32(0.0)
        p = fmul_rn(v, idv)  # rounded to float32, as in C
        # not finite: stores 0 (the GPU's conversion would saturate an inf to a 0xFF or 0x01 byte)
        p = p if abs(p) <= float32(3.4028234663852886e38) else float32(0.0)
        q = int32(math.floor(abs(float64(p)) + 0.5))  # roundf, exactly: |p| + 0.5 is exact in float64
        qs[m, b * 34 + 2 + lane] = q if p >= 0 else -q
        if lane == 0:
            dh[m, b * 17] = d


@cuda.jit
def q4_0_quantize_kernel(Xq, dh, X):
    lane = cuda.threadIdx.x
    w = cuda.threadIdx.y
    mag = cuda.shared.array((4, 32), float32)
    idx = cuda.shared.array((4, 32), int32)
    qv = cuda.shared.array((4, 32), int32)
    nb = X.shape[1] // QK
    g = cuda.blockIdx.x * 4 + w
    m = g // max(nb, 1)
    b = g - m * nb
    ok = g < X.shape[0] * nb
    v = float32(0.0)
    if ok:
        v = X[m, b * QK + lane]
    a = abs(v)
    mag[w, lane] = a if a == a else float32(0.0)  # GGML's `amax < fabsf(v)` is false for a NaN: never the max
    idx[w, lane] = lane
    cuda.syncthreads()
    s = 16
    while s > 0:  # arg-max of |v|; on a tie the lower index wins (GGML keeps the first)
        if lane < s:
            a, c = mag[w, lane], mag[w, lane + s]
            if c > a or (c == a and idx[w, lane + s] < idx[w, lane]):
                mag[w, lane] = c
                idx[w, lane] = idx[w, lane + s]
        cuda.syncthreads()
        s //= 2
    q = 0
    if ok:
        mx = X[m, b * QK + idx[w, 0]] if mag[w, 0] > 0 else float32(0.0)  # no |v| > 0: max stays +0, d = -0.0
        d = mx / float32(-8.0)
        idv = float32(1.0) / d if d != 0 else float32(0.0)
        p = fadd_rn(fmul_rn(v, idv), float32(8.5))  # two float32 roundings, as GGML's x*id + 8.5f
        # not finite: stores 0, as x86's conversion does (the GPU's gives 0 for a NaN but saturates +inf to 15)
        p = p if abs(p) <= float32(3.4028234663852886e38) else float32(0.0)
        q = min(15, int32(p))  # int32() truncates toward zero, like (int8_t)
        if lane == 0:
            dh[m, b * 9] = d
    qv[w, lane] = q
    cuda.syncthreads()
    if ok and lane < 16:
        Xq[m, b * 18 + 2 + lane] = qv[w, lane] | (qv[w, lane + 16] << 4)


@register("q8_0_quantize", "gpu", "warp_per_block", rung=1,
          ptx=[(q8_0_quantize_kernel, "void(int8[:, ::1], float16[:, ::1], float32[:, ::1])")])
def q8_0_quantize_gpu(out, X):
    """One warp per block of 32: a shared-memory max tree for amax, then each lane writes its int8.
    Reads 4 and writes 1.06 bytes per weight; predicted: well below copy bandwidth (the tree's barriers)."""
    nblk = X.shape[0] * (X.shape[1] // QK)
    q8_0_quantize_kernel[max(1, ceil_div(nblk, 4)), (32, 4)](out.view(np.int8), out.view(np.float16), X)


@register("q4_0_quantize", "gpu", "warp_per_block", rung=1,
          ptx=[(q4_0_quantize_kernel, "void(uint8[:, ::1], float16[:, ::1], float32[:, ::1])")])
def q4_0_quantize_gpu(out, X):
    """One warp per block: an arg-max tree (first index wins ties) for the signed max, then lanes 0..15
    each pack two nibbles. Predicted: well below copy bandwidth (the tree's barriers)."""
    nblk = X.shape[0] * (X.shape[1] // QK)
    q4_0_quantize_kernel[max(1, ceil_div(nblk, 4)), (32, 4)](out, out.view(np.float16), X)


@cuda.jit
def q8_0_dequantize_kernel(out, qs, dh):
    i = cuda.grid(1)  # one thread per output element
    M, K = out.shape
    if i < M * K:
        m = i // K
        k = i - m * K
        b = k // QK
        out[m, k] = float32(qs[m, b * 34 + 2 + (k - b * QK)]) * float32(dh[m, b * 17])


@cuda.jit
def q4_0_dequantize_kernel(out, Xq, dh):
    i = cuda.grid(1)
    M, K = out.shape
    if i < M * K:
        m = i // K
        k = i - m * K
        b = k // QK
        e = k - b * QK  # element within the block: byte e % 16, high nibble when e >= 16
        byte = int32(Xq[m, b * 18 + 2 + (e & 15)])
        q = (byte >> 4) if e >= 16 else (byte & 15)
        out[m, k] = float32(q - 8) * float32(dh[m, b * 9])


@register("q8_0_dequantize", "gpu", "thread_per_elem", rung=1,
          ptx=[(q8_0_dequantize_kernel, "void(float32[:, ::1], int8[:, ::1], float16[:, ::1])")])
def q8_0_dequantize_gpu(out, Xq):
    """One thread per output: a coalesced int8 load, a broadcast scale load and a float32 store.
    Predicted: near copy bandwidth on the 5.06 bytes per weight it moves."""
    q8_0_dequantize_kernel[max(1, ceil_div(out.size, 256)), 256](out, Xq.view(np.int8), Xq.view(np.float16))


@register("q4_0_dequantize", "gpu", "thread_per_elem", rung=1,
          ptx=[(q4_0_dequantize_kernel, "void(float32[:, ::1], uint8[:, ::1], float16[:, ::1])")])
def q4_0_dequantize_gpu(out, Xq):
    """One thread per output: each byte is loaded by two threads (its low and its high nibble).
    Predicted: near copy bandwidth on the 4.56 bytes per weight it moves."""
    q4_0_dequantize_kernel[max(1, ceil_div(out.size, 256)), 256](out, Xq, Xq.view(np.float16))


# ---------------------------------------------------------------------------- GPU GEMV, rung 1
@cuda.jit(fastmath=True)
def q8_0_thread_per_row_kernel(y, x, qs, dh):
    n = cuda.grid(1)
    if n < y.size:
        acc = float32(0.0)
        for b in range(x.size // QK):
            s = float32(0.0)
            for j in range(QK):  # lanes n, n+1, ... read bytes a whole packed row apart
                s += float32(qs[n, b * 34 + 2 + j]) * x[b * QK + j]
            acc += float32(dh[n, b * 17]) * s
        y[n] = acc


@cuda.jit(fastmath=True)
def q4_0_thread_per_row_kernel(y, x, Wq, dh):
    n = cuda.grid(1)
    if n < y.size:
        acc = float32(0.0)
        for b in range(x.size // QK):
            s = float32(0.0)
            for j in range(16):
                byte = int32(Wq[n, b * 18 + 2 + j])
                s += float32((byte & 15) - 8) * x[b * QK + j] + float32((byte >> 4) - 8) * x[b * QK + 16 + j]
            acc += float32(dh[n, b * 9]) * s
        y[n] = acc


# ---------------------------------------------------------------------------- rung 2: warp per row
@cuda.jit(fastmath=True)
def q8_0_warp_per_row_kernel(y, x, qs, dh):
    lane = cuda.threadIdx.x
    w = cuda.threadIdx.y
    n = cuda.blockIdx.x * 4 + w
    part = cuda.shared.array((4, 32), float32)
    acc = float32(0.0)
    if n < y.size:
        for b in range(x.size // QK):  # lane = element of the block: 32 adjacent bytes per warp load
            acc += float32(dh[n, b * 17]) * float32(qs[n, b * 34 + 2 + lane]) * x[b * QK + lane]
    part[w, lane] = acc
    cuda.syncthreads()
    s = 16
    while s > 0:
        if lane < s:
            part[w, lane] += part[w, lane + s]
        cuda.syncthreads()
        s //= 2
    if lane == 0 and n < y.size:
        y[n] = part[w, 0]


@cuda.jit(fastmath=True)
def q4_0_warp_per_row_kernel(y, x, Wq, dh):
    lane = cuda.threadIdx.x
    w = cuda.threadIdx.y
    n = cuda.blockIdx.x * 4 + w
    part = cuda.shared.array((4, 32), float32)
    acc = float32(0.0)
    hi = lane >> 4  # lanes 0..15 take the low nibbles (elements 0..15), lanes 16..31 the high ones
    if n < y.size:
        for b in range(x.size // QK):
            byte = int32(Wq[n, b * 18 + 2 + (lane & 15)])
            q = ((byte >> 4) if hi else (byte & 15)) - 8
            acc += float32(dh[n, b * 9]) * float32(q) * x[b * QK + lane]
    part[w, lane] = acc
    cuda.syncthreads()
    s = 16
    while s > 0:
        if lane < s:
            part[w, lane] += part[w, lane + s]
        cuda.syncthreads()
        s //= 2
    if lane == 0 and n < y.size:
        y[n] = part[w, 0]


# ---------------------------------------------------------------------------- rung 3: 8 outputs per block
@cuda.jit(device=True, inline=True)
def _sbyte(v):
    """The low byte of v as a signed int8 value."""
    v = v & 0xFF
    return int32(v - ((v & 0x80) << 1))


@cuda.jit(device=True, inline=True)
def block_reduce_store(y, part, acc, n0, rows, t, threads):
    """part (rows, threads) shared: each thread's partial sums of its ``rows`` outputs, then a tree over the
    threads of a row; thread r < rows stores output n0 + r."""
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


@cuda.jit(fastmath=True)
def q8_0_rows_kernel(y, x, wq, dh):
    # wq: uint16 view. Lane: 8 weights = 4 two-byte loads of block b (4 lanes per block, 8 blocks per
    # warp step); its 8 x values stay in registers for all ROWS outputs of this block.
    lane = cuda.threadIdx.x
    w = cuda.threadIdx.y
    n0 = cuda.blockIdx.x * ROWS
    nb = x.size // QK
    acc = cuda.local.array(ROWS, float32)
    xv = cuda.local.array(8, float32)
    part = cuda.shared.array((ROWS, RED), float32)
    for r in range(ROWS):
        acc[r] = float32(0.0)
    j = lane & 3
    for b in range(w * 8 + (lane >> 2), nb, WARPS * 8):
        k0 = b * QK + 8 * j
        for c in range(8):
            xv[c] = x[k0 + c]
        for r in range(ROWS):
            n = min(n0 + r, y.size - 1)  # past the end: re-read the last row. No branch, so the loads
            # of all ROWS rows can be issued before the first arrives; that row's sum is never stored
            o = b * 17 + 1 + 4 * j  # the quant bytes 8j..8j+7 of block b, as 4 uint16
            s = float32(0.0)
            for h in range(4):
                v = int32(wq[n, o + h]) ^ 0x8080  # int8 -> offset binary: q + 128 in 0..255
                s += (int_as_float(MAGIC | (v & 0xFF)) - float32(8388736.0)) * xv[2 * h]  # 2^23 + 128
                s += (int_as_float(MAGIC | (v >> 8)) - float32(8388736.0)) * xv[2 * h + 1]
            acc[r] += float32(dh[n, b * 17]) * s
    block_reduce_store(y, part, acc, n0, ROWS, w * 32 + lane, RED)


@cuda.jit(fastmath=True)
def q4_0_rows_kernel(y, x, wq, dh):
    # Lane: bytes 4j..4j+3 of block b's nibbles (2 uint16 loads) = elements 4j..4j+3 and 4j+16..4j+19
    lane = cuda.threadIdx.x
    w = cuda.threadIdx.y
    n0 = cuda.blockIdx.x * ROWS
    nb = x.size // QK
    acc = cuda.local.array(ROWS, float32)
    xv = cuda.local.array(8, float32)
    part = cuda.shared.array((ROWS, RED), float32)
    for r in range(ROWS):
        acc[r] = float32(0.0)
    j = lane & 3
    for b in range(w * 8 + (lane >> 2), nb, WARPS * 8):
        k0 = b * QK + 4 * j
        for c in range(4):
            xv[c] = x[k0 + c]
            xv[4 + c] = x[k0 + 16 + c]
        for r in range(ROWS):
            n = min(n0 + r, y.size - 1)  # past the end: re-read the last row. No branch, so the loads
            # of all ROWS rows can be issued before the first arrives; that row's sum is never stored
            o = b * 9 + 1 + 2 * j
            v = int32(wq[n, o]) | (int32(wq[n, o + 1]) << 16)  # 4 bytes = 8 nibbles
            s = float32(0.0)
            for c in range(4):
                s += (int_as_float(MAGIC | ((v >> (8 * c)) & 15)) - float32(8388616.0)) * xv[c]  # 2^23 + 8
                s += (int_as_float(MAGIC | ((v >> (8 * c + 4)) & 15)) - float32(8388616.0)) * xv[4 + c]
            acc[r] += float32(dh[n, b * 9]) * s
    block_reduce_store(y, part, acc, n0, ROWS, w * 32 + lane, RED)


# ---------------------------------------------------------------------------- rung 4: int8 activations
@cuda.jit(device=True, inline=True)
def quantize_x8(v, idv):
    """One activation to int8 as llama.cpp's q8 activations do: round half away from zero of v/d."""
    p = v * idv
    r = int32(math.floor(abs(float64(p)) + 0.5))
    return r if p >= 0 else -r


@cuda.jit
def quantize_x_kernel(xq, xd, x):
    # one thread per block of 32 activations (K/32 threads: x is tiny next to W)
    b = cuda.grid(1)
    if b < xd.size:
        amax = float32(0.0)
        for j in range(QK):
            amax = max(amax, abs(x[b * QK + j]))
        d = amax / float32(127.0)
        idv = float32(1.0) / d if d != 0 else float32(0.0)
        xd[b] = d
        for j in range(QK):
            xq[b * QK + j] = quantize_x8(x[b * QK + j], idv)


@cuda.jit(fastmath=True)
def q8_0_q8act_kernel(y, xq4, xd, wq, dh):
    # xq4: the int8 activations viewed as int32 (4 per word); the rest as in q8_0_rows_kernel
    lane = cuda.threadIdx.x
    w = cuda.threadIdx.y
    n0 = cuda.blockIdx.x * ROWS
    nb = xd.size
    acc = cuda.local.array(ROWS, float32)
    part = cuda.shared.array((ROWS, RED), float32)
    for r in range(ROWS):
        acc[r] = float32(0.0)
    j = lane & 3
    for b in range(w * 8 + (lane >> 2), nb, WARPS * 8):
        xa = int32(xq4[b * 8 + 2 * j])  # activations 8j..8j+3 of block b
        xb = int32(xq4[b * 8 + 2 * j + 1])  # 8j+4..8j+7
        dx = xd[b]
        for r in range(ROWS):
            n = min(n0 + r, y.size - 1)  # past the end: re-read the last row. No branch, so the loads
            # of all ROWS rows can be issued before the first arrives; that row's sum is never stored
            o = b * 17 + 1 + 4 * j
            v0 = int32(wq[n, o])
            v1 = int32(wq[n, o + 1])
            v2 = int32(wq[n, o + 2])
            v3 = int32(wq[n, o + 3])
            s = int32(_sbyte(v0) * _sbyte(xa) + _sbyte(v0 >> 8) * _sbyte(xa >> 8)
                 + _sbyte(v1) * _sbyte(xa >> 16) + _sbyte(v1 >> 8) * _sbyte(xa >> 24)
                 + _sbyte(v2) * _sbyte(xb) + _sbyte(v2 >> 8) * _sbyte(xb >> 8)
                 + _sbyte(v3) * _sbyte(xb >> 16) + _sbyte(v3 >> 8) * _sbyte(xb >> 24))
            acc[r] += float32(dh[n, b * 17]) * dx * float32(s)
    block_reduce_store(y, part, acc, n0, ROWS, w * 32 + lane, RED)


@cuda.jit(fastmath=True)
def q4_0_q8act_kernel(y, xq4, xd, wq, dh):
    lane = cuda.threadIdx.x
    w = cuda.threadIdx.y
    n0 = cuda.blockIdx.x * ROWS
    nb = xd.size
    acc = cuda.local.array(ROWS, float32)
    part = cuda.shared.array((ROWS, RED), float32)
    for r in range(ROWS):
        acc[r] = float32(0.0)
    j = lane & 3
    for b in range(w * 8 + (lane >> 2), nb, WARPS * 8):
        xa = int32(xq4[b * 8 + j])  # activations 4j..4j+3
        xb = int32(xq4[b * 8 + 4 + j])  # 4j+16..4j+19
        dx = xd[b]
        for r in range(ROWS):
            n = min(n0 + r, y.size - 1)  # past the end: re-read the last row. No branch, so the loads
            # of all ROWS rows can be issued before the first arrives; that row's sum is never stored
            o = b * 9 + 1 + 2 * j
            v = int32(wq[n, o]) | (int32(wq[n, o + 1]) << 16)
            s = int32(0)
            for c in range(4):
                byte = (v >> (8 * c)) & 0xFF
                s = int32(s + ((byte & 15) - 8) * _sbyte(xa >> (8 * c)) + ((byte >> 4) - 8) * _sbyte(xb >> (8 * c)))
            acc[r] += float32(dh[n, b * 9]) * dx * float32(s)
    block_reduce_store(y, part, acc, n0, ROWS, w * 32 + lane, RED)


_scratch: dict = {}


def x_scratch(K):
    """Device buffers for x in int8, its scale per block of 32 and the sum of its int8 values per block (the
    last only rung 7 uses), allocated once per K (an allocation inside a timed launch would cost more than the
    kernel)."""
    hit = _scratch.get(K)
    if hit is None:
        nb = max(K // QK, 1)
        hit = _scratch[K] = (cuda.device_array(max(K, 4), np.int8), cuda.device_array(nb, np.float32),
                             cuda.device_array(nb, np.int32))
    return hit


def _torch_gpu():
    from .reductions import torch_gpu

    return torch_gpu()


def _gpu_rungs(fmt):
    BB = FORMATS[fmt]
    op = f"qgemv_{fmt}"
    t1 = {"q8_0": q8_0_thread_per_row_kernel, "q4_0": q4_0_thread_per_row_kernel}[fmt]
    t2 = {"q8_0": q8_0_warp_per_row_kernel, "q4_0": q4_0_warp_per_row_kernel}[fmt]
    t3 = {"q8_0": q8_0_rows_kernel, "q4_0": q4_0_rows_kernel}[fmt]
    t4 = {"q8_0": q8_0_q8act_kernel, "q4_0": q4_0_q8act_kernel}[fmt]
    qdt = "int8" if fmt == "q8_0" else "uint8"
    quants = (lambda Wq: Wq.view(np.int8)) if fmt == "q8_0" else (lambda Wq: Wq)
    sig12 = f"void(float32[::1], float32[::1], {qdt}[:, ::1], float16[:, ::1])"
    sig3 = "void(float32[::1], float32[::1], uint16[:, ::1], float16[:, ::1])"
    sig4 = "void(float32[::1], int32[::1], float32[::1], uint16[:, ::1], float16[:, ::1])"

    def torch_fn(y, x, Wq):
        """torch fp32 x @ W (cuBLAS) on the dequantized weights: 4 bytes per weight."""
        import torch

        from .reductions import torch_view

        W = torch_view(dequantized_fp32(Wq, fmt, "KN", device_array=True))
        torch.matmul(torch_view(x).unsqueeze(0), W, out=torch_view(y).unsqueeze(0))  # (1,K) @ (K,N)

    register(op, "gpu", "torch", baseline=True, bytes=fp32_bytes, requires=_torch_gpu)(torch_fn)

    def fp32_fn(y, x, Wq):
        """Chapter 4's best fp32 x@W GEMV (gemv/splitk_grid) on the dequantized weights: 4 bytes per weight."""
        from .gemv import gemv_splitk_grid

        gemv_splitk_grid(y, x, dequantized_fp32(Wq, fmt, "KN", device_array=True))

    register(op, "gpu", "fp32_gemv", baseline=True, bytes=fp32_bytes)(fp32_fn)

    def r1(y, x, Wq):
        """One thread per output walks its packed row: neighbouring lanes read bytes a whole row
        (BB*K/32 bytes) apart, uncoalesced, like chapter 4's thread_per_row. Predicted: ~10 % of copy."""
        t1[ceil_div(y.size, THREADS), THREADS](y, x, quants(Wq), Wq.view(np.float16))

    register(op, "gpu", "thread_per_row", rung=1, ptx=[(t1, sig12)])(r1)

    def r2(y, x, Wq):
        """One warp per output, lane = element of a block: each warp load is one block's adjacent bytes
        (coalesced), the scale a broadcast. But a load moves only 1 byte per lane (32 bytes per warp
        instruction), plus a 4-byte x load per weight: predicted to be load-instruction bound, ~50 % of copy."""
        t2[ceil_div(y.size, 4), (32, 4)](y, x, quants(Wq), Wq.view(np.float16))

    register(op, "gpu", "warp_per_row", rung=2, ptx=[(t2, sig12)])(r2)

    def r3(y, x, Wq):
        """8 weights per lane from 2-byte loads, and each lane's 8 x values kept in registers for the
        block's 8 outputs: 4x fewer weight loads per byte, 8x fewer x loads; integers become floats by
        the 2^23 bit trick (an OR and a subtraction) instead of the quarter-rate conversion instruction.
        Predicted: >= 80 % of copy on the packed bytes at K = N = 8192."""
        t3[ceil_div(y.size, ROWS), (32, WARPS)](y, x, Wq.view(np.uint16), Wq.view(np.float16))

    register(op, "gpu", "rows", rung=3, ptx=[(t3, sig3)])(r3)

    def r4(y, x, Wq):
        """llama.cpp's GPU path: x first quantized to int8 blocks (a small kernel), then integer products
        summed in int32 and scaled once per block. Numba has no dp4a, so each byte product is a plain
        integer multiply: x costs 1 byte a weight instead of 4 on chip. Predicted: no faster than rung 3
        (the DRAM bytes are the same), a second launch costs ~3 us."""
        xq, xd, _ = x_scratch(x.size)
        quantize_x_kernel[max(1, ceil_div(x.size // QK, 128)), 128](xq, xd, x)
        t4[ceil_div(y.size, ROWS), (32, WARPS)](y, xq.view(np.int32), xd, Wq.view(np.uint16), Wq.view(np.float16))

    register(op, "gpu", "q8act", rung=4, tol=q8act_tol,
             edge_exempt="activations quantized to 8 bits per block of 32: a huge value in a block rounds the block's other values away, by design",
             ptx=[(quantize_x_kernel, "void(int8[::1], float32[::1], float32[::1])"), (t4, sig4)])(r4)


for _f in FORMATS:
    _gpu_rungs(_f)


# ============================================================================ exercise-only ops and edge inputs
from ..registry import EDGE_INPUTS, exercise_op  # noqa: E402

for _f in FORMATS:
    EDGE_INPUTS[f"{_f}_quantize"] = make_quant_nonfinite_edge_inputs
    EDGE_INPUTS[f"{_f}_dequantize"] = dequant_edge_inputs(_f)
EDGE_INPUTS["qgemv_q8_0"] = make_qgemv_edge_inputs


def asym_inputs(size, dtype, rng):
    """Rows with an offset and a random scale, so that most rows are one-sided or lopsided."""
    M, K = size
    X = rng.standard_normal((M, K)) * rng.uniform(0.01, 10, (M, 1)) + rng.uniform(-3, 3, (M, 1))
    return X.astype(np.float32),


def asym_edge_inputs(size, dtype, rng):
    """A row of zeros (scale 1 by convention), an all-positive and an all-negative row, a constant row, and a
    row whose top value rounds (half to even) one step past 127, so a quantizer without the clamp to int8 is off
    by one step there (range [-1.5, 253.5]: scale 1, zero point -126, 253.5 -> 254 - 126 = 128)."""
    (X,) = asym_inputs(size, dtype, rng)
    M, K = X.shape
    rows = [np.zeros(K), np.abs(rng.standard_normal(K)) + 1, -np.abs(rng.standard_normal(K)) - 1, np.full(K, 2.5),
            np.r_[[-1.5, 253.5], rng.uniform(-1.5, 253.5, max(K - 2, 0))][:K]]
    for i, p in enumerate(rng.permutation(M)[:len(rows)]):
        X[p] = rows[i]
    return (X.astype(np.float32),)


exercise_op("int8_asym_roundtrip", reference=int8_asym_roundtrip_ref, make_inputs=asym_inputs, chapter=11,
            title="asymmetric per-row int8: quantize, then dequantize", size_names=("M", "K"), kind="memory",
            output_names=("X_hat",), tol=(1e-5, 1e-6), flops=lambda s: 6 * s[0] * s[1],
            bytes=lambda s, b: 8 * s[0] * s[1],
            sizes={"check": [(1, 1), (7, 33), (13, 100), (3, 257)], "check_sim": [(1, 1), (7, 33)],
                   "bench": [(1024, 1024)]})
EDGE_INPUTS["int8_asym_roundtrip"] = asym_edge_inputs


def measured_speedups(size=(8192, 8192)):
    """The committed H100 measurement: the fastest course rung of each format against chapter 4's fp32
    GEMV (gemv/splitk_grid) on the same shape, as [Q8_0, Q4_0]."""
    import json
    from pathlib import Path

    out = []
    for fmt in ("q8_0", "q4_0"):
        path = BENCH_DATA / "h100" / f"qgemv_{fmt}_gpu.json"
        rows = [r for r in json.loads(path.read_text())["rows"] if "median_s" in r and tuple(r["size"]) == size]
        fp32 = next(r["median_s"] for r in rows if r["variant"] == "fp32_gemv")
        best = min(r["median_s"] for r in rows if not r["baseline"])
        out.append(fp32 / best)
    return np.array(out)


def predict_reference(bpw):
    """The 'predict, then measure' oracle: the measured speed-ups, whatever the bytes per weight."""
    return measured_speedups()


exercise_op("qgemv_predict", reference=predict_reference,
            make_inputs=lambda size, dtype, rng: (np.array([4.0, 34 / 32, 18 / 32]),), chapter=11,
            title="predicted speed-up of Q8_0 / Q4_0 GEMV over fp32", size_names=("n",), kind="memory",
            output_names=("speedup",), tol=(0.25, 0.0), flops=lambda s: 0, bytes=lambda s, b: 0,
            sizes={"check": [(3,)], "check_sim": [(3,)], "bench": [(3,)]})


def q8_0_parts_reference(X):
    """Q8_0 as (fp16 bits of each scale (M, K/32), the int8 values (M, K)), both as int32 (so an
    output element nothing wrote still holds the poison, which no real value equals)."""
    b = q8_0_quantize_ref(X)
    M = b.shape[0]
    blk = b.reshape(M, -1, 34)
    h = blk[..., 0].astype(np.int32) | (blk[..., 1].astype(np.int32) << 8)
    qv = blk[..., 2:].copy().view(np.int8).astype(np.int32).reshape(M, -1)
    return h, qv


exercise_op("q8_0_quantize_parts", reference=q8_0_parts_reference, make_inputs=quant_inputs, chapter=11,
            title="Q8_0 quantize: the fp16 scale bits and the int8 values", size_names=("M", "K"),
            kind="memory", output_names=("h", "q"), tol=(0.0, 0.0), flops=lambda s: 4 * s[0] * s[1],
            bytes=lambda s, b: 8 * s[0] * s[1], sizes=QSIZES)
EDGE_INPUTS["q8_0_quantize_parts"] = make_quant_edge_inputs
