"""Exercise-only ops of chapter 19 (half precision): a float64 reference, inputs and a tolerance each, no ladder.

  fp16_decode       h (n,) uint16 fp16 bit patterns -> out (n,) float32 values (exact: tolerance 0)
                    the reader decodes sign, exponent and mantissa fields, subnormals, inf and NaN
  rmsnorm_fp16_y    x (M,N) float16, gamma (N,) float32 -> y (M,N) float16: RMSNorm with fp16 in and out and
                    float32 inside (graded with dtype="float16": the output is a float16 array)
  half_error_bound  x (n,) float32, bits -> out (n,) float32: half the spacing of a format with ``bits`` stored
                    mantissa bits at |x| (normal range), the largest error of storing x rounded to nearest
"""
from __future__ import annotations

import numpy as np

from ..registry import exercise_op
from . import half, norms

# ------------------------------------------------------------------------------------------ fp16_decode
SPECIAL16 = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x0401, 0x3BFF, 0x3C00, 0x3C01, 0x7BFF,
                      0xFBFF, 0x7C00, 0xFC00, 0x7C01, 0x7E00, 0xFE00, 0x7FFF, 0x0200, 0x3555], dtype=np.uint16)


def fp16_decode_reference(h):
    """float64 values of fp16 bit patterns, through NumPy's float16 (which never runs the reader's code)."""
    return np.ascontiguousarray(np.asarray(h, dtype=np.uint16)).view(np.float16).astype(np.float64)


def make_inputs_decode(size, dtype, rng):
    """Random patterns: every exponent (subnormals, normals, inf/NaN) appears at n of a few hundred."""
    return (rng.integers(0, 1 << 16, size=size).astype(np.uint16),)


def make_edge_inputs_decode(size, dtype, rng):
    """The patterns where decoders go wrong (signed zeros, smallest and largest subnormal, smallest normal,
    1 and its neighbours, the largest finite, +-inf, NaNs with several payloads), then random ones."""
    (h,) = make_inputs_decode(size, dtype, rng)
    k = min(h.size, SPECIAL16.size)
    h.reshape(-1)[:k] = SPECIAL16[:k]
    return (h,)


exercise_op("fp16_decode", reference=fp16_decode_reference, make_inputs=make_inputs_decode, chapter=19,
            title="fp16 bit patterns to float32 by their fields", size_names=("n",), kind="memory",
            tol=(0.0, 0.0), output_names=("out",), edge_inputs=make_edge_inputs_decode,
            sizes={"check": [(1,), (7,), (1000,)], "check_sim": [(1,), (7,)], "bench": [(1 << 16,)]},
            flops=lambda s: 4 * s[0], bytes=lambda s, b: 6 * s[0])


# ---------------------------------------------------------------------------------------- rmsnorm_fp16_y
def rms_fp16_reference(x, gamma):
    """float64 oracle: RMSNorm of the fp16 values (x arrives as float64 values), y only."""
    return norms.rms_reference(np.asarray(x, np.float64), gamma)[0]


def make_inputs_rms16(size, dtype, rng):
    x, g = norms.rms_make_inputs(size, np.dtype(np.float32), rng)
    return x.astype(np.float16), g


def make_edge_inputs_rms16(size, dtype, rng):
    """Rows cycling through: zeros (y = 0), magnitudes near 3e4 (x^2 overflows fp16, not float32), fp16
    subnormals around 1e-6 (x^2 underflows fp16), and an ordinary row."""
    m, n = size
    x, g = make_inputs_rms16(size, dtype, rng)
    x = x.astype(np.float32)
    for i in range(m):
        k = i % 4
        if k == 0:
            x[i] = 0.0
        elif k == 1:
            x[i] = 3.0e4 * np.sign(rng.standard_normal(n)) * rng.uniform(0.5, 1.0, n)
        elif k == 2:
            x[i] = 1e-6 * rng.standard_normal(n)
    return x.astype(np.float16), g


exercise_op("rmsnorm_fp16_y", reference=rms_fp16_reference, make_inputs=make_inputs_rms16, chapter=19,
            title="RMSNorm, fp16 in and out, float32 inside", size_names=("M", "N"), kind="memory",
            # u(fp16) + the float32 op's own error (chapter 7's 1e-5): half.half_tol, the chapter's one rule
            tol=half.half_tol("float16", 1e-5, 1e-5), output_names=("y",), edge_inputs=make_edge_inputs_rms16,
            sizes={"check": [(1, 1), (3, 7), (4, 33)], "check_sim": [(1, 1), (3, 7), (4, 33)],
                   "bench": [(64, 256)]},
            flops=lambda s: 4 * s[0] * s[1], bytes=lambda s, b: 4 * s[0] * s[1])


# -------------------------------------------------------------------------------------- half_error_bound
def error_bound_reference(x, bits):
    """float64 oracle: half the spacing of a (bits + 1)-significant-bit format at |x|: |x| = m 2^e with
    0.5 <= m < 1 (frexp, exact), spacing 2^(e - 1 - bits)."""
    _, e = np.frexp(np.abs(np.asarray(x, np.float64)))
    return np.ldexp(1.0, e.astype(np.int64) - 2 - int(bits))


def make_inputs_bound(size, dtype, rng):
    """Activations across 20 binades (never 0), a quarter exact powers of two and their float32 neighbours
    below (where log-based answers may land in the wrong binade); bits 7 (bf16) or 10 (fp16)."""
    n = size[0]
    e = rng.integers(-10, 10, n)
    x = np.ldexp(rng.uniform(1.0, 2.0, n), e) * np.where(rng.random(n) < 0.5, -1.0, 1.0)
    k = n // 4
    x[:k] = np.ldexp(1.0, e[:k])
    x = x.astype(np.float32)
    if k:
        x[k:2 * k] = np.nextafter(np.abs(x[:k]), np.float32(0)) * np.sign(x[k:2 * k])
    return x, int(rng.choice([7, 10]))


exercise_op("half_error_bound", reference=error_bound_reference, make_inputs=make_inputs_bound, chapter=19,
            title="the largest error of storing x with a given number of mantissa bits", size_names=("n",),
            kind="memory", tol=(0.0, 0.0), output_names=("out",),
            sizes={"check": [(1,), (8,), (1000,)], "check_sim": [(1,), (8,)], "bench": [(1000,)]},
            flops=lambda s: 2 * s[0], bytes=lambda s, b: 8 * s[0])
