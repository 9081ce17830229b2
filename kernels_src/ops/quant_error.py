"""quant_error: how large is the rounding error of GGML's Q8_0 and Q4_0, and can we predict it? (chapter 11)

Shapes (fixed letters)
  W (M,K) fp32 weights, K a multiple of 32; each row is cut into nb = K/32 blocks of 32 along K (as in
  ``quant``). Per block b of row m: amax[m,b] = max |w| over the block, and the grid step Delta[m,b].

The model
  Both formats round each weight to a grid with step Delta = |d|, the block's scale:
      Q8_0  d = amax/127                    grid d * {-127..127}, symmetric
      Q4_0  d = max/-8 (signed max)         grid d * {-8..7}: 16 levels, Delta = amax/8
  Where the grid is fine compared with the spread of the weights, the rounding error of a weight is
  close to uniform on [-Delta/2, Delta/2]; its variance is Delta^2/12. Every block holds 32 weights, so
  the predicted mean squared error is the mean over blocks of Delta^2/12, and
      predicted RMS = sqrt(mean_b(Delta_b^2) / 12).
  For Gaussian weights of std sigma, Delta is amax/L with amax the largest of 32 |N(0, sigma^2)|:
      E[amax^2] = integral_0^inf 2t (1 - F(t)^32) dt,  F(t) = erf(t / (sigma sqrt 2)),
  which ``gaussian_amax_moments`` integrates numerically (E[amax^2] ~ 5.5 sigma^2 for 32 weights).

Where the model is off (each is measured by a function below and tested in tests/test_ch11_quantization.py)
  - the block's largest weight is reproduced exactly (up to the fp16 rounding of d): 1 weight in 32
    has no error, so the measured MSE is ~31/32 of the prediction (RMS -1.6 %);
  - Q4_0's grid is asymmetric: the side opposite the signed max has 7 steps, and a weight there beyond
    7.5 steps clamps at q = 15, with an error up to a whole step (``q4_0_clamped``);
  - d is stored in fp16 (relative rounding <= 2^-11), so q*d moves by up to |q| * d * 2^-11 (largest
    for Q8_0's |q| ~ 127: 0.06 of a step at most, a negligible share of the variance);
  - where one outlier sets Delta far above the spread of the other 31 weights (Q4_0: an outlier of
    more than ~10 sigma), those weights all round to 0 and their error is the weight itself, smaller
    than Delta^2/12: the model then over-predicts (``block_rms``, figure in the chapter).

Exercise op (graded, like the chapter's other exercises)
  quant_rms_predict   X (M,K) fp32 -> r (2,): the *measured* RMS round-trip error of [Q8_0, Q4_0]
                      (the oracle is a measurement); the student computes the prediction, and the
                      tolerance (``rms_predict_tol``) is the model's bias plus 6 standard deviations of
                      the measured RMS, derived below.
"""
from __future__ import annotations

import math

import numpy as np

from ..registry import EDGE_INPUTS, exercise_op
from .quant import DEQUANT, FORMATS, QK, QUANT, outlier_weights

LEVELS = {"q8_0": 127.0, "q4_0": 8.0}  # Delta = amax / LEVELS[fmt]


# ============================================================================ the model
def _blocks(W):
    W = np.asarray(W, dtype=np.float64)
    M, K = W.shape
    if K % QK:
        raise ValueError(f"K = {K} is not a multiple of {QK}")
    return W.reshape(M, K // QK, QK)


def block_steps(W, fmt):
    """Delta (M, nb) float64: the grid step of each block, amax/127 (Q8_0) or amax/8 (Q4_0), from the
    weights in float64 (the stored fp16 d differs by at most 2^-11 relative)."""
    return np.abs(_blocks(W)).max(axis=2) / LEVELS[fmt]


def stored_steps(W, fmt):
    """|d| (M, nb) float64 as GGML stores it: the fp16 scale read back from the packed blocks."""
    Xq = QUANT[fmt](np.asarray(W, dtype=np.float32))
    M = Xq.shape[0]
    b = Xq.reshape(M, -1, FORMATS[fmt])
    return np.abs(b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64))


def predicted_rms(W, fmt, steps=None):
    """sqrt(mean over blocks of Delta^2 / 12): the uniform-rounding prediction of the RMS error."""
    d = block_steps(W, fmt) if steps is None else np.asarray(steps, dtype=np.float64)
    return float(math.sqrt(np.mean(d * d) / 12.0)) if d.size else 0.0


def roundtrip_error(W, fmt):
    """dequant(quant(W)) - W in float64, (M, K): the error GGML's format actually makes."""
    W32 = np.asarray(W, dtype=np.float32)
    return DEQUANT[fmt](QUANT[fmt](W32)) - W32.astype(np.float64)


