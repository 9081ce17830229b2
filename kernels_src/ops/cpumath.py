"""Vectorizable float32 math for the CPU rungs: ``exp`` and what is built on it (sigmoid, tanh).

Why the course writes its own ``exp``: a Numba loop that calls ``math.exp`` compiles to one call of the C
library's ``expf`` per element (``kernels asm`` shows ``llvm.exp.f32`` in the loop), because LLVM can only
vectorize a call to ``exp`` when it has a vector math library to call instead. Numba uses Intel's SVML for that
only when llvmlite's LLVM carries Intel's SVML patch; the llvmlite wheels on PyPI do not (``numba -s``: "llvmlite
Using SVML Patched LLVM: False"), so on a student's machine every ``exp`` in a loop runs one element at a time,
while the loads, adds and multiplies around it could run 8 (AVX2) or 16 (AVX-512) at a time.

``exp_f32`` below is plain arithmetic that LLVM vectorizes: no calls, no branches, only selects.

    e^x = 2^n * e^r,   n = round(x / ln 2),   r = x - n ln 2  in [-ln2/2, ln2/2]

- ``r`` is computed with ln 2 split in two (Cody and Waite's trick): ``n * LN2_HI`` is exact in float32 because
  LN2_HI has only 16 significant bits and |n| < 2^8, so the reduction loses nothing to rounding;
- ``e^r`` by its Taylor polynomial to degree 7 in Horner form; the first term left out is r^8/8! <= 5.2e-9
  relative at |r| = ln2/2, below float32's half ulp (6.0e-8), so the error is the float32 rounding of the
  Horner steps;
- ``2^n`` straight from its bit pattern, (n + 127) * 2^23 computed in float32 (exact) and converted once
  (:func:`pow2f`, :func:`float32_from_bits`; integer arithmetic would be widened to int64 by Numba), split as
  2^(n - n//2) * 2^(n//2) so that both halves are normal floats for every n the clamp allows: results from
  overflow (inf, for x > 88.72) through the subnormals to 0 (x < -103.9) come out of the same arithmetic.
- NaN stays NaN (a select at the end; the fastmath flags used never include ``nnan``), +inf gives inf, -inf 0.

**Error bound (tested in tests/test_cpumath.py against float64 over 2 million points on [-104, 89]):** at most
:data:`EXP_MAX_REL_ERR` relative error where the result is a normal float (a few float32 ulps; ``expf`` of glibc
is within 1 ulp), and an absolute error below the smallest normal float elsewhere.

The functions are ``@njit(inline="always")`` so that they are inlined into the caller's loop before LLVM's
vectorizer sees it: a call it cannot see through would keep the loop scalar.
"""
from __future__ import annotations

import math

import numpy as np

from ..compiler import float32_from_bits, njit

LOG2E = np.float32(1.0 / math.log(2.0))
LN2_HI = np.float32(0.693145751953125)  # 16 significant bits: n * LN2_HI is exact for |n| < 2^8
LN2_LO = np.float32(math.log(2.0) - 0.693145751953125)
X_HI = np.float32(89.0)  # e^89 overflows float32: inf, as expf gives
X_LO = np.float32(-104.0)  # e^-104 is below the smallest subnormal: 0
C2, C3, C4 = np.float32(1 / 2), np.float32(1 / 6), np.float32(1 / 24)
C5, C6, C7 = np.float32(1 / 120), np.float32(1 / 720), np.float32(1 / 5040)
F0, F1, F2 = np.float32(0.0), np.float32(1.0), np.float32(2.0)
HALF = np.float32(0.5)
BIAS = np.int32(127)
EXP_MAX_REL_ERR = 4e-7  # what tests/test_cpumath.py measures, with a margin: ~3.4 float32 ulps


@njit(inline="always", error_model="numpy")
def pow2i(n):
    """2.0**n for an int32 n in [-126, 127], built from its exponent bits."""
    return float32_from_bits((n + BIAS) << np.int32(23))


TWO23 = np.float32(8388608.0)  # 2**23: one step of the exponent field
BIAS_BITS = np.float32(127 * 8388608.0)  # the exponent bias, already shifted into place


@njit(inline="always", error_model="numpy")
def pow2f(nf):
    """2.0**nf for a whole float32 nf in [-126, 127], built from its exponent bits without integer arithmetic:
    (nf + 127) * 2**23 is a whole number below 2**31 with at most 8 significant bits, so the float computes it
    exactly and one conversion (vcvttps2dq) gives the bit pattern. Numba widens int32 arithmetic to int64, which
    in a vector loop costs a widening, two half-width operations and a narrowing per step; this costs none."""
    return float32_from_bits(np.int32(nf * TWO23 + BIAS_BITS))


