"""The course's vectorizable float32 exp (kernels_src/ops/cpumath.py): its stated error bound, its special
values, and that a loop over it really compiles to SIMD instructions with no libm call."""
import platform

import numpy as np
import pytest

from kernels_src.ops import cpumath

TINY = np.finfo(np.float32).tiny
BIG = np.finfo(np.float32).max


def _exp(x):
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.full_like(x, np.nan)  # poisoned: an element the loop skipped cannot pass
    cpumath.exp_array(out, x)
    return out


def test_error_bound_over_the_whole_range():
    x = np.linspace(-104, 89, 2_000_003, dtype=np.float32)
    got = _exp(x).astype(np.float64)
    ref = np.exp(x.astype(np.float64))
    normal = (ref >= TINY) & (ref <= BIG)
    rel = np.abs(got[normal] - ref[normal]) / ref[normal]
    assert rel.max() <= cpumath.EXP_MAX_REL_ERR, f"max relative error {rel.max():.3g} at x={x[normal][rel.argmax()]}"
    # subnormal results and underflow to 0: absolute error below the smallest normal float
    assert np.all(np.abs(got[ref < TINY] - ref[ref < TINY]) < TINY)
    assert np.all(np.isinf(got[ref > BIG]))


def test_random_points_and_a_mutant_fails():
    rng = np.random.default_rng(7)
    x = rng.uniform(-80, 80, 100_000).astype(np.float32)
    ref = np.exp(x.astype(np.float64))
    rel = np.abs(_exp(x) - ref) / ref
    assert rel.max() <= cpumath.EXP_MAX_REL_ERR
    # the same check rejects a plausible mistake: a polynomial one term short (degree 5)
    r = x - np.round(x / np.log(2)) * np.log(2)
    short = np.exp(x - r) * (1 + r + r**2 / 2 + r**3 / 6 + r**4 / 24 + r**5 / 120)
    assert (np.abs(short - ref) / ref).max() > cpumath.EXP_MAX_REL_ERR


def test_special_values():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 200.0, -200.0, 88.72, 88.73], np.float32)
    got = _exp(x)
    assert np.isnan(got[0])
    assert got[1] == np.inf and got[2] == 0.0
    assert got[3] == 1.0 and got[4] == 1.0
    assert got[5] == np.inf and got[6] == 0.0
    assert np.isfinite(got[7]) and got[8] == np.inf


def test_sigmoid_and_tanh_limits():
    from kernels_src.compiler import njit

    @njit
    def both(s, t, x):
        for i in range(x.size):
            s[i] = cpumath.sigmoid_f32(x[i])
            t[i] = cpumath.tanh_f32(x[i])

    x = np.array([-np.inf, -100, -3, 0, 0.5, 3, 100, np.inf, np.nan], np.float32)
    s, t = np.full_like(x, -7), np.full_like(x, -7)
    both(s, t, x)
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore"):
        np.testing.assert_allclose(s[:-1], 1 / (1 + np.exp(-x64[:-1])), rtol=1e-6, atol=TINY)  # sigmoid(-100) underflows
    np.testing.assert_allclose(t[:-1], np.tanh(x64[:-1]), rtol=0, atol=3e-7)
    assert np.isnan(s[-1]) and np.isnan(t[-1])


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="counts x86-64 SIMD instructions")
def test_the_loop_vectorizes_without_libm_calls():
    from kernels_src.tools.asm import classify

    # a twin compiled here: code loaded from Numba's on-disk cache cannot be inspected
    fn = cpumath.njit(error_model="numpy")(cpumath.exp_array.py_func)
    fn(np.empty(8, np.float32), np.ones(8, np.float32))
    sig = fn.signatures[0]
    asm, ir = fn.inspect_asm(sig), fn.inspect_llvm(sig)
    counts = classify(asm, ir)
    assert counts["widest_fp_bits"] >= 256, counts  # AVX2 or wider (CI's x86-64 machines have AVX2)
    assert counts["packed_fp_total"] >= 10, counts
    assert not any("exp" in c for c in counts["calls"]), counts["calls"]


