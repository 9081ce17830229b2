"""Chapter 11: quantization. GGML Q8_0 / Q4_0 bit-compatibility on hand-worked blocks (the sign of the Q4_0
scale, the +8.5 truncation, roundf's ties, d = 0), the packed byte layout, the int8 schemes, every
quantizer (CPU and GPU) bit-exact against the reference, and the Delta^2/12 error model (quant_error)."""
import numpy as np
import pytest

import kernels_src
from kernels_src import parity
from kernels_src.ops import quant as q


def _block(vals):
    x = np.zeros(32, np.float32)
    x[: len(vals)] = vals
    return x.reshape(1, 32)


def _d(block_bytes):
    return float(block_bytes[0:2].copy().view(np.float16)[0])


def test_q8_0_hand_worked_block():
    # amax 127 -> d = 1 exactly; x*1 rounded half away from zero: 63.5 -> 64, -0.5 -> -1, 2.5 -> 3
    x = _block([127.0, 63.5, -0.5, 2.5, -2.5, 0.49, -127.0])
    b = q.q8_0_quantize_ref(x)[0]
    assert b.shape == (34,)
    assert _d(b) == 1.0 and b[0:2].tobytes() == b"\x00\x3c"  # fp16 1.0 = 0x3C00, little-endian
    qs = b[2:].view(np.int8)
    np.testing.assert_array_equal(qs[:7], [127, 64, -1, 3, -3, 0, -127])
    np.testing.assert_array_equal(qs[7:], 0)


def test_q8_0_scale_is_rounded_to_fp16_after_computing_1_over_d():
    x = _block([1.0, 0.3])
    b = q.q8_0_quantize_ref(x)[0]
    d32 = np.float32(1.0) / np.float32(127)
    assert _d(b) == float(np.float16(d32))
    assert b[3].view(np.int8) == int(np.floor(float(np.float32(0.3) * (np.float32(1) / d32)) + 0.5))


def test_q4_0_hand_worked_block_sign_and_truncation():
    # signed max is -8 (larger magnitude than +4): d = -8/-8 = +1; q = min(15, trunc(x/1 + 8.5))
    x = np.zeros(32, np.float32)
    x[0], x[1], x[2], x[3], x[16], x[17] = -8.0, 4.0, 7.6, -0.6, 0.5, 7.9
    b = q.q4_0_quantize_ref(x.reshape(1, 32))[0]
    assert b.shape == (18,)
    assert _d(b) == 1.0
    lo, hi = b[2:] & 15, b[2:] >> 4
    # -8+8.5=0.5->0; 4+8.5=12.5->12; 7.6+8.5=16.1->16->15 (clamped); -0.6+8.5=7.9->7; 0->8
    np.testing.assert_array_equal(lo[:5], [0, 12, 15, 7, 8])
    np.testing.assert_array_equal(hi[:3], [9, 15, 8])  # x16=0.5 -> 9; x17=7.9 -> 16.4 -> 15
    # a positive max gives a negative scale: the largest value maps to q = 0
    b2 = q.q4_0_quantize_ref((-x).reshape(1, 32))[0]
    assert _d(b2) == -1.0 and (b2[2] & 15) == 0


def test_q4_0_tie_first_wins():
    b = q.q4_0_quantize_ref(_block([-3.0, 3.0]))[0]
    assert _d(b) == pytest.approx(3 / 8)  # max = -3 (the first), d = -3/-8 > 0
    b = q.q4_0_quantize_ref(_block([3.0, -3.0]))[0]
    assert _d(b) == pytest.approx(-3 / 8)


def test_q4_0_float32_steps_matter():
    """GGML adds 8.5f in float32: a product just below an integer - 8.5 rounds up to it in float32 and
    the truncation then keeps the larger value. The reference reproduces that, float64 would not."""
    d = np.float32(-8.0 / -8)
    x = np.float32(np.nextafter(np.float32(-0.5), np.float32(0)) - np.float32(3e-8))
    xs = _block([-8.0, x])
    b = q.q4_0_quantize_ref(xs)[0]
    v32 = np.float32(np.float32(x) * (np.float32(1) / d)) + np.float32(8.5)
    assert (b[3] & 15) == min(15, int(v32))