@njit(inline="always", error_model="numpy")
def exp_f32(x):
    """e**x in float32 with arithmetic LLVM can vectorize (no libm call); NaN in, NaN out."""
    xc = X_HI if x > X_HI else (x if x >= X_LO else X_LO)  # a NaN x fails both tests: X_LO, a number, ...
    nf = np.floor(xc * LOG2E + HALF)
    r = (xc - nf * LN2_HI) - nf * LN2_LO
    p = F1 + r * (F1 + r * (C2 + r * (C3 + r * (C4 + r * (C5 + r * (C6 + r * C7))))))
    n1 = np.floor(nf * HALF)  # 2^n = 2^(n - n1) 2^n1, both halves normal floats for every n the clamp allows
    y = p * pow2f(nf - n1) * pow2f(n1)
    return y if x == x else x  # ... and the NaN comes back here


@njit(inline="always", error_model="numpy")
def sigmoid_f32(x):
    """1 / (1 + e**-x): 0 for x -> -inf (e**-x = inf), 1 for x -> +inf, no cancellation anywhere."""
    return F1 / (F1 + exp_f32(-x))


@njit(inline="always", error_model="numpy")
def tanh_f32(x):
    """tanh x = 2 sigmoid(2x) - 1. Near 0 this loses relative accuracy (absolute error ~1e-7), which is why
    ``gelu_tanh`` uses the sigmoid form directly: x/2 (1 + tanh u) = x sigmoid(2u)."""
    return F2 * sigmoid_f32(F2 * x) - F1


@njit(cache=True, error_model="numpy")
def exp_array(out, x):
    """out = exp(x) over a 1-D float32 array with the vectorizable exp (used by the tests and ``kernels asm``)."""
    for i in range(x.size):
        out[i] = exp_f32(x[i])


# erfc: the Chebyshev-fitted form of Numerical Recipes (Press et al., 2nd ed., §6.2, ``erfcc``), exact to 1.2e-7
# relative for every x >= 0 in exact arithmetic: erfc(z) = t exp(-z^2 + P(t)) with t = 1 / (1 + z/2), P of degree 9.
# Negative arguments use erfc(-z) = 2 - erfc(z), where nothing cancels (the result lies in [1, 2]).
E0, E1, E2 = np.float32(-1.26551223), np.float32(1.00002368), np.float32(0.37409196)
E3, E4, E5 = np.float32(0.09678418), np.float32(-0.18628806), np.float32(0.27886807)
E6, E7, E8 = np.float32(-1.13520398), np.float32(1.48851587), np.float32(-0.82215223)
E9 = np.float32(0.17087277)
ERFC_MAX_REL_ERR = 2e-6  # what tests/test_cpumath.py measures for z in [-4, 9], with a margin (see erfc_f32)


@njit(inline="always", error_model="numpy")
def erfc_f32(x):
    """erfc(x) in float32 with arithmetic LLVM can vectorize: exp_f32, a division and a polynomial; NaN in, NaN
    out, erfc(+inf) = 0, erfc(-inf) = 2.

    Error: the fit's 1.2e-7 plus float32 rounding, of which one term grows with z: z*z is rounded to half an ulp,
    an absolute error of z^2 * 6e-8 in the exponent, which exp turns into the same relative error in the result:
    about 1e-6 at z = 4 (erfc = 1.5e-8), 5e-6 at z = 9 (erfc = 4e-37, near the bottom of float32). Within 2e-6
    relative for z in [-4, 4] (measured in tests/test_cpumath.py); glibc's erfcf, which splits z^2 exactly, stays
    within 2 ulp everywhere."""
    z = abs(x)
    t = F1 / (F1 + HALF * z)
    p = E0 + t * (E1 + t * (E2 + t * (E3 + t * (E4 + t * (E5 + t * (E6 + t * (E7 + t * (E8 + t * E9))))))))
    r = t * exp_f32(p - z * z)  # z = inf: t = 0, p - inf = -inf, exp = 0, 0 * 0 = 0
    return r if x >= F0 else F2 - r  # a NaN x fails the test: 2 - NaN = NaN