def test_erfc_as_absolute_bound_and_special_values():
    """The A&S 7.1.26 erfc that GELU's shared-exp rungs use: absolute error within its stated bound over the range
    where erfc is not yet 0 or 2 in float32, both signs; a fit one coefficient off is rejected by the same bound."""
    import math

    x = np.linspace(-12, 12, 400_001, dtype=np.float32)
    out = np.full_like(x, np.nan)  # poisoned
    cpumath.erfc_as_array(out, x)
    ref = np.array([math.erfc(v) for v in x.astype(np.float64)])
    err = np.abs(out.astype(np.float64) - ref)
    assert err.max() <= cpumath.ERFC_AS_MAX_ABS_ERR, f"max abs error {err.max():.3g} at x={x[err.argmax()]}"
    z = np.abs(x.astype(np.float64))
    t = 1 / (1 + 0.3275911 * z)
    wrong = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429 * 1.001)))) \
        * np.exp(-z * z)
    wrong = np.where(x >= 0, wrong, 2 - wrong)
    assert np.abs(wrong - ref).max() > cpumath.ERFC_AS_MAX_ABS_ERR
    sp = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 30.0, -30.0], np.float32)
    got = np.full_like(sp, -7)
    cpumath.erfc_as_array(got, sp)
    assert np.isnan(got[0]) and got[1] == 0.0 and got[2] == 2.0
    assert abs(got[3] - 1.0) <= 3e-7 and abs(got[4] - 1.0) <= 3e-7 and got[5] == 0.0 and got[6] == 2.0


def test_exp2_nonpos_bound_and_special_values():
    """2^w for w <= 0 (the exact GELU's rung 5): relative error within EXP2_MAX_REL_ERR on [-100, 0], 0 below the
    floor and at -inf, NaN kept; a degree-4 polynomial (one term short) breaks the same bound."""
    w = np.linspace(-100, 0, 2_000_001, dtype=np.float32)
    out = np.full_like(w, np.nan)  # poisoned
    cpumath.exp2_nonpos_array(out, w)
    ref = np.exp2(w.astype(np.float64))
    rel = np.abs(out - ref) / ref
    assert rel.max() <= cpumath.EXP2_MAX_REL_ERR, f"max relative error {rel.max():.3g} at w={w[rel.argmax()]}"
    f = w.astype(np.float64) - np.rint(w)
    short = np.exp2(np.rint(w)) * (1 + f * np.log(2) * (1 + f * np.log(2) / 2 * (1 + f * np.log(2) / 3 * (
        1 + f * np.log(2) / 4))))
    assert (np.abs(short - ref) / ref).max() > cpumath.EXP2_MAX_REL_ERR
    sp = np.array([np.nan, -np.inf, -100.5, -1e30, 0.0, -0.0], np.float32)
    got = np.full_like(sp, 7.0)
    cpumath.exp2_nonpos_array(got, sp)
    assert np.isnan(got[0]) and got[1] == 0.0 and got[2] == 0.0 and got[3] == 0.0
    assert abs(got[4] - 1) <= 3e-7 and abs(got[5] - 1) <= 3e-7


def _gelu64(x):
    import math

    erfc = np.vectorize(math.erfc)
    return 0.5 * x * erfc(-x / math.sqrt(2.0)), 0.5 * erfc(-x / math.sqrt(2.0)) + x * np.exp(-0.5 * x * x) / math.sqrt(
        2.0 * math.pi)


def test_gelu_f32_and_its_derivative_within_the_stated_bound():
    """cpumath.gelu_f32 / gelu_grad_f32 (the exact GELU's rung 5): |error| <= GELU_MAX_ABS_ERR * max(1, |value|)
    over [-14, 14] (past -11.8 the 2^w is 0 and the result exactly 0), special values as the reference says."""
    x = np.linspace(-14, 14, 1_400_001, dtype=np.float32)
    y, d = np.full_like(x, np.nan), np.full_like(x, np.nan)  # poisoned
    cpumath.gelu_array(y, x)
    cpumath.gelu_grad_array(d, x)
    ry, rd = _gelu64(x.astype(np.float64))
    for got, ref in ((y, ry), (d, rd)):
        err = np.abs(got - ref) / np.maximum(1.0, np.abs(ref))
        assert err.max() <= cpumath.GELU_MAX_ABS_ERR, f"max error {err.max():.3g} at x={x[err.argmax()]}"
    sp = np.array([np.nan, np.inf, -np.inf, 0.0, 1e-30, -1e4, 1e4, -12.5], np.float32)
    got = np.full_like(sp, 7.0)
    cpumath.gelu_array(got, sp)
    assert np.isnan(got[0]) and got[1] == np.inf and np.isnan(got[2])  # -inf * Phi(-inf) = -inf * 0: NaN
    assert got[3] == 0.0 and abs(got[4] - 5e-31) <= 1e-36 and got[5] == 0.0 and got[6] == 1e4 and got[7] == 0.0