def test_zero_block_scales():
    z = np.zeros((1, 32), np.float32)
    b8, b4 = q.q8_0_quantize_ref(z)[0], q.q4_0_quantize_ref(z)[0]
    assert _d(b8) == 0.0 and not b8[2:].any()
    assert _d(b4) == 0.0 and (b4[2:] == 0x88).all()  # q = 8 in both nibbles
    np.testing.assert_array_equal(q.q4_0_dequantize_ref(b4[None]), 0.0)


def test_q4_0_nibble_layout():
    qs = np.arange(16, dtype=np.uint8) | (np.arange(16, dtype=np.uint8)[::-1] << 4)
    blk = np.r_[np.frombuffer(np.float16(0.5).tobytes(), np.uint8), qs][None]
    v = q.q4_0_dequantize_ref(blk)[0]
    np.testing.assert_array_equal(v[:16], (np.arange(16) - 8) * 0.5)  # low nibbles: elements 0..15
    np.testing.assert_array_equal(v[16:], (np.arange(16)[::-1] - 8) * 0.5)  # high nibbles: 16..31


def test_round_trip_errors_bounded():
    x = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
    # Q4_0: 16 levels for a signed range: the side opposite the max clamps at q = 15 (7 steps), so the
    # error there reaches a whole step; Q8_0's is half a step
    for fmt, steps, half in (("q8_0", 127, 0.5), ("q4_0", 8, 1.0)):
        xb = q.DEQUANT[fmt](q.QUANT[fmt](x)).reshape(4, 8, 32)
        amax = np.abs(x.reshape(4, 8, 32)).max(-1, keepdims=True)
        # half a step, plus the fp16 rounding of d (relative 2^-11) times the largest |q|
        assert (np.abs(xb - x.reshape(4, 8, 32)) <= amax / steps * (half + 1e-3 * (steps + 1))).all()


@pytest.mark.parametrize("op", ["q8_0_quantize", "q4_0_quantize"])
def test_quantizers_bit_exact_on_edge_blocks(op):
    o = kernels_src.get_op(op)
    for v in o.variants:
        ok, why = v.available()
        if not ok:
            continue
        for size in [(3, 64), (2, 256)]:
            inputs = q.make_quant_edge_inputs(size, np.dtype("float32"), np.random.default_rng(size[1]))
            ref = parity.reference_outputs(o, inputs)
            out = parity.run_variant(v, inputs, parity.empty_outputs(ref, "float32"))
            np.testing.assert_array_equal(out[0], ref[0], err_msg=v.key)