# A cheaper erfc for z >= 0 that shares its exp: the Hastings fit of Abramowitz and Stegun (1964) 7.1.26,
# erfc(z) = t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) e^(-z^2), t = 1 / (1 + p z), absolute error <= 1.5e-7 in exact
# arithmetic. Degree 5 instead of erfc_f32's 9, and the factor e^(-z^2) is the very exp that the GELU's backward
# needs for its density phi(x) = e^(-x^2/2) / sqrt(2 pi) (z = |x|/sqrt 2): one exp per element instead of two.
# The bound is absolute, not relative: in the far tail (z > ~4, erfc < 1.5e-8) the relative error grows, which the
# activations' absolute tolerance (1e-6) covers; erfc_f32 stays the accurate choice where relative error matters.
AS_P = np.float32(0.3275911)
AS_A1, AS_A2, AS_A3 = np.float32(0.254829592), np.float32(-0.284496736), np.float32(1.421413741)
AS_A4, AS_A5 = np.float32(-1.453152027), np.float32(1.061405429)
ERFC_AS_MAX_ABS_ERR = 7e-7  # tests/test_cpumath.py measures 5.9e-7 on [-12, 12]: the fit's 1.5e-7 plus float32 rounding near 1


@njit(inline="always", error_model="numpy")
def erfc_as_poly(az):
    """t P(t) for az = |z| >= 0, so that erfc(az) = erfc_as_poly(az) * exp(-az * az) (A&S 7.1.26); az = inf gives
    t = 0 and 0; a NaN az gives NaN."""
    t = F1 / (F1 + AS_P * az)
    return t * (AS_A1 + t * (AS_A2 + t * (AS_A3 + t * (AS_A4 + t * AS_A5))))


@njit(inline="always", error_model="numpy")
def erfc_as_f32(x):
    """erfc(x) from A&S 7.1.26 (absolute error <= ERFC_AS_MAX_ABS_ERR); erfc(-z) = 2 - erfc(z); NaN in, NaN out."""
    z = abs(x)
    r = erfc_as_poly(z) * exp_f32(-(z * z))
    return r if x >= F0 else F2 - r


@njit(cache=True, error_model="numpy")
def erfc_as_array(out, x):
    """out = erfc_as_f32(x) over a 1-D float32 array (for the tests)."""
    for i in range(x.size):
        out[i] = erfc_as_f32(x[i])


# ---------------------------------------------------------------------------------------------------------------
# 2^w for w <= 0 with fewer instructions than exp_f32 (issue 36, the exact GELU's rung 5): the argument comes already
# multiplied by log2(e) (the caller folds that constant into its own multiply), so there is no Cody-Waite reduction;
# n = rint(w) is one instruction (vrndscaleps), f = w - n in [-1/2, 1/2] is exact (Sterbenz), and 2^f is a degree-5
# polynomial fitted by us for minimal relative error on [-1/2, 1/2] (Lawson-weighted least squares on 3000 Chebyshev
# nodes, tools of any numerical-analysis text: 7.5e-8 relative in exact arithmetic, where the degree-5 Taylor
# polynomial of e^(f ln 2) leaves 2.4e-6). w < -100 gives 0 (2^-100 = 7.9e-31), never a subnormal product (the
# microcode assist exp_nonpos's docstring describes); -inf gives 0, NaN gives NaN.
X2_0, X2_1, X2_2 = np.float32(1.000000071654657), np.float32(0.6931469670638649), np.float32(0.24022119723933844)
X2_3, X2_4, X2_5 = np.float32(0.05550713274960299), np.float32(0.009675541330688658), np.float32(0.0013276471519893397)
EXP2_FLOOR = np.float32(-100.0)
EXP2_MAX_REL_ERR = 3e-7  # tests/test_cpumath.py measures 2.3e-7 on [-100, 0]: the fit's 7.5e-8 + Horner roundings


@njit(inline="always", error_model="numpy")
def exp2_nonpos_f32(w):
    """2**w for w <= 0 (within EXP2_MAX_REL_ERR relative), 0 for w < -100 and -inf, NaN for NaN: about 11 vector
    instructions (a clamp, rint, a subtraction, 5 FMAs, 2^n from its bits in 2, the product with a zeroing select)."""
    wc = EXP2_FLOOR if w < EXP2_FLOOR else w  # a NaN w fails the test and stays NaN
    nf = np.rint(wc)
    f = wc - nf
    p = X2_0 + f * (X2_1 + f * (X2_2 + f * (X2_3 + f * (X2_4 + f * X2_5))))
    y = p * pow2f(nf)  # NaN: rint(NaN) = NaN, and p is NaN anyway
    return F0 if w < EXP2_FLOOR else y


@njit(cache=True, error_model="numpy")
def exp2_nonpos_array(out, w):
    """out = exp2_nonpos_f32(w) over a 1-D float32 array (for the tests)."""
    for i in range(w.size):
        out[i] = exp2_nonpos_f32(w[i])