def test_gelu_f32_bound_rejects_a_wrong_constant():
    """The bound can fail: the same formula with the density's 1/sqrt(2 pi) left out of the exponent (K = 0) is
    far outside it."""
    import math

    x = np.linspace(-6, 6, 100_001)
    a = np.abs(x)
    t = 1 / (1 + 0.3275911 / math.sqrt(2) * a)
    b = np.array([0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429]) * math.sqrt(2 * math.pi) / 2
    tp = t * (b[0] + t * (b[1] + t * (b[2] + t * (b[3] + t * b[4]))))
    wrong = 0.5 * x + a * (0.5 - tp * np.exp(-0.5 * x * x))  # phi without its 1/sqrt(2 pi)
    ref, _ = _gelu64(x)
    assert (np.abs(wrong - ref) / np.maximum(1.0, np.abs(ref))).max() > cpumath.GELU_MAX_ABS_ERR


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="counts x86-64 SIMD instructions")
def test_exp2_rungs_compile_to_fewer_packed_instructions_than_the_rung_before():
    from kernels_src.tools.asm import variant_asm

    for op, before in (("gelu", "simd_as"), ("gelu_bwd", "simd_as"), ("silu", "simd_nonpos"),
                       ("gelu_tanh_bwd", "simd"), ("bias_gelu", "simd")):
        old = variant_asm(op, before)["total"]
        new = variant_asm(op, "simd_exp2")["total"]
        assert not new["calls"], new["calls"]
        assert 0 < new["packed_fp_total"] < old["packed_fp_total"], (op, old, new)


def test_sigmoid_pair_relative_accuracy_in_both_tails():
    """cpumath.sigmoid_pair_f32: sigmoid and 1 - sigmoid each within 2 EXP2_MAX_REL_ERR + 2 ulp + |z| 6e-8 relative
    wherever the value is above 1e-30 (u = 0 past |z| = 69.3: then exactly 1 and 0); NaN in, NaN out."""
    from kernels_src.compiler import njit

    @njit(error_model="numpy")
    def pairs(s, c, z):
        for i in range(z.size):
            s[i], c[i] = cpumath.sigmoid_pair_f32(z[i])

    z = np.concatenate([np.linspace(-80, 80, 400_001, dtype=np.float32), np.float32([np.nan, np.inf, -np.inf])])
    s, c = np.full_like(z, 7.0), np.full_like(z, 7.0)  # poisoned
    pairs(s, c, z)
    zd = z[:-3].astype(np.float64)
    rs, rc = 1 / (1 + np.exp(-zd)), 1 / (1 + np.exp(zd))
    for got, ref in ((s[:-3], rs), (c[:-3], rc)):
        ok = ref >= 1e-30  # 2^w is 0 below w = -100 (2^-100 = 7.9e-31): |z| > 69.3
        rel = np.abs(got[ok] - ref[ok]) / ref[ok]
        bound = 2 * cpumath.EXP2_MAX_REL_ERR + 2.4e-7 + 6e-8 * np.abs(zd[ok])  # + the rounding of z log2 e
        assert np.all(rel <= bound), (rel / bound).max()
        assert np.all(np.abs(got[~ok] - ref[~ok]) <= 1e-30)
    assert np.isnan(s[-3]) and np.isnan(c[-3])
    assert (s[-2], c[-2], s[-1], c[-1]) == (1.0, 0.0, 0.0, 1.0)