def measured_rms(W, fmt):
    """RMS of the round-trip error over all weights (float64)."""
    e = roundtrip_error(W, fmt)
    return float(math.sqrt(np.mean(e * e))) if e.size else 0.0


def block_rms(W, fmt):
    """(predicted, measured) RMS error of each block, (M, nb) each: Delta/sqrt(12) against the round trip."""
    e = roundtrip_error(W, fmt).reshape(_blocks(W).shape)
    return block_steps(W, fmt) / math.sqrt(12.0), np.sqrt(np.mean(e * e, axis=2))


def q4_0_clamped(W):
    """Fraction of weights that Q4_0 clamps: x/d + 8.5 >= 16, i.e. more than 7.5 steps on the side
    opposite the block's signed max (the grid ends at 7 steps there)."""
    b = _blocks(W)
    i = np.abs(b).argmax(axis=2)
    mx = np.take_along_axis(b, i[..., None], axis=2)
    d = mx / -8.0
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(d != 0, b / np.where(d != 0, d, 1.0), 0.0)
    return float(np.mean(v + 8.5 >= 16.0))


def fp16_scale_error(W, fmt):
    """Largest relative change of a block's step from storing d in fp16 (at most 2^-11 for normal fp16)."""
    d32 = block_steps(W, fmt)
    d16 = stored_steps(W, fmt)
    ok = d32 > 0
    return float(np.max(np.abs(d16[ok] - d32[ok]) / d32[ok])) if ok.any() else 0.0


def outlier_blocks(W, k=6.0):
    """(M, nb) bool: blocks holding a weight beyond k robust standard deviations of the whole tensor
    (sigma estimated as 1.4826 * the median |w|'s deviation, which a few outliers do not move)."""
    w = np.asarray(W, dtype=np.float64)
    sigma = 1.4826 * float(np.median(np.abs(w - np.median(w))))
    return np.abs(_blocks(W)).max(axis=2) > k * sigma


def outlier_share(W, fmt):
    """Fraction of the measured squared error that sits in blocks holding an outlier, and the fraction
    of blocks that hold one."""
    e = roundtrip_error(W, fmt).reshape(_blocks(W).shape)
    sq = np.sum(e * e, axis=2)
    ob = outlier_blocks(W)
    total = float(sq.sum())
    return (float(sq[ob].sum()) / total if total > 0 else 0.0), float(ob.mean())


# ============================================================================ Gaussian weights
def gaussian_amax_moments(n=QK, sigma=1.0, grid=40001, upper=12.0):
    """(E[amax], E[amax^2]) of the largest |x| of n independent N(0, sigma^2) values, by integrating
    the tail 1 - F(t)^n with F(t) = P(|x| <= t) = erf(t / sqrt 2) (trapezoid rule, t in [0, 12] sigma;
    the tail beyond 12 sigma is below 1e-30)."""
    t = np.linspace(0.0, upper, grid)
    F = np.array([math.erf(v / math.sqrt(2.0)) for v in t])
    tail = 1.0 - F ** n
    return float(np.trapezoid(tail, t)) * sigma, float(np.trapezoid(2.0 * t * tail, t)) * sigma ** 2


def gaussian_predicted_rms(fmt, sigma=1.0, n=QK):
    """Predicted RMS error for N(0, sigma^2) weights: sqrt(E[amax^2] / 12) / LEVELS[fmt]."""
    return math.sqrt(gaussian_amax_moments(n, sigma)[1] / 12.0) / LEVELS[fmt]


def error_model_rows(weights: dict) -> list[dict]:
    """One row per (weights, format): the Gaussian formula's prediction (where the weights are Gaussian
    with known sigma), the prediction from the blocks' own Delta, the measured RMS, their ratio, the
    SNR in dB, and the share of the squared error in blocks that hold an outlier.

    ``weights`` maps a label to (W, sigma or None)."""
    rows = []
    for label, (W, sigma) in weights.items():
        power = float(np.mean(np.asarray(W, dtype=np.float64) ** 2))
        for fmt in ("q8_0", "q4_0"):
            p, m = predicted_rms(W, fmt), measured_rms(W, fmt)
            share, frac_blocks = outlier_share(W, fmt)
            rows.append({"weights": label, "format": fmt.upper(),
                         "gauss": gaussian_predicted_rms(fmt, sigma) if sigma else None,
                         "predicted": p, "measured": m, "ratio": m / p if p else float("nan"),
                         "snr_db": 10 * math.log10(power / (m * m)) if m > 0 else math.inf,
                         "outlier_share": share, "outlier_blocks": frac_blocks})
    return rows


