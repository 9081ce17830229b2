"""Exercise-only ops of chapter 20 (tensor cores): one mma tile, and TF32 rounding.

    mma_tile_tf32   D (16,8) = A (16,8) @ B (8,8) + C (16,8), one ``mma.sync.m16n8k8`` on TF32 operands
    tf32_round      y (n,) = x (n,) rounded to TF32: 10 mantissa bits, to nearest, ties away from zero

Both references are written from the definitions, in float64, independently of the bit tricks the kernels use
(``kernels_src.ops.gemm_tc.tf32_round`` adds 0x1000 to the bits and masks; this one scales the mantissa).
"""
from __future__ import annotations

import numpy as np

from ..registry import exercise_op, sprinkle


def reference_mma_tile(A, B, C):
    """float64 oracle: D = A B + C."""
    return A @ B + C


def make_inputs_mma_tile(size, dtype, rng):
    return tuple(rng.standard_normal(s).astype(np.float32) for s in ((16, 8), (8, 8), (16, 8)))


def mma_tile_tol(size, dtype):
    """The tensor core reads the top 19 bits of each float32 (truncation: relative error < 2u, u = 2^-11) unless
    the kernel rounds first; 8 products per output, each of size ~1: |error| < 8 * 4u * max|ab| ~ 0.02 in the
    worst case; allowed 0.05 + float32 sums. A fragment in the wrong place moves whole products (~1)."""
    return 1e-5, 0.05


exercise_op("mma_tile_tf32", reference=reference_mma_tile, make_inputs=make_inputs_mma_tile, chapter=20,
            title="one m16n8k8 TF32 mma: D = A B + C", size_names=("m", "n", "k"), kind="compute",
            output_names=("D",), tol=mma_tile_tol, flops=lambda s: 2 * 16 * 8 * 8, bytes=lambda s, b: 0,
            sizes={"check": [(16, 8, 8)], "check_sim": [(16, 8, 8)], "bench": [(16, 8, 8)]})


def reference_tf32_round(x):
    """float64 oracle: each value rounded to the nearest TF32 number, ties away from zero; inf and NaN unchanged,
    zero keeps its sign. With x = m 2^e (frexp: 0.5 <= |m| < 1), TF32 numbers near x are spaced 2^(e - 11) apart
    (11 significant bits) for normal x, and 2^-136 apart below 2^-126 (subnormals: 10 bits after a fixed point).
    A result of 2^128 or more is beyond float32 (and TF32): inf."""
    x = np.asarray(x, np.float64)
    _, e = np.frexp(x)
    step = np.ldexp(1.0, np.maximum(e, -125) - 11)
    q = x / step
    with np.errstate(invalid="ignore", over="ignore"):
        r = np.sign(q) * np.floor(np.abs(q) + 0.5) * step
        r = np.where(np.abs(r) >= 2.0 ** 128, np.sign(r) * np.inf, r)
    r = np.where(np.isfinite(x), r, x)
    return np.where(x == 0, x, r)


def make_inputs_tf32_round(size, dtype, rng):
    (n,) = size
    x = (rng.standard_normal(n) * np.exp(rng.uniform(-20, 20, n))).astype(np.float32)
    # values exactly halfway between two TF32 numbers (the tie rule decides them), and one ulp either side
    half = (rng.integers(1 << 10, 1 << 11, n) * 2 + 1).astype(np.float64) * 2.0 ** -12  # 1.xxx with a 1 in bit 12
    k = n // 4
    x[:k] = (half[:k] * np.where(rng.random(k) < 0.5, -1, 1)).astype(np.float32)
    return (x,)


def make_edge_inputs_tf32_round(size, dtype, rng):
    (x,) = make_inputs_tf32_round(size, dtype, rng)
    big = np.float32(np.finfo(np.float32).max)  # all mantissa bits set: rounds up, past float32, to inf
    # NaNs whose payload sits only in the low 13 bits: rounding them like numbers would turn them into infinities
    low_nan = np.array([0x7F800001, 0xFF800FFF], np.uint32).view(np.float32)
    sprinkle(x, rng, [0.0, -0.0, np.inf, -np.inf, np.nan, big, -big, 1e-45, -1e-45, 1.1754944e-38, *low_nan])
    return (x,)


exercise_op("tf32_round", reference=reference_tf32_round, make_inputs=make_inputs_tf32_round, chapter=20,
            edge_inputs=make_edge_inputs_tf32_round,
            title="float32 rounded to TF32 (nearest, ties away)", size_names=("n",), kind="memory",
            output_names=("y",), tol=(0.0, 0.0), flops=lambda s: 0, bytes=lambda s, b: 8 * s[0],
            sizes={"check": [(1,), (7,), (1000,)], "check_sim": [(1,), (7,), (1000,)], "bench": [(1000,)]})
