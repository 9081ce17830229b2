"""Mixed-precision optimizer steps: bfloat16 rounding done with integers, stochastic rounding from Philox,
loss scaling, and AdamW with bf16 weights, with and without an fp32 master copy (chapter 12).

bfloat16 is the top half of a float32: 1 sign bit, the same 8 exponent bits, 7 mantissa bits. Kernels here
hold a bf16 number as its uint16 bit pattern ``h``; its value is the float32 with bits ``h << 16``.
Rounding a float32 with bits ``u`` to bf16 is integer arithmetic on ``u``:

  round to nearest, ties to even   h = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
  stochastic rounding              h = (u + r) >> 16,   r = 16 uniformly random bits
  NaN (either)                     h = 0x7FC0 (a quiet NaN; the addition could carry a NaN into -0.0 or inf)

Stochastic rounding rounds up (away from zero) with probability (low 16 bits of u) / 2^16, which is exactly
the fraction of the way from the truncated value to the next bf16 number: E[SR(x)] = x for every float32 x
(below the overflow threshold). An update too small to move a bf16 weight by rounding to nearest then moves it
by one ulp with a matching probability, so on average it is not lost. The random bits come from the course's
Philox stream (kernels_src/ops/philox.py): element i of step t uses the low 16 bits of word i of the stream
(seed, offset = t), so the CPU, the simulator and the GPU draw the same bits and the reference can check them.

Shapes and bytes (fp32 m, v; bf16 gradients, as the backward pass of a bf16 model delivers them):

  adamw_mixed  p32, g16, m, v (N,) -> p32', m', v' (N,) fp32 and w16' (N,) bf16 bits
               the AdamW step on the fp32 master copy p32; w16' = RNE(p32') is the copy the next forward pass
               reads. Reads 4 + 2 + 4 + 4, writes 4 + 4 + 4 + 2: 28 B/param.
  adamw_bf16   w16, g16, m, v (N,), ..., seed, sr -> w16', m', v'
               no master copy: the step is computed in fp32 from the bf16 weight and rounded back to bf16,
               to nearest even (sr = 0) or stochastically (sr = 1). Reads 2 + 2 + 4 + 4, writes 2 + 4 + 4:
               22 B/param. The Philox work (about 20 integer instructions per parameter) must hide under that.

The rounding of the new weight is the rounding of the step's fp32 result (as any fp32 kernel computes it); the
float64 reference rounds float32(p') the same way. Where p' lies within a few fp32 ulps of a rounding boundary
(or, for SR, of the threshold set by that element's random bits) an fp32 kernel and the float64 reference may
legitimately round differently by one bf16 ulp, so ``make_inputs`` redraws such elements (about 0.2 % of them):
every rounding that the checks compare is decided by more than 64 fp32 ulps.

Ladder
  adamw_mixed  cpu/loop   rung 1  @njit loop; the bits of p32' read back through a uint32 view of the output
  adamw_mixed  gpu/fused  rung 1  one thread per parameter: 28 B/param, predict ~90 % of copy
  adamw_bf16   cpu/loop   rung 1  @njit loop, one Philox call per 4 parameters
  adamw_bf16   gpu/fused4 rung 1  one thread per 4 parameters (one Philox call gives 4 words): 22 B/param;
                                  measured 46-49 % of copy on the H100 (sr = 0 as slow as sr = 1): strided
                                  2- and 4-byte accesses, each parameter's loads issued after the previous one's
                                  stores (the compiler cannot prove the arrays do not alias)
  adamw_bf16   gpu/vec    rung 2  the same threads and roundings, each array moved by one coalesced 8-byte
                                  (bf16 as uint64) or 16-byte (m, v: load4/store4) access per thread

Loss scaling (``LossScaler``, host logic, NumPy): multiply the loss by S before the backward pass so small
fp16 gradients do not underflow, divide the gradients by S before the step, skip the step and halve S when
a gradient is inf/NaN, double S after ``growth_interval`` good steps (torch.amp.GradScaler's rule).

Exercise-only ops: ``bf16_round_nearest`` (RNE by integer arithmetic, checked against a float64 oracle that
never looks at bits), ``bf16_sr_mean`` (stochastic rounding, checked by the mean of many roundings), and
``clip_block_partials`` (the first pass of a deterministic global norm).
"""
from __future__ import annotations

import math

import numpy as np

from .. import device
from ..compiler import cuda, float32_from_bits, load4, njit, store4
from ..device import ceil_div
from ..registry import define_op, exercise_op, register
from ..registry import sprinkle as _sprinkle
from . import philox
from .optim import CHECK_HYPER, _adam_coeffs, adamw_reference

THREADS = 256
NAN16 = 0x7FC0  # the bf16 quiet NaN every variant writes for a NaN

# NumPy scalar constants: Numba freezes them as typed uint32 constants, and the simulator computes in NumPy
# scalars without overflow (no finite float32's bits plus 0xFFFF reach 2^32).
U16, U0x7FFF, U1, UFFFF = np.uint32(16), np.uint32(0x7FFF), np.uint32(1), np.uint32(0xFFFF)
UHI16 = np.uint32(0xFFFF0000)
U64_32, U64_LO = np.uint64(32), np.uint64(0xFFFFFFFF)
H_NAN = np.uint16(NAN16)


