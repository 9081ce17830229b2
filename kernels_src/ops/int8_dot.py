"""int8_dot: a Q8_0 GEMV on int8 activations with ``dp4a``, the exercise of chapter 11 (question 7).

Shapes (fixed letters, as ``qgemv_q8_0``)
  x  (K,)              float32 activations, K a multiple of 32
  Wq (N, K/32*34)      uint8, GGML's Q8_0 blocks: row n holds column n of W; block b of a row is a 2-byte fp16
                       scale d_w followed by 32 int8 quants
  y  (N,)              y = x . dequant(Wq)^T

What the student builds (``solutions/ch11_quantization.md``): x quantized to int8 per block of 32 with Q8_0's own
rule (d_x = amax/127, q_x = round(x/d_x), half away from zero), both operands packed four int8 to an int32 word,
and the block's integer dot product taken with the course's ``dp4a`` (:mod:`kernels_src.compiler.inline_ptx`; the
simulator emulates it with the same integer rules), then scaled once per block by d_w d_x:

    y[n] = sum_b d_w[n, b] d_x[b] sum_{j<32} q_w[n, 32b + j] q_x[32b + j]

The oracle is the float64 product of the dequantized weights with the *unquantized* x (``qgemv_ref("q8_0")``):
the answer differs from it by the rounding of x, and the tolerance (:func:`dp4a_tol`) is derived from that
rounding. The edge inputs (:func:`dp4a_edge_inputs`) stay inside the model the tolerance assumes (x of unit scale
or smaller), and hold what goes wrong in integer code: a block of zero activations (d_x = 0: no 1/0), a tie +a/-a
for the largest magnitude, a block 1000 times smaller than the rest (each block its own d_x), weight bytes of every
value from -128 to 127 (sign extension), a weight block with d_w = 0 and one with a negative d_w.
"""
from __future__ import annotations

import math

import numpy as np

from ..registry import exercise_op
from .quant import QK, q8_0_quantize_ref, qgemv_inputs, qgemv_ref


def dp4a_tol(size, dtype):
    """(rtol, atol) for y against the float64 product with the unquantized x.

    Each activation is rounded to its block's grid: x_hat - x is close to uniform on [-d_x/2, d_x/2], variance
    d_x^2/12, with d_x = amax/127. For 32 unit normals E[amax^2] = 5.5 (quant_error.gaussian_amax_moments), so
    the rms of d_x is sqrt(5.5)/127 = 0.0185 and a product w x moves by 0.0053 |w| (std). y sums K of them:
    std 0.0053 rms(w) sqrt(K). The weights here have rms(w) <= 1.0 (unit normals through Q8_0; the edge rows of
    raw bytes use d_w = 0.01, rms 0.74). Allowed: 0.05 sqrt(K), at least 9 standard deviations. A block of 32
    products left out or counted twice moves y by ~sqrt(32) = 5.7, beyond the band for every K below 13,000 (the
    checks use K <= 1184). The relative part covers the float32 products and sums (eps * nb for nb blocks)."""
    K = size[0]
    return 1e-5, 0.05 * math.sqrt(K)


def dp4a_edge_inputs(size, dtype, rng):
    """x and Wq (size (K, N)) with the values where int8 code goes wrong, within the tolerance's model."""
    K, N = size
    nb = K // QK
    x = rng.standard_normal(K).astype(np.float32)
    xb = x.reshape(nb, QK)
    kinds = ["zero", "tie", "small"]
    for b, kind in zip(rng.permutation(nb), kinds):
        if kind == "zero":
            xb[b] = 0.0  # d_x = 0: 1/d_x must not be taken (the quants are 0)
        elif kind == "tie":
            xb[b, :2] = [-2.5, 2.5]  # the largest magnitude twice, with both signs
            xb[b, 2:] = np.clip(xb[b, 2:], -2.0, 2.0)
        else:
            xb[b] *= np.float32(1e-3)  # its own, small d_x
    W = rng.standard_normal((N, K)).astype(np.float32)
    Wq = q8_0_quantize_ref(W).reshape(N, nb, 34)
    n = rng.integers(N)
    Wq[n, :, 2:] = rng.integers(0, 256, size=(nb, 32), dtype=np.uint8)  # every byte, -128 (0x80) included
    Wq[n, :, 2:][0, :4] = [0x80, 0x7F, 0xFF, 0x01]  # -128, 127, -1, 1 in the first word
    Wq[n, :, 0:2] = np.full((nb, 1), 0.01, np.float16).view(np.uint8)
    blocks = Wq.reshape(-1, 34)
    pick = rng.permutation(blocks.shape[0])[:2]
    blocks[pick[0], 0:2] = np.array([0.0], np.float16).view(np.uint8)  # d_w = 0
    if pick.size > 1:
        blocks[pick[1], 0:2] = np.array([-0.03], np.float16).view(np.uint8)  # a negative scale
    return x, Wq.reshape(N, nb * 34)


GSIZES = {"check": [(32, 1), (96, 7), (224, 13), (1184, 37)],
          "check_sim": [(32, 1), (64, 7), (96, 3), (160, 33)]}

exercise_op("q8_0_dp4a_gemv", reference=qgemv_ref("q8_0"), make_inputs=qgemv_inputs("q8_0"), chapter=11,
            title="Q8_0 GEMV on int8 activations with dp4a (exercise)", size_names=("K", "N"), kind="memory",
            output_names=("y",), tol=dp4a_tol, edge_inputs=dp4a_edge_inputs, sizes=GSIZES,
            flops=lambda s: 2 * s[0] * s[1], bytes=lambda s, b: s[1] * (s[0] // QK) * 34 + 4 * s[0] + 4 * s[1])