def chapter_weights(shape=(64, 4096), seed=0, std=0.02):
    """The chapter's two sets of weights: Gaussian (std 0.02), and the same with outliers
    (``quant.outlier_weights``: one weight in 1000 multiplied by 20)."""
    rng = np.random.default_rng(seed)
    g = (rng.standard_normal(shape) * std).astype(np.float32)
    o = outlier_weights(shape, np.random.default_rng(seed), std=std)
    return {"Gaussian": (g, std), "Gaussian + outliers": (o, None)}


# ============================================================================ the exercise: predict the RMS
ROW_STD_DECADES = 2.0  # rows' standard deviations spread log-uniformly over this many decades
MODEL_BIAS = 0.02  # |measured/predicted - 1| the model leaves on Gaussian blocks: 31/32 exact weights
#                    (-1.6 % in RMS), Q4_0's clamped side (+0.5 %), fp16 d (< 0.1 %)
Z_SIGMAS = 6.0  # standard deviations of the measured RMS allowed beyond the bias


def row_stds(M):
    """The rows' standard deviations: 10^-2 .. 10^0, evenly spaced in log (M = 1: just 1.0)."""
    return np.logspace(-ROW_STD_DECADES, 0.0, M) if M > 1 else np.ones(1)


def rms_predict_inputs(size, dtype, rng):
    """Gaussian rows whose standard deviations spread over two decades (in shuffled order), so that
    averaging Delta^2 over blocks and averaging Delta and then squaring give different answers."""
    M, K = size
    s = rng.permutation(row_stds(M)) * rng.uniform(0.5, 2.0)
    return (rng.standard_normal((M, K)) * s[:, None]).astype(np.float32),


def rms_predict_edge_inputs(size, dtype, rng):
    """As ``rms_predict_inputs``, plus blocks of zeros (Delta = 0, no error: a prediction that divides by
    amax turns them into NaN) and a row scaled by 1e-3 (its fp16 steps are subnormal but its share of
    the error is ~1e-6)."""
    (X,) = rms_predict_inputs(size, dtype, rng)
    M, K = X.shape
    flat = X.reshape(M, K // QK, QK)
    for i in rng.permutation(M * (K // QK))[: (M * K // QK) // 8]:  # none when there are fewer than 8 blocks
        flat[i // (K // QK), i % (K // QK)] = 0.0
    X[rng.integers(M)] *= 1e-3
    return (X,)


def rms_predict_reference(X):
    """The oracle is a measurement: the RMS of GGML's round trip, [Q8_0, Q4_0], in float64."""
    return np.array([measured_rms(X, "q8_0"), measured_rms(X, "q4_0")])


def effective_blocks(size):
    """The number of equal blocks whose mean squared error would scatter as much as this input's:
    (sum Delta^2)^2 / sum Delta^4 over the blocks, from the rows' standard deviations (Delta is
    proportional to its row's std), divided by 1.1 for the spread of amax within a row
    (E[amax^4] / E[amax^2]^2 = 1.04 for 32 Gaussians)."""
    M, K = size
    s2 = row_stds(M) ** 2
    return (K // QK) * float(s2.sum() ** 2 / (s2 * s2).sum()) / 1.1


def rms_predict_tol(size, dtype):
    """Relative tolerance of the predicted RMS against the measured one.

    A uniform error e on [-D/2, D/2] has E[e^2] = D^2/12 and Var(e^2) = D^4/80 - D^4/144 = D^4/180: the
    squared error of one weight scatters by 12/sqrt(180) = 0.894 of its mean. The mean over N = 32 * n_eff
    weights scatters by 0.894/sqrt(N), and its square root (the RMS) by half that. Allowed: the model's
    bias (MODEL_BIAS) plus Z_SIGMAS of that scatter. At (16, 4096) this is 2 % + 6 * 0.39 % = 4.4 %."""
    sd = 0.5 * (12.0 / math.sqrt(180.0)) / math.sqrt(QK * effective_blocks(size))
    return MODEL_BIAS + Z_SIGMAS * sd, 0.0


exercise_op("quant_rms_predict", reference=rms_predict_reference, make_inputs=rms_predict_inputs, chapter=11,
            title="predicted RMS error of Q8_0 and Q4_0 from the block steps", size_names=("M", "K"),
            kind="memory", output_names=("rms",), tol=rms_predict_tol, flops=lambda s: 2 * s[0] * s[1],
            bytes=lambda s, b: 4 * s[0] * s[1],
            sizes={"check": [(8, 1024), (16, 4096)], "check_sim": [(8, 1024)], "bench": [(64, 4096)]})
EDGE_INPUTS["quant_rms_predict"] = rms_predict_edge_inputs