# ================================================================================ bf16 in NumPy
def f32_bits(x):
    """float32 bit patterns (uint32) of ``x`` (rounded to float32 first)."""
    return np.ascontiguousarray(np.asarray(x, dtype=np.float32)).view(np.uint32)


def bf16_value(h):
    """The values (float64) of bf16 bit patterns ``h`` (uint16)."""
    h = np.ascontiguousarray(np.asarray(h, dtype=np.uint16))
    return (h.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def bf16_bits_rne(x):
    """float32 values -> bf16 bits, rounded to nearest, ties to even, by integer arithmetic; NaN -> 0x7FC0."""
    x = np.asarray(x, dtype=np.float32)
    u = f32_bits(x).astype(np.uint64)
    h = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(NAN16), h)


def bf16_bits_sr(x, r):
    """float32 values -> bf16 bits, rounded stochastically: add the low 16 bits of ``r`` (uint32 random words)
    to the float32 bits, then drop the low 16 bits; NaN -> 0x7FC0."""
    x = np.asarray(x, dtype=np.float32)
    u = f32_bits(x).astype(np.uint64) + (np.asarray(r, dtype=np.uint64) & 0xFFFF)
    return np.where(np.isnan(x), np.uint16(NAN16), (u >> 16).astype(np.uint16))


def bf16_round_arith(x):
    """float64 oracle of bf16 round-to-nearest-even that never looks at bits: x = m 2^e with 0.5 <= |m| < 1;
    bf16 keeps 8 significant bits (spacing 2^(e-8)), and at most 2^-133 apart below 2^-126 (subnormals);
    np.round rounds halves to even. Results beyond the largest bf16 become inf (as float32 does)."""
    x = np.asarray(x, dtype=np.float64)
    out = x.copy()
    fin = np.isfinite(x) & (x != 0)
    m, e = np.frexp(x[fin])
    e = np.maximum(e, -125)  # below 2^-126 the spacing stays 2^-133
    with np.errstate(over="ignore"):
        out[fin] = np.ldexp(np.round(np.ldexp(x[fin], 8 - e)), e - 8).astype(np.float32)
    return out