# The exact GELU with one 2^w, no cancellation select and the density for free (rung 5 of gelu and gelu_bwd).
# With a = |x|, the upper tail of the normal distribution Q(a) = erfc(a/sqrt 2)/2 is, by A&S 7.1.26 with the 1/sqrt 2
# and the 1/2 folded into the constants, t P(t) e^(-a^2/2) with t = 1/(1 + p a / sqrt 2). We compute the exponential
# already divided by sqrt(2 pi), phi(x) = e^(-x^2/2)/sqrt(2 pi) = 2^(x (x C) + K), the normal density the backward
# needs; its FMA costs what the plain multiply did, and sqrt(2 pi) moves into P's coefficients. Then
#     h = 1/2 - Q(a)  (one FMA),   Phi(x) = 1/2 + copysign(h, x),   gelu(x) = x Phi(x) = x/2 + a h  (one FMA):
# x h sign(x) = a h, so no select on the sign. For x < 0 the result x Q is formed as x/2 - |x|/2 + |x| Q: the rounding
# of h (half an ulp of 1/2, 3e-8) becomes an absolute error of |x| 3e-8 in gelu(x), below the tolerance's 1e-6
# absolute wherever Q is not 0 (|x| < 11.8); where 2^w is 0 the result is exactly 0 (and NaN at -inf, as x * 0).
SQRT_2PI = math.sqrt(2.0 * math.pi)
GQ_P = np.float32(0.3275911 / math.sqrt(2.0))
GQ_B1, GQ_B2 = np.float32(0.254829592 * SQRT_2PI / 2), np.float32(-0.284496736 * SQRT_2PI / 2)
GQ_B3, GQ_B4 = np.float32(1.421413741 * SQRT_2PI / 2), np.float32(-1.453152027 * SQRT_2PI / 2)
GQ_B5 = np.float32(1.061405429 * SQRT_2PI / 2)
GQ_C = np.float32(-0.5 / math.log(2.0))  # x (x C) = -x^2/2 in units of ln 2
GQ_K = np.float32(math.log2(1.0 / SQRT_2PI))  # + log2(1/sqrt(2 pi)): 2^(...) is the density itself
GELU_MAX_ABS_ERR = 7.5e-7  # tests/test_cpumath.py: |error| / max(1, |value|) over [-14, 14], 3.2e-7 measured


@njit(inline="always", error_model="numpy")
def gelu_parts(x):
    """(a, h, phi) for one float32 x: a = |x|, h = 1/2 - Q(|x|), phi = the normal density at x (see above)."""
    a = abs(x)
    phi = exp2_nonpos_f32(x * (x * GQ_C) + GQ_K)
    t = F1 / (F1 + GQ_P * a)
    tp = t * (GQ_B1 + t * (GQ_B2 + t * (GQ_B3 + t * (GQ_B4 + t * GQ_B5))))
    return a, HALF - tp * phi, phi


@njit(inline="always", error_model="numpy")
def gelu_f32(x):
    """x Phi(x) = x/2 + |x| (1/2 - Q(|x|)): no select; NaN in, NaN out; -inf gives NaN (the reference's -inf * 0)."""
    a, h, _ = gelu_parts(x)
    return HALF * x + a * h


@njit(inline="always", error_model="numpy")
def gelu_grad_f32(x):
    """Phi(x) + x phi(x), the exact GELU's derivative, from the same parts."""
    _, h, phi = gelu_parts(x)
    return (HALF + math.copysign(h, x)) + x * phi


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def gelu_array(out, x):
    """out = gelu_f32(x) (for the tests)."""
    for i in range(x.size):
        out[i] = gelu_f32(x[i])


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def gelu_grad_array(out, x):
    """out = gelu_grad_f32(x) (for the tests)."""
    for i in range(x.size):
        out[i] = gelu_grad_f32(x[i])


@njit(inline="always", error_model="numpy")
def sigmoid_pair_f32(z):
    """(sigmoid(z), 1 - sigmoid(z)) from u = 2^(-|z| log2 e) = e^(-|z|) <= 1 (exp2_nonpos_f32): 1/(1 + u) and
    u/(1 + u), the larger one by the sign of z; neither is a difference, so both keep their relative accuracy in the
    tails (u is 0 past |z| = 69.3, and then the pair is exactly (1, 0) or (0, 1)). NaN in, NaNs out. Relative error:
    2 EXP2_MAX_REL_ERR + 2 ulp + |z| 6e-8, the last term the rounding of |z| log2 e (4e-6 at |z| = 69; exp_nonpos's
    exact Cody-Waite reduction avoids it, at two more instructions): within the activations' 1e-5 relative
    tolerance (tested in tests/test_cpumath.py)."""
    u = exp2_nonpos_f32(abs(z) * NLOG2E)
    r = F1 / (F1 + u)
    ur = u * r
    return (r, ur) if z >= F0 else (ur, r)


NLOG2E = np.float32(-1.0 / math.log(2.0))