def _many_values(rng, shape):
    """Values with few significant bits at many scales, so that x * (1/d) often lands exactly on .5 (roundf's
    ties) and on integers, plus blocks whose scale is subnormal (1/d overflows) or near float32's maximum."""
    X = (rng.integers(-2**20, 2**20, shape) / 2.0 ** rng.integers(0, 14, shape)).astype(np.float32)
    X[:, :32] = np.r_[[-3.0, 3.0], np.arange(30) - 12.5]
    X[1, :32] = 0.0
    X[2, 32:64] = 1e-38
    X[3, 64:96] = -3e38
    return X


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_fused_cpu_rungs_bit_exact_on_many_values(fmt):
    """Rung 3 (fused: in-kernel fp16 scales, integer amax, float32 roundf) against the float32 reference on
    ~half a million values, and its dequantize against the reference on random bytes (every int8/nibble)."""
    rng = np.random.default_rng(36)
    X = _many_values(rng, (128, 4096))
    ref = q.QUANT[fmt](X)
    out = np.full_like(ref, 0xA5)
    getattr(q, f"{fmt}_quantize_fused")(out, X)
    np.testing.assert_array_equal(out, ref)
    b = rng.integers(0, 256, ref.shape, dtype=np.uint8)
    d = rng.choice([0.0, -0.0, 6e-8, -3e-5, 1e-3, -0.25, 7.0, 6.5e4], size=(ref.shape[0], ref.shape[1] // q.FORMATS[fmt]))
    b.reshape(ref.shape[0], -1, q.FORMATS[fmt])[..., 0:2] = d.astype(np.float16)[..., None].view(np.uint8)
    y = np.full(X.shape, np.nan, np.float32)
    getattr(q, f"{fmt}_dequantize_fused")(y, b)
    np.testing.assert_array_equal(y, q.DEQUANT[fmt](b).astype(np.float32))


def test_fp16_bit_helpers_exact():
    """The fused rungs' fp16 conversions: every one of the 65,536 fp16 patterns decodes as NumPy's astype does
    (signed zeros, subnormals, inf, NaN), and float32 -> fp16 rounds as NumPy does on random bit patterns, on
    values around fp16's range and on the halfway cases."""
    from kernels_src.compiler import njit

    @njit
    def enc(out, x):
        for i in range(x.size):
            out[i] = q._f16_bits(x[i])

    @njit
    def dec(out, b):
        for i in range(out.size):
            out[i] = q._f16_value(b[2 * i], b[2 * i + 1])

    halfs = np.arange(65536, dtype=np.uint16)
    got = np.empty(65536, np.float32)
    dec(got, halfs.view(np.uint8))
    want = halfs.view(np.float16).astype(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32)[~np.isnan(want)], want.view(np.uint32)[~np.isnan(want)])
    assert np.isnan(got[np.isnan(want)]).all()
    rng = np.random.default_rng(11)
    with np.errstate(invalid="ignore"):  # inf + NaN neighbours: dropped below
        mids = (halfs[:-1].view(np.float16).astype(np.float64) + halfs[1:].view(np.float16).astype(np.float64)) / 2
    x = np.concatenate([rng.integers(0, 2**32, 400_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
                        (rng.standard_normal(200_000) * 10.0 ** rng.integers(-9, 6, 200_000)).astype(np.float32),
                        mids[np.isfinite(mids)].astype(np.float32),
                        np.array([0.0, -0.0, np.inf, -np.inf, 65504, 65519.996, 65520, 2.98e-8, 2.99e-8], np.float32)])
    h = np.empty(x.size, np.int32)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16).astype(np.int32)
    fin = ~np.isnan(x)
    enc(h, x)
    np.testing.assert_array_equal(h[fin], want[fin])
    assert (((h[~fin] >> 10) & 31) == 31).all() and (h[~fin] & 0x3FF).all()  # NaN stays NaN


def test_int8_schemes_and_outliers():
    rng = np.random.default_rng(1)
    w = q.outlier_weights((64, 256), rng, outlier_frac=0.002, outlier_scale=50.0)
    e_tensor = q.errors(w, q.int8_symmetric(w)[0])
    e_row = q.errors(w, q.int8_symmetric(w, axis=1)[0])
    e_block = q.errors(w, q.int8_symmetric(w, block=32)[0])
    assert e_block["mse"] < e_row["mse"] < e_tensor["mse"]
    w_hat, qq, scale, zp = q.int8_asymmetric(w, axis=1)
    assert qq.min() >= -128 and qq.max() <= 127
    assert np.abs(w_hat - w).max() <= scale.max() / 2 + 1e-12
    z = np.zeros((2, 32))
    np.testing.assert_array_equal(q.int8_asymmetric(z, axis=1)[0], 0.0)


def test_qgemv_bytes_per_weight():
    s = (8192, 8192)
    o8, o4 = kernels_src.get_op("qgemv_q8_0"), kernels_src.get_op("qgemv_q4_0")
    assert o8.bytes(s, 4) / (s[0] * s[1]) == pytest.approx(34 / 32, rel=3e-3)
    assert o4.bytes(s, 4) / (s[0] * s[1]) == pytest.approx(18 / 32, rel=3e-3)


def test_committed_h100_json_has_the_ladder():
    from pathlib import Path

    for fmt in ("q8_0", "q4_0"):
        d = kernels_src.bench.load_json(Path(__file__).parents[1] / f"book/data/bench/h100/qgemv_{fmt}_gpu.json")
        names = {r["variant"] for r in d["rows"] if r.get("size") == [8192, 8192] and "median_s" in r}
        assert {"torch", "fp32_gemv", "rows", "q8act"} <= names


# ---------------------------------------------------------------------------- the error model (quant_error)
from kernels_src.ops import quant_error as qe  # noqa: E402


def test_gaussian_amax_moments_against_closed_forms_and_sampling():
    # n = 1: amax = |x|, so E = sqrt(2/pi) and E[x^2] = 1 exactly
    m1, m2 = qe.gaussian_amax_moments(n=1)
    assert m1 == pytest.approx(np.sqrt(2 / np.pi), rel=1e-6) and m2 == pytest.approx(1.0, rel=1e-6)
    # n = 32 against 200 000 sampled blocks: within 5 standard errors
    a = np.abs(np.random.default_rng(3).standard_normal((200_000, 32))).max(1)
    m1, m2 = qe.gaussian_amax_moments(n=32)
    assert abs(m1 - a.mean()) < 5 * a.std() / np.sqrt(a.size)
    assert abs(m2 - (a * a).mean()) < 5 * (a * a).std() / np.sqrt(a.size)


def test_uniform_model_on_gaussian_weights():
    """Q8_0's only departure from Delta^2/12 on Gaussian weights is the block's largest weight, which comes
    back exact: the measured MSE is 31/32 of the prediction. Q4_0's clamped side adds a little back."""
    W = (np.random.default_rng(4).standard_normal((256, 4096)) * 0.02).astype(np.float32)
    r8 = qe.measured_rms(W, "q8_0") / qe.predicted_rms(W, "q8_0")
    r4 = qe.measured_rms(W, "q4_0") / qe.predicted_rms(W, "q4_0")
    # 1M weights: the sampling scatter of the ratio is ~0.45/sqrt(1M) = 0.05 %
    assert r8 == pytest.approx(np.sqrt(31 / 32), abs=3e-3)
    assert 0.98 < r4 < 1.01
    # the closed-form Gaussian prediction agrees with the blocks' own steps (sampling: ~0.3 % here)
    for fmt in ("q8_0", "q4_0"):
        assert qe.gaussian_predicted_rms(fmt, 0.02) == pytest.approx(qe.predicted_rms(W, fmt), rel=0.01)
    # Q4_0's step is 127/8 times Q8_0's, whatever the weights
    assert qe.predicted_rms(W, "q4_0") / qe.predicted_rms(W, "q8_0") == pytest.approx(127 / 8, rel=1e-12)


def test_error_on_the_grid_is_zero_and_zero_blocks_predict_zero():
    x = _block(np.r_[127.0, np.arange(-15, 16)])  # Q8_0: d = 127/127 = 1, every value on the grid
    assert qe.measured_rms(x, "q8_0") == 0.0
    z = np.zeros((3, 64), np.float32)
    for fmt in ("q8_0", "q4_0"):
        assert qe.predicted_rms(z, fmt) == 0.0 and qe.measured_rms(z, fmt) == 0.0


def test_stored_fp16_steps_within_2_to_the_minus_11():
    W = (np.random.default_rng(5).standard_normal((8, 512)) * 0.02).astype(np.float32)
    for fmt in ("q8_0", "q4_0"):
        assert 0 < qe.fp16_scale_error(W, fmt) <= 2.0 ** -11


def test_q4_0_clamped_hand_worked():
    # max = -8 sets d = +1; 7.6 + 8.5 = 16.1 clamps, 7.4 + 8.5 = 15.9 does not, -8 itself maps to 0
    assert qe.q4_0_clamped(_block([-8.0, 7.6, 7.4])) == 1 / 32
    assert qe.q4_0_clamped(np.zeros((1, 32), np.float32)) == 0.0


def test_an_outlier_inflates_only_its_own_block():
    rng = np.random.default_rng(6)
    w = (rng.standard_normal((1, 256)) * 0.02).astype(np.float32)
    wo = w.copy()
    wo[0, 3 * 32 + 5] = 2.0  # 100 sigma, in block 3
    for fmt in ("q8_0", "q4_0"):
        s, so = qe.block_steps(w, fmt), qe.block_steps(wo, fmt)
        p, m = qe.block_rms(w, fmt)
        po, mo = qe.block_rms(wo, fmt)
        others = np.arange(8) != 3
        np.testing.assert_array_equal(so[0, others], s[0, others])
        np.testing.assert_array_equal(mo[0, others], m[0, others])
        assert so[0, 3] > 10 * s[0, 3]
    # Q4_0: Delta = 2/8 is ~12 sigma, so the other 31 weights of block 3 all round to 0 and their error is
    # the weight itself (the outlier maps to q = 0 exactly): measured RMS = sqrt(sum w^2 / 32), well below
    # the model's Delta / sqrt(12)
    po, mo = qe.block_rms(wo, "q4_0")
    blk = wo[0, 96:128].astype(np.float64)
    expect = np.sqrt(np.sum(np.delete(blk, 5) ** 2) / 32)
    assert mo[0, 3] == pytest.approx(expect, rel=1e-6)
    assert mo[0, 3] < 0.5 * po[0, 3]
    share, frac = qe.outlier_share(wo, "q4_0")
    assert frac == 1 / 8 and share > 0.5


def test_error_model_rows_on_the_chapter_weights():
    rows = {(r["weights"], r["format"]): r for r in qe.error_model_rows(qe.chapter_weights(shape=(16, 1024)))}
    g8, g4 = rows[("Gaussian", "Q8_0")], rows[("Gaussian", "Q4_0")]
    assert g8["outlier_blocks"] == 0.0 and g4["outlier_blocks"] == 0.0
    assert 0.97 < g8["ratio"] < 1.0 and 0.97 < g4["ratio"] < 1.03
    o8, o4 = rows[("Gaussian + outliers", "Q8_0")], rows[("Gaussian + outliers", "Q4_0")]
    assert o8["gauss"] is None and o4["outlier_blocks"] > 0
    assert o4["ratio"] < g4["ratio"]  # the model over-predicts where the grid is coarser than the data


@pytest.mark.parametrize("size", [(8, 1024), (64, 512), (16, 4096)])
def test_rms_predict_tolerance_passes_the_model_and_rejects_wrong_steps(size):
    """The exercise's tolerance, on its own inputs: the model's prediction passes on every seed tried,
    with and without edge values; predictions from a wrong step (amax/7 for Q4_0, 14 % high) or a
    wrong constant (divide by 12 instead of sqrt 12) fail."""
    rtol, atol = qe.rms_predict_tol(size, np.dtype("float64"))
    assert atol == 0.0 and rtol < 0.1
    for seed in range(20):
        rng = np.random.default_rng(seed)
        for X in (qe.rms_predict_inputs(size, None, rng)[0], qe.rms_predict_edge_inputs(size, None, rng)[0]):
            ref = qe.rms_predict_reference(X)
            pred = np.array([qe.predicted_rms(X, "q8_0"), qe.predicted_rms(X, "q4_0")])
            assert np.all(np.abs(pred - ref) <= rtol * ref), (seed, pred, ref, rtol)
            assert np.abs(pred[1] * 8 / 7 - ref[1]) > rtol * ref[1]
            assert np.abs(pred[0] / np.sqrt(12) - ref[0]) > rtol * ref[0]