def ulps_from_boundary(x, r=None):
    """How far (in fp32 ulps, i.e. counts of the low 16 bits) float32(x) lies from the point where its bf16
    rounding flips: 0x8000 for round-to-nearest, or 0x10000 - (r & 0xFFFF) for stochastic rounding with
    random words ``r``. Non-finite elements get a large distance (their rounding does not depend on it)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        low = (f32_bits(x) & np.uint32(0xFFFF)).astype(np.int64)
    if r is None:
        d = np.abs(low - 0x8000)
    else:
        d = np.abs(low + (np.asarray(r, dtype=np.int64) & 0xFFFF) - 0x10000)
    return np.where(np.isfinite(x), d, 1 << 20)


def sr_bits(seed, step, n):
    """The random words of stochastic rounding at step ``step``: the Philox stream (seed, offset = step)."""
    return philox.stream_bits(seed, step, n)


# ================================================================================ references
def adamw_mixed_reference(p, g16, m, v, step, lr, beta1, beta2, eps, wd):
    """float64 oracle: the AdamW step on the fp32 master copy with the bf16 gradient's value, and the new
    bf16 weights = RNE(float32(p'))."""
    p_new, m_new, v_new = adamw_reference(p, bf16_value(g16), m, v, step, lr, beta1, beta2, eps, wd)
    with np.errstate(over="ignore", invalid="ignore"):
        return p_new, m_new, v_new, bf16_bits_rne(p_new)


def adamw_bf16_reference(w16, g16, m, v, step, lr, beta1, beta2, eps, wd, seed, sr):
    """float64 oracle: the AdamW step from the bf16 weight's value, rounded back to bf16 (RNE, or SR with the
    Philox stream (seed, step))."""
    p_new, m_new, v_new = adamw_reference(bf16_value(w16), bf16_value(g16), m, v, step, lr, beta1, beta2, eps, wd)
    with np.errstate(over="ignore", invalid="ignore"):
        w = bf16_bits_sr(p_new, sr_bits(seed, step, p_new.size)) if sr else bf16_bits_rne(p_new)
    return w, m_new, v_new


# ====================================================================================== inputs
MARGIN = 64  # fp32 ulps a compared rounding must be away from its boundary (see the docstring)


def _draw(n, rng):
    p = rng.standard_normal(n)
    g = rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 0, n)
    m = 0.1 * rng.standard_normal(n)
    v = m * m + 0.01 * rng.standard_normal(n) ** 2
    return p, g, m, v


def _away_from_boundaries(arrays, rng, new_p, r=None):
    """Redraw the elements whose new weight rounds within MARGIN fp32 ulps of a boundary (in place). Skipped
    for benchmark sizes (above 2^22 elements), whose outputs are timed, never compared."""
    if arrays[0].size > 1 << 22:
        return
    for _ in range(100):
        near = ulps_from_boundary(new_p(), r) <= MARGIN
        if not near.any():
            return
        fresh = _draw(int(near.sum()), rng)
        for a, f in zip(arrays, fresh):
            a[near] = f
    raise RuntimeError("could not draw inputs away from the rounding boundaries")


def make_inputs_mixed(size, dtype, rng):
    """p ~ N(0,1) (fp32 master), g in bf16 with magnitudes 1e-3..1, m, v as for AdamW; step 1..10."""
    (n,) = size
    h = CHECK_HYPER
    step = 1 + n % 10
    p, g, m, v = _draw(n, rng)
    hyper = (step, h["lr"], h["beta1"], h["beta2"], h["eps"], h["wd"])

    def new_p():
        return adamw_reference(p.astype(np.float32), bf16_value(bf16_bits_rne(g)), m.astype(np.float32),
                               v.astype(np.float32), *hyper)[0]

    _away_from_boundaries((p, g, m, v), rng, new_p)
    return (p.astype(np.float32), bf16_bits_rne(g), m.astype(np.float32), v.astype(np.float32), *hyper)


def make_inputs_bf16(size, dtype, rng):
    """bf16 weights ~ N(0,1) and gradients (1e-3..1), fp32 m, v; ``sr`` from the size; a seed drawn."""
    n, sr = size
    h = CHECK_HYPER
    step = 1 + n % 10
    seed = int(rng.integers(0, 2**63))
    p, g, m, v = _draw(n, rng)
    hyper = (step, h["lr"], h["beta1"], h["beta2"], h["eps"], h["wd"])
    r = sr_bits(seed, step, n) if sr else None

    def new_p():
        return adamw_reference(bf16_value(bf16_bits_rne(p)), bf16_value(bf16_bits_rne(g)), m.astype(np.float32),
                               v.astype(np.float32), *hyper)[0]

    _away_from_boundaries((p, g, m, v), rng, new_p, r)
    return (bf16_bits_rne(p), bf16_bits_rne(g), m.astype(np.float32), v.astype(np.float32), *hyper, seed, int(sr))


EDGE_G = [0.0, -0.0, 1e-30, -1e-39, 1e18, -1e18, np.inf, np.nan]  # bf16 holds all; 1e18^2 still fits fp32


def make_edge_inputs_mixed(size, dtype, rng):
    """Gradients 0, -0, 1e-30, a bf16 subnormal, +-1e18 (g^2 fits fp32; beyond ~1.8e19 it overflows, the
    limit optim.py documents), inf and NaN (that parameter and its m, v come out NaN, its bf16 weight 0x7FC0);
    a zero state (m = v = 0) at the zero gradients; step 1; master weights +-inf (they stay +-inf, bf16 0x7F80 /
    0xFF80: torch's AdamW rule, see optim.py)."""
    p, g16, m, v, step, *hyper = make_inputs_mixed(size, dtype, rng)
    g = bf16_value(g16)
    _sprinkle(g, rng, EDGE_G)
    _sprinkle(p, rng, [np.inf, -np.inf])
    z = g == 0
    m[z], v[z] = 0.0, 0.0
    return (p, bf16_bits_rne(g), m, v, 1, *hyper)


def make_edge_inputs_bf16(size, dtype, rng):
    """As ``make_edge_inputs_mixed``, plus weights +-0 and +-inf (inf stays inf under either rounding)."""
    w16, g16, m, v, step, lr, b1, b2, eps, wd, seed, sr = make_inputs_bf16(size, dtype, rng)
    g = bf16_value(g16)
    _sprinkle(g, rng, EDGE_G)
    w = bf16_value(w16)
    _sprinkle(w, rng, [0.0, -0.0, np.inf, -np.inf])
    z = g == 0
    m[z], v[z] = 0.0, 0.0
    return (bf16_bits_rne(w), bf16_bits_rne(g), m, v, 1, lr, b1, b2, eps, wd, seed, sr)


# =========================================================================================== ops
# fp32 outputs as AdamW's (1e-5, 1e-6); bf16 bit patterns (< 2^16) must match exactly, and 1e-5 * 65535 < 1
TOL = (1e-5, 1e-6)
define_op("adamw_mixed", reference=adamw_mixed_reference, make_inputs=make_inputs_mixed, chapter=12,
          title="AdamW with an fp32 master copy and bf16 weights", size_names=("n",), kind="memory", tol=TOL,
          edge_inputs=make_edge_inputs_mixed, output_names=("p_new", "m_new", "v_new", "w16_new"),
          sizes={"check": [(1,), (2,), (7,), (31,), (1000,), (4099,), (65537,)],
                 "check_sim": [(1,), (7,), (300,)], "bench": [(1 << 20,), (1 << 24,)],
                 "bench_gpu": [(1 << 24,), (100_000_000,)], "bench_sim": [(300,)]},
          flops=lambda s: 14 * s[0], bytes=lambda s, b: 28 * s[0])  # 4+2+4+4 read, 4+4+4+2 written
define_op("adamw_bf16", reference=adamw_bf16_reference, make_inputs=make_inputs_bf16, chapter=12,
          title="AdamW on bf16 weights without a master copy (RNE or stochastic rounding)", size_names=("n", "sr"),
          kind="memory", tol=TOL, edge_inputs=make_edge_inputs_bf16, output_names=("w16_new", "m_new", "v_new"),
          sizes={"check": [(1, 0), (1, 1), (7, 1), (31, 0), (1000, 1), (4099, 0), (65537, 1)],
                 "check_sim": [(1, 1), (7, 0), (300, 1)], "bench": [(1 << 24, 0), (1 << 24, 1)],
                 "bench_gpu": [(1 << 24, 0), (1 << 24, 1), (100_000_000, 0), (100_000_000, 1)],
                 "bench_sim": [(300, 1)]},
          flops=lambda s: 14 * s[0], bytes=lambda s, b: 22 * s[0])  # 2+2+4+4 read, 2+4+4 written


# ========================================================================================== CPU
def adamw_elem(p, g, m, v, decay, b1, omb1, b2, omb2, step_size, inv_sqrt_bc2, eps):
    """One parameter's AdamW update in float32 (compiled for the CPU and the GPU from this one function).
    No L2 term at all, unlike optim.adam_elem's ``g + l2 * p`` with l2 = 0, which turns an infinite weight
    into NaN (0 * inf)."""
    p = p * decay
    m = b1 * m + omb1 * g
    v = b2 * v + omb2 * g * g
    return p - step_size * m / (math.sqrt(v) * inv_sqrt_bc2 + eps), m, v


_adamw_elem_cpu = njit(cache=True, inline="always")(adamw_elem)
_adamw_elem_dev = cuda.jit(device=True, inline=True)(adamw_elem)


@njit(cache=True, inline="always")
def _bf16_to_f32_cpu(h):
    return float32_from_bits(np.uint32(h) << U16)  # a bit cast of the low 32 bits


@njit(cache=True, inline="always")
def _rne_cpu(x):
    if x != x:
        return H_NAN
    u = np.float32(x).view(np.uint32)
    return np.uint16((u + U0x7FFF + ((u >> U16) & U1)) >> U16)


@njit(cache=True, inline="always")
def _sr_cpu(x, r):
    if x != x:
        return H_NAN
    u = np.float32(x).view(np.uint32)
    return np.uint16((u + (r & UFFFF)) >> U16)


@njit(cache=True)
def _mixed_loop(p_new, m_new, v_new, w_new, p, g16, m, v, decay, b1, omb1, b2, omb2, ss, isb, eps):
    for i in range(p.size):
        pi, mi, vi = _adamw_elem_cpu(p[i], _bf16_to_f32_cpu(g16[i]), m[i], v[i], decay, b1, omb1, b2, omb2, ss,
                                     isb, eps)
        p_new[i], m_new[i], v_new[i] = pi, mi, vi
        w_new[i] = _rne_cpu(pi)


@register("adamw_mixed", "cpu", "loop", rung=1)
def adamw_mixed_loop(p_new, m_new, v_new, w_new, p, g16, m, v, step, lr, beta1, beta2, eps, wd):
    """One @njit loop: decode the bf16 gradient (bits << 16), the fp32 AdamW step on the master copy, then
    the new bf16 weight rounded to nearest even from the fp32 result's bits: 28 B/param."""
    decay, _, *rest = _adam_coeffs(step, lr, beta1, beta2, eps, wd)
    _mixed_loop(p_new, m_new, v_new, w_new, p, g16, m, v, decay, *rest)


@njit(cache=True)
def _bf16_loop(w_new, m_new, v_new, w16, g16, m, v, decay, b1, omb1, b2, omb2, ss, isb, eps, k0, k1, o0, o1, sr):
    n = w16.size
    for grp in range((n + 3) // 4):
        if sr:
            r = philox.philox10_cpu(np.uint32(grp & 0xFFFFFFFF), np.uint32(grp >> 32), o0, o1, k0, k1)
        else:
            r = (np.uint32(0), np.uint32(0), np.uint32(0), np.uint32(0))
        for j in range(min(4, n - 4 * grp)):
            i = 4 * grp + j
            pi, mi, vi = _adamw_elem_cpu(_bf16_to_f32_cpu(w16[i]), _bf16_to_f32_cpu(g16[i]), m[i], v[i], decay,
                                         b1, omb1, b2, omb2, ss, isb, eps)
            m_new[i], v_new[i] = mi, vi
            w_new[i] = _sr_cpu(pi, r[j]) if sr else _rne_cpu(pi)


@register("adamw_bf16", "cpu", "loop", rung=1)
def adamw_bf16_loop(w_new, m_new, v_new, w16, g16, m, v, step, lr, beta1, beta2, eps, wd, seed, sr):
    """One @njit loop over groups of 4 parameters: one Philox call gives the 4 random words of a group
    (sr = 1); the fp32 step from the bf16 weight, rounded back to bf16: 22 B/param."""
    decay, _, *rest = _adam_coeffs(step, lr, beta1, beta2, eps, wd)
    k0, k1 = philox.split64(seed)
    o0, o1 = philox.split64(step)
    _bf16_loop(w_new, m_new, v_new, w16, g16, m, v, decay, *rest, k0, k1, o0, o1, bool(sr))


# ========================================================================================== GPU
# The bit casts: libdevice's __nv_float_as_int / __nv_int_as_float on the GPU (no instruction: the register is
# reinterpreted); NumPy views in the simulator, which runs kernels as Python.
if device.SIMULATED:
    def _f32_bits(x):
        return np.float32(x).view(np.uint32)

    def _bits_f32(u):
        return np.uint32(u).view(np.float32)
else:
    from ..compiler import int32, uint32

    def _f32_bits_py(x):
        return uint32(cuda.libdevice.float_as_int(x))

    def _bits_f32_py(u):
        return cuda.libdevice.int_as_float(int32(u))

    _f32_bits = cuda.jit(device=True, inline=True)(_f32_bits_py)
    _bits_f32 = cuda.jit(device=True, inline=True)(_bits_f32_py)


@cuda.jit(device=True, inline=True)
def bf16_to_f32(h):
    return _bits_f32(np.uint32(h) << U16)


@cuda.jit(device=True, inline=True)
def rne_bf16(x):
    """float32 -> bf16 bits, round to nearest even (integer arithmetic on the bits); NaN -> 0x7FC0."""
    if x != x:
        return H_NAN
    u = _f32_bits(x)
    return np.uint16((u + U0x7FFF + ((u >> U16) & U1)) >> U16)


@cuda.jit(device=True, inline=True)
def sr_bf16(x, r):
    """float32 -> bf16 bits, stochastic rounding with the random word r (its low 16 bits); NaN -> 0x7FC0."""
    if x != x:
        return H_NAN
    u = _f32_bits(x)
    return np.uint16((u + (r & UFFFF)) >> U16)


@cuda.jit
def adamw_mixed_kernel(p_new, m_new, v_new, w_new, p, g16, m, v, decay, b1, omb1, b2, omb2, ss, isb, eps):
    # p, m, v (N,) fp32, g16 (N,) bf16 bits -> p_new, m_new, v_new (N,) fp32, w_new (N,) bf16 bits
    i = cuda.grid(1)
    if i < p.size:
        pi, mi, vi = _adamw_elem_dev(p[i], bf16_to_f32(g16[i]), m[i], v[i], decay, b1, omb1, b2, omb2, ss, isb,
                                     eps)
        p_new[i] = pi
        m_new[i] = mi
        v_new[i] = vi
        w_new[i] = rne_bf16(pi)


@cuda.jit
def adamw_bf16_kernel(w_new, m_new, v_new, w16, g16, m, v, decay, b1, omb1, b2, omb2, ss, isb, eps, k0, k1, o0,
                      o1, sr):
    # thread grp: parameters 4 grp .. 4 grp + 3, the 4 words of ONE Philox call (counter grp, offset = step)
    grp = cuda.grid(1)
    n = w16.size
    if 4 * grp < n:
        r0 = r1 = r2 = r3 = np.uint32(0)
        if sr:
            r0, r1, r2, r3 = philox.philox10_dev(np.uint32(grp), np.uint32(0), o0, o1, k0, k1)
        for j in range(4):
            i = 4 * grp + j
            if i < n:
                pi, mi, vi = _adamw_elem_dev(bf16_to_f32(w16[i]), bf16_to_f32(g16[i]), m[i], v[i], decay, b1,
                                             omb1, b2, omb2, ss, isb, eps)
                m_new[i] = mi
                v_new[i] = vi
                if sr:
                    r = r0 if j == 0 else (r1 if j == 1 else (r2 if j == 2 else r3))
                    w_new[i] = sr_bf16(pi, r)
                else:
                    w_new[i] = rne_bf16(pi)


F1, H1 = "float32[::1]", "uint16[::1]"
SIG_MIXED = f"void({F1}, {F1}, {F1}, {H1}, {F1}, {H1}, {F1}, {F1}, {', '.join(['float32'] * 8)})"
SIG_BF16 = (f"void({H1}, {F1}, {F1}, {H1}, {H1}, {F1}, {F1}, {', '.join(['float32'] * 8)}, "
            "uint32, uint32, uint32, uint32, boolean)")


@register("adamw_mixed", "gpu", "fused", rung=1, ptx=[(adamw_mixed_kernel, SIG_MIXED)])
def adamw_mixed_fused(p_new, m_new, v_new, w_new, p, g16, m, v, step, lr, beta1, beta2, eps, wd):
    """One thread per parameter: the fp32 AdamW step on the master copy and the rounded bf16 copy written
    in the same pass (no second kernel to cast p32 to bf16): 28 B/param, as fp32 AdamW. Predict ~90 % of
    copy bandwidth, like adamw/gpu/fused: the rounding is 4 integer instructions."""
    n = p.shape[0]
    if n == 0:
        return
    decay, _, *rest = _adam_coeffs(step, lr, beta1, beta2, eps, wd)
    adamw_mixed_kernel[ceil_div(n, THREADS), THREADS](p_new, m_new, v_new, w_new, p, g16, m, v, decay, *rest)


@register("adamw_bf16", "gpu", "fused4", rung=1, ptx=[(adamw_bf16_kernel, SIG_BF16)])
def adamw_bf16_fused4(w_new, m_new, v_new, w16, g16, m, v, step, lr, beta1, beta2, eps, wd, seed, sr):
    """One thread per 4 parameters, so one Philox-4x32-10 call (about 80 integer instructions) serves 4
    stochastic roundings: 22 B/param, no master copy. Predict ~90 % of copy with sr = 0 and somewhat less
    with sr = 1 if the integer work does not fully hide under the memory time (about 20 instructions per
    22 bytes)."""
    n = w16.shape[0]
    if n == 0:
        return
    decay, _, *rest = _adam_coeffs(step, lr, beta1, beta2, eps, wd)
    k0, k1 = philox.split64(seed)
    o0, o1 = philox.split64(step)
    adamw_bf16_kernel[ceil_div(n, 4 * THREADS), THREADS](w_new, m_new, v_new, w16, g16, m, v, decay, *rest, k0, k1,
                                                          o0, o1, bool(sr))



@cuda.jit
def adamw_bf16_vec_kernel(w_new4, m_new, v_new, w_new, w4, g4, w16, g16, m, v, decay, b1, omb1, b2, omb2, ss, isb,
                          eps, k0, k1, o0, o1, sr):
    # thread grp: parameters 4 grp .. 4 grp + 3 as in adamw_bf16_kernel (the same Philox call, counter grp), but
    # each array moved by ONE wide access per thread, consecutive threads on consecutive groups: w4, g4 (N//4,)
    # uint64 views of the bf16 bits (8 bytes = 4 weights), m, v by load4/store4 (16 bytes); the thread past the
    # last whole group takes the n % 4 tail element by element from the uint16 arrays.
    grp = cuda.grid(1)
    n = w16.size
    nb = w4.size  # whole groups
    if grp < nb:
        wq = w4[grp]  # every load is issued before any arithmetic or store
        gq = g4[grp]
        m0, m1, m2, m3 = load4(m, grp)
        v0, v1, v2, v3 = load4(v, grp)
        wlo, whi = np.uint32(wq & U64_LO), np.uint32(wq >> U64_32)
        glo, ghi = np.uint32(gq & U64_LO), np.uint32(gq >> U64_32)
        # bf16 j of a 32-bit word: its low half (shift up) or its high half (mask): the float32 with bits h << 16
        p0, m0, v0 = _adamw_elem_dev(_bits_f32((wlo & UFFFF) << U16), _bits_f32((glo & UFFFF) << U16), m0, v0,
                                     decay, b1, omb1, b2, omb2, ss, isb, eps)
        p1, m1, v1 = _adamw_elem_dev(_bits_f32(wlo & UHI16), _bits_f32(glo & UHI16), m1, v1, decay, b1, omb1, b2,
                                     omb2, ss, isb, eps)
        p2, m2, v2 = _adamw_elem_dev(_bits_f32((whi & UFFFF) << U16), _bits_f32((ghi & UFFFF) << U16), m2, v2,
                                     decay, b1, omb1, b2, omb2, ss, isb, eps)
        p3, m3, v3 = _adamw_elem_dev(_bits_f32(whi & UHI16), _bits_f32(ghi & UHI16), m3, v3, decay, b1, omb1, b2,
                                     omb2, ss, isb, eps)
        store4(m_new, grp, m0, m1, m2, m3)
        store4(v_new, grp, v0, v1, v2, v3)
        if sr:
            r0, r1, r2, r3 = philox.philox10_dev(np.uint32(grp), np.uint32(0), o0, o1, k0, k1)
            h0, h1, h2, h3 = sr_bf16(p0, r0), sr_bf16(p1, r1), sr_bf16(p2, r2), sr_bf16(p3, r3)
        else:
            h0, h1, h2, h3 = rne_bf16(p0), rne_bf16(p1), rne_bf16(p2), rne_bf16(p3)
        lo = np.uint32(h0) | (np.uint32(h1) << U16)
        hi = np.uint32(h2) | (np.uint32(h3) << U16)
        w_new4[grp] = np.uint64(lo) | (np.uint64(hi) << U64_32)
    elif 4 * grp < n:  # the tail: n % 4 parameters, words 0 .. n % 4 - 1 of Philox call grp
        r0 = r1 = r2 = np.uint32(0)
        if sr:
            r0, r1, r2, _ = philox.philox10_dev(np.uint32(grp), np.uint32(0), o0, o1, k0, k1)
        for j in range(n - 4 * grp):
            i = 4 * grp + j
            pi, mi, vi = _adamw_elem_dev(bf16_to_f32(w16[i]), bf16_to_f32(g16[i]), m[i], v[i], decay, b1, omb1,
                                         b2, omb2, ss, isb, eps)
            m_new[i] = mi
            v_new[i] = vi
            if sr:
                w_new[i] = sr_bf16(pi, r0 if j == 0 else (r1 if j == 1 else r2))
            else:
                w_new[i] = rne_bf16(pi)


Q1 = "uint64[::1]"
SIG_BF16_VEC = (f"void({Q1}, {F1}, {F1}, {H1}, {Q1}, {Q1}, {H1}, {H1}, {F1}, {F1}, {', '.join(['float32'] * 8)}, "
                "uint32, uint32, uint32, uint32, boolean)")


@register("adamw_bf16", "gpu", "vec", rung=2, ptx=[(adamw_bf16_vec_kernel, SIG_BF16_VEC)])
def adamw_bf16_vec(w_new, m_new, v_new, w16, g16, m, v, step, lr, beta1, beta2, eps, wd, seed, sr):
    """fused4's work (4 parameters a thread, one Philox call for their 4 words, the same roundings bit for
    bit), with the memory access fixed: thread i moves parameters 4i .. 4i+3 with one 8-byte load of the bf16
    weights and one of the gradients (uint64 views of the uint16 arrays), one 16-byte load4 each of m and v,
    and the same widths for the stores: 6 wide accesses per 4 parameters instead of 22 narrow ones, every warp
    instruction reading or writing 256 or 512 contiguous bytes, and all loads issued before any store.
    fused4 strided its threads 8 or 16 bytes apart and, because its loads could alias its stores, issued
    parameter j + 1's loads only after parameter j's stores: a quarter of the bytes in flight of a one-
    parameter-a-thread kernel. Predict >= 90 % of copy bandwidth (22 B/param) with sr = 0 and sr = 1, like
    adamw_mixed (98 %): the Philox rounds (~20 integer instructions a parameter) hide under the memory time."""
    n = w16.shape[0]
    if n == 0:
        return
    decay, _, *rest = _adam_coeffs(step, lr, beta1, beta2, eps, wd)
    k0, k1 = philox.split64(seed)
    o0, o1 = philox.split64(step)
    n4 = n - n % 4
    # uint64 views of the whole groups (8 bytes = 4 bf16 each); zero-length when n < 4 (only the tail runs)
    w_new4, w4, g4 = (a[:n4].view(np.uint64) for a in (w_new, w16, g16))
    adamw_bf16_vec_kernel[ceil_div(ceil_div(n, 4), THREADS), THREADS](w_new4, m_new, v_new, w_new, w4, g4, w16, g16,
                                                                       m, v, decay, *rest, k0, k1, o0, o1, bool(sr))

# ================================================================================ loss scaling
FP16_TINY = 2.0**-24  # the smallest positive float16 (subnormal); anything below half of it rounds to 0
FP16_MAX = 65504.0


def fp16_flush(g, scale=1.0):
    """What float16 keeps of the gradients ``g`` multiplied by ``scale``: (fraction that became 0 although
    g != 0, fraction that overflowed to inf). Rounding is float16's own (round to nearest even)."""
    g = np.asarray(g, dtype=np.float64)
    with np.errstate(over="ignore"):
        h = (g * scale).astype(np.float16)
    nz = g != 0
    return float(np.mean((h == 0) & nz)), float(np.mean(np.isinf(h) & np.isfinite(g)))


class LossScaler:
    """Static or dynamic loss scaling, with torch.amp.GradScaler's rule (Micikevicius et al. 2018):

      backward on loss * scale; grads / scale in fp32 ("unscale"); if any is inf or NaN, SKIP the step and
      (dynamic) multiply the scale by ``backoff`` (0.5); otherwise step, and after ``growth_interval``
      consecutive good steps multiply the scale by ``growth`` (2.0).

    A static scaler (``dynamic=False``) never changes its scale, but still skips steps with inf/NaN."""

    def __init__(self, scale=2.0**16, dynamic=True, growth=2.0, backoff=0.5, growth_interval=2000):
        self.scale = float(scale)
        self.dynamic = dynamic
        self.growth, self.backoff, self.growth_interval = growth, backoff, growth_interval
        self.good_steps = 0

    def scale_loss(self, loss):
        return loss * self.scale

    def unscale(self, grads):
        """fp32 gradients / scale (multiplied by the fp32 reciprocal, as torch does) and whether any is inf/NaN."""
        inv = np.float32(1.0 / self.scale)
        with np.errstate(over="ignore", invalid="ignore"):
            g = np.asarray(grads, dtype=np.float32) * inv
        return g, bool(not np.all(np.isfinite(g)))

    def update(self, found_inf):
        """After a step (or a skipped one): the scale for the next one. Returns True if the step was skipped."""
        if found_inf:
            self.good_steps = 0
            if self.dynamic:
                self.scale *= self.backoff
            return True
        self.good_steps += 1
        if self.dynamic and self.good_steps == self.growth_interval:
            self.scale *= self.growth
            self.good_steps = 0
        return False


def scale_trace(found_inf, **kw):
    """The scale used at each step and whether it was skipped, for a sequence of overflow flags."""
    s = LossScaler(**kw)
    scales, skipped = [], []
    for f in found_inf:
        scales.append(s.scale)
        skipped.append(s.update(bool(f)))
    return np.array(scales), np.array(skipped)


# ==================================================================== ops behind the exercises
def make_inputs_round(size, dtype, rng):
    """float32 values across 60 binades and both signs, a quarter of them exact ties (low 16 bits 0x8000,
    with even and odd kept parts) and some one fp32 ulp either side of a tie."""
    (n,) = size
    x = np.sign(rng.standard_normal(n)) * 2.0 ** rng.uniform(-30, 30, n)
    u = f32_bits(x).copy()
    k = rng.integers(0, 4, n)
    u[k == 0] = (u[k == 0] & np.uint32(0xFFFF0000)) | np.uint32(0x8000)  # exact tie
    u[k == 1] = (u[k == 1] & np.uint32(0xFFFF0000)) | np.uint32(0x8001)  # just above a tie
    u[k == 2] = (u[k == 2] & np.uint32(0xFFFF0000)) | np.uint32(0x7FFF)  # just below
    return (u.view(np.float32),)


def make_edge_inputs_round(size, dtype, rng):
    """0, -0, +-inf, NaN (also with payload bits), the largest float32 (rounds up to inf), the largest bf16,
    float32 subnormals (bf16 has the same exponent range, so they round on the same 2^-133 grid) and a tie just
    below 2^-126."""
    (x,) = make_inputs_round(size, dtype, rng)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.4028235e38, -3.3895314e38, 1e-40, -3e-39,
                        np.uint32(0x00808000).view(np.float32)], dtype=np.float32)
    # NaNs whose low bits are set: adding 0x7FFF to their bits carries into the sign (0x7FFFFFFF -> -0.0) or
    # past 32 bits (0xFFFFFFFF -> +0.0), so only an explicit NaN test keeps them NaN
    special = np.concatenate([special, np.array([0x7FFFFFFF, 0xFFFFFFFF], dtype=np.uint32).view(np.float32)])
    _sprinkle(x, rng, special)
    return (x,)


def bf16_round_reference(x):
    """float64 oracle: x rounded to the nearest bf16, ties to even, computed with frexp and round-half-even."""
    return bf16_round_arith(x)


exercise_op("bf16_round_nearest", reference=bf16_round_reference, make_inputs=make_inputs_round, chapter=12,
            title="round float32 to bfloat16, nearest even, by integer arithmetic", size_names=("n",), kind="memory",
            tol=(0.0, 0.0), output_names=("out",), edge_inputs=make_edge_inputs_round,
            sizes={"check": [(1,), (7,), (1000,)], "check_sim": [(1,), (7,)], "bench": [(1 << 20,)]},
            flops=lambda s: 4 * s[0], bytes=lambda s, b: 8 * s[0])

SR_DRAWS = 4096  # stochastic roundings per value in the mean exercise
SR_Z = 6.0  # the check allows SR_Z standard deviations of the mean


def sr_mean_tol(size, dtype):
    """(rtol, 0): one SR of x is lo or lo + ulp, so it has a standard deviation of at most ulp / 2, and the mean
    of K draws at most ulp / (2 sqrt K). A bf16 ulp is at most 2^-7 |x|, so SR_Z = 6 standard deviations is at
    most 6 * 2^-8 |x| / sqrt(K) = 3.7e-4 |x| (a correct answer fails with probability ~2e-9 per value). A
    rounding that is not stochastic is off by at least 0.25 ulp >= 9.8e-4 |x| on these inputs."""
    return SR_Z * 2.0**-8 / math.sqrt(SR_DRAWS), 0.0


def make_inputs_sr_mean(size, dtype, rng):
    """x: float32 values a quarter to three quarters of the way between two bf16 numbers (no bf16 value
    itself, where every rounding is exact), across 40 binades; r (n, K) uint32: independent random words."""
    (n,) = size
    e = rng.integers(-20, 20, n)
    k = rng.integers(128, 256, n)  # the kept 8 significant bits, 1.0000000 .. 1.1111111
    frac = rng.uniform(0.25, 0.75, n)
    x = np.sign(rng.standard_normal(n)) * (k + frac) * 2.0 ** (e - 7.0)
    r = rng.integers(0, 2**32, size=(n, SR_DRAWS), dtype=np.uint32)
    return x.astype(np.float32), r


def sr_mean_reference(x, r):
    """float64 oracle: stochastic rounding is unbiased, so the mean of many roundings of x is x."""
    return np.asarray(x, dtype=np.float64)


exercise_op("bf16_sr_mean", reference=sr_mean_reference, make_inputs=make_inputs_sr_mean, chapter=12,
            title="mean of K stochastic roundings to bfloat16", size_names=("n",), kind="memory", tol=sr_mean_tol,
            output_names=("mean",),
            sizes={"check": [(1,), (7,), (61,)], "check_sim": [(1,), (7,)], "bench": [(64,)]},
            flops=lambda s: 3 * s[0] * SR_DRAWS, bytes=lambda s, b: 4 * s[0] * SR_DRAWS)

PART_THREADS = 64  # threads per block of the partials exercise
PART_BLOCKS = 4  # at most this many blocks: a larger gradient is covered by a grid-stride loop


def partial_blocks(n):
    return max(1, min(PART_BLOCKS, ceil_div(n, PART_THREADS)))


def block_partials_reference(g):
    """float64 oracle: with B = partial_blocks(n) blocks of PART_THREADS threads striding over g by
    B * PART_THREADS, element i belongs to block (i // PART_THREADS) % B; partials[b] = sum of its g^2."""
    g = np.asarray(g, dtype=np.float64)
    nb = partial_blocks(g.size)
    owner = (np.arange(g.size) // PART_THREADS) % nb
    return np.bincount(owner, weights=g * g, minlength=nb) if g.size else np.zeros(nb)


def make_inputs_partials(size, dtype, rng):
    (n,) = size
    return (rng.standard_normal(n).astype(dtype),)


def make_edge_inputs_partials(size, dtype, rng):
    """An inf in one block and a NaN in another (those partials are inf and NaN), zeros, -0, 1e-30 (whose
    square underflows to 0 in float32, as it is ~0 in float64)."""
    (g,) = make_inputs_partials(size, dtype, rng)
    n = g.size
    g[0] = np.inf
    if n > PART_THREADS:
        g[PART_THREADS] = np.nan
    _sprinkle(g[1:PART_THREADS], rng, [0.0, -0.0, 1e-30])
    return (g,)


exercise_op("clip_block_partials", reference=block_partials_reference, make_inputs=make_inputs_partials,
            chapter=12, title="per-block partial sums of g^2 (deterministic norm, pass 1)", size_names=("n",),
            kind="memory", tol=(1e-5, 1e-6),  # a float32 tree over at most a few hundred positive terms
            output_names=("partials",), edge_inputs=make_edge_inputs_partials,
            sizes={"check": [(1,), (7,), (129,), (600,)], "check_sim": [(1,), (7,), (129,), (600,)],
                   "bench": [(1 << 20,)]},
            flops=lambda s: 2 * s[0], bytes=lambda s, b: 4 * s[0])
