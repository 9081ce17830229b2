"""LayerNorm and RMSNorm (chapter 7): the float64 oracle, the inputs, the edge cases, the tolerances and the four
ops (layernorm, rmsnorm, layernorm_bwd, rmsnorm_bwd). The kernels are in norms_cpu (CPU rungs and yardsticks),
norms_fwd (the GPU forward ladder) and norms_bwd (the GPU backward ladder); kernels_src.ops.norms hands all of
their names on.

LayerNorm  x (M,N), gamma (N,), beta (N,) -> y (M,N), mean (M,), rstd (M,)
           mean_i = sum_j x_ij / N;  var_i = sum_j (x_ij - mean_i)^2 / N   (biased, as in PyTorch)
           rstd_i = 1 / sqrt(var_i + eps)                                   (eps INSIDE the square root)
           y_ij = (x_ij - mean_i) * rstd_i * gamma_j + beta_j
           backward: dy, x, mean, rstd, gamma -> dx (M,N), dgamma (N,), dbeta (N,)
RMSNorm    x (M,N), gamma (N,) -> y (M,N), rstd (M,)
           rstd_i = 1 / sqrt(sum_j x_ij^2 / N + eps);  y_ij = x_ij * rstd_i * gamma_j
           backward: dy, x, rstd, gamma -> dx (M,N), dgamma (N,)
eps = 1e-5 for both (EPS below). mean and rstd are saved by the forward for the backward, as PyTorch
and llm.c do.
"""
import math
import numpy as np

from ..registry import EDGE_INPUTS
from ..registry import define_op


EPS = 1e-5
EPS32 = np.float32(EPS)


# --------------------------------------------------------------------------------------- references
def ln_reference(x, gamma, beta):
    """float64 oracle for LayerNorm: returns y, mean, rstd."""
    mean = x.mean(axis=-1)
    var = ((x - mean[:, None]) ** 2).mean(axis=-1)  # biased variance
    rstd = 1.0 / np.sqrt(var + EPS)  # eps inside the square root
    y = (x - mean[:, None]) * rstd[:, None] * gamma + beta
    return y, mean, rstd


def ln_bwd_reference(dy, x, mean, rstd, gamma):
    """float64 oracle for the LayerNorm backward: dx, dgamma, dbeta (mean, rstd as saved by forward)."""
    xhat = (x - mean[:, None]) * rstd[:, None]
    g = dy * gamma  # gradient with respect to xhat
    dx = rstd[:, None] * (g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def rms_reference(x, gamma):
    """float64 oracle for RMSNorm: returns y, rstd."""
    rstd = 1.0 / np.sqrt((x * x).mean(axis=-1) + EPS)
    return x * rstd[:, None] * gamma, rstd


def rms_bwd_reference(dy, x, rstd, gamma):
    """float64 oracle for the RMSNorm backward: dx, dgamma."""
    g = dy * gamma
    n = x.shape[-1]
    dx = rstd[:, None] * (g - x * (rstd ** 2)[:, None] * (g * x).sum(axis=-1, keepdims=True) / n)
    return dx, (dy * x * rstd[:, None]).sum(axis=0)


def _x(size, dtype, rng):
    """Rows with their own offset (in [-2, 2]) and spread (in [0.5, 2]), so mean and rstd vary by row."""
    m, n = size
    off = rng.uniform(-2, 2, (m, 1))
    scale = rng.uniform(0.5, 2, (m, 1))
    return (off + scale * rng.standard_normal((m, n))).astype(dtype)


def ln_make_inputs(size, dtype, rng):
    m, n = size
    x = _x(size, dtype, rng)
    gamma = (1 + 0.1 * rng.standard_normal(n)).astype(dtype)
    beta = (0.1 * rng.standard_normal(n)).astype(dtype)
    return x, gamma, beta


def rms_make_inputs(size, dtype, rng):
    m, n = size
    return _x(size, dtype, rng), (1 + 0.1 * rng.standard_normal(n)).astype(dtype)


def ln_bwd_make_inputs(size, dtype, rng):
    x, gamma, _ = ln_make_inputs(size, dtype, rng)
    _, mean, rstd = ln_reference(x.astype(np.float64), gamma.astype(np.float64), 0.0)
    dy = rng.standard_normal(x.shape).astype(dtype)
    return dy, x, mean.astype(dtype), rstd.astype(dtype), gamma


def rms_bwd_make_inputs(size, dtype, rng):
    x, gamma = rms_make_inputs(size, dtype, rng)
    _, rstd = rms_reference(x.astype(np.float64), gamma.astype(np.float64))
    dy = rng.standard_normal(x.shape).astype(dtype)
    return dy, x, rstd.astype(dtype), gamma


# ------------------------------------------------------------------------------------- edge inputs
EDGE_CASES = ("zero rows", "constant rows", "small variance", "huge magnitude", "length-1 rows")


def edge_x(case, size, dtype, rng):
    """x for one edge case: rows of zeros (variance 0: y = beta, rstd = 1/sqrt(eps)), constant rows
    (variance 0 again, any value), rows of spread 1e-3 (variance 1e-6 < eps: eps decides rstd), rows of
    magnitude 1e15 (squares 1e30, still finite in float32), or rows of length 1 (N is ignored)."""
    m, n = size
    if case == "zero rows":
        x = np.zeros((m, n))
    elif case == "constant rows":
        x = np.repeat(rng.uniform(-3, 3, (m, 1)), n, axis=1)
    elif case == "small variance":
        x = 1e-3 * rng.standard_normal((m, n))
    elif case == "huge magnitude":
        x = 1e15 * (3 + rng.standard_normal((m, n)))
    elif case == "length-1 rows":
        x = rng.standard_normal((m, 1))
    else:
        raise ValueError(case)
    return x.astype(dtype)


def edge_tol(case, x, gamma, dy=None):
    """Rows of variance 0 (constant rows, rows of length 1) have rstd = 1/sqrt(eps) ~ 316, which multiplies
    every rounding error of a term that cancels exactly in the reference: a float32 mean off by an ulp in
    y, or, in the backward, dy*gamma minus its own row mean (on the GPU the compiler fuses the product and
    the subtraction into one FMA, which keeps the product's rounding error instead of cancelling it). Allow
    a few ulps of those terms, times rstd, there (``dy``: the backward's upstream gradient); every other
    case uses the op's normal tolerance."""
    if case in ("constant rows", "length-1 rows"):
        amp = 1.0 / math.sqrt(EPS)
        scale = max(float(np.max(np.abs(x))), float(np.max(np.abs(dy))) if dy is not None else 0.0)
        return (1e-5, 1e-5 + amp * 4 * float(np.finfo(np.float32).eps) * scale * float(np.max(np.abs(gamma))))
    return (1e-5, 1e-5)


def edge_inputs(op_name, case, size, dtype, rng):
    """Inputs of ``op_name`` whose x is :func:`edge_x`'s."""
    x = edge_x(case, size, dtype, rng)
    n = x.shape[1]
    gamma = (1 + 0.1 * rng.standard_normal(n)).astype(dtype)
    if op_name == "layernorm":
        return x, gamma, (0.1 * rng.standard_normal(n)).astype(dtype)
    if op_name == "rmsnorm":
        return x, gamma
    dy = rng.standard_normal(x.shape).astype(dtype)
    if op_name == "layernorm_bwd":
        _, mean, rstd = ln_reference(x.astype(np.float64), gamma.astype(np.float64), 0.0)
        return dy, x, mean.astype(dtype), rstd.astype(dtype), gamma
    if op_name == "rmsnorm_bwd":
        _, rstd = rms_reference(x.astype(np.float64), gamma.astype(np.float64))
        return dy, x, rstd.astype(dtype), gamma
    raise ValueError(op_name)


def _mixed_edges(op_name):
    """For the grader (edge=True): rows cycling through zeros, spread 1e-3, magnitude 1e15 and ordinary
    rows, all in one input (the cases whose float32 answers are exact enough for the op's tolerance)."""
    def make(size, dtype, rng):
        m, n = size
        inputs = list(edge_inputs(op_name, "zero rows", size, dtype, rng))
        xi = 0 if op_name in ("layernorm", "rmsnorm") else 1
        x = _x(size, np.float64, rng)
        for i in range(m):
            k = i % 4
            if k == 0:
                x[i] = 0.0
            elif k == 1:
                x[i] = 1e-3 * rng.standard_normal(n)
            elif k == 2:
                x[i] = 1e15 * (3 + rng.standard_normal(n))
        x = x.astype(dtype)
        inputs[xi] = x
        gamma = inputs[-1] if op_name != "layernorm" else inputs[1]
        if op_name == "layernorm_bwd":
            _, mean, rstd = ln_reference(x.astype(np.float64), gamma.astype(np.float64), 0.0)
            inputs[2], inputs[3] = mean.astype(dtype), rstd.astype(dtype)
        elif op_name == "rmsnorm_bwd":
            _, rstd = rms_reference(x.astype(np.float64), gamma.astype(np.float64))
            inputs[2] = rstd.astype(dtype)
        return tuple(inputs)

    return make


for _op in ("layernorm", "rmsnorm", "layernorm_bwd", "rmsnorm_bwd"):
    EDGE_INPUTS[_op] = _mixed_edges(_op)


def fwd_tol(size, dtype):
    """y = (x - mean) * rstd * gamma + beta is O(1): each factor carries a few eps of relative error
    (the mean and variance are tree sums of N terms, error ~log2(N) eps), so absolute errors of a few
    1e-6 on values up to ~5; mean and rstd are compared with the same bound."""
    return (1e-5, 1e-5)


def bwd_tol(size, dtype):
    """dx is O(1) like y. dgamma and dbeta are sums over the M rows of O(1) terms: error ~sqrt(M) eps
    relative to their typical size sqrt(M), so the absolute allowance grows like sqrt(M)."""
    m = size[0]
    return (1e-5, 1e-5 * max(1.0, math.sqrt(m)))


SIZES = {"check": [(1, 1), (3, 7), (5, 33), (2, 257), (64, 1000), (17, 4099), (5, 4096), (3, 12289), (2, 40000)],
         "check_sim": [(1, 1), (3, 7), (5, 33), (3, 36), (2, 257)],
         "bench": [(1024, 1024), (4096, 4096)],
         "bench_gpu": [(16384, 4096)],
         "bench_sim": [(5, 33)]}
define_op("layernorm", reference=ln_reference, make_inputs=ln_make_inputs, chapter=7, title="LayerNorm forward",
          size_names=("M", "N"), kind="memory", tol=fwd_tol, output_names=("y", "mean", "rstd"), sizes=SIZES,
          flops=lambda s: 7 * s[0] * s[1], bytes=lambda s, b: (2 * s[0] * s[1] + 2 * s[1] + 2 * s[0]) * b)
define_op("rmsnorm", reference=rms_reference, make_inputs=rms_make_inputs, chapter=7, title="RMSNorm forward",
          size_names=("M", "N"), kind="memory", tol=fwd_tol, output_names=("y", "rstd"), sizes=SIZES,
          flops=lambda s: 4 * s[0] * s[1], bytes=lambda s, b: (2 * s[0] * s[1] + s[1] + s[0]) * b)
define_op("layernorm_bwd", reference=ln_bwd_reference, make_inputs=ln_bwd_make_inputs, chapter=7,
          title="LayerNorm backward", size_names=("M", "N"), kind="memory", tol=bwd_tol,
          output_names=("dx", "dgamma", "dbeta"), sizes=SIZES,
          flops=lambda s: 12 * s[0] * s[1], bytes=lambda s, b: (3 * s[0] * s[1] + 3 * s[1] + 2 * s[0]) * b)
define_op("rmsnorm_bwd", reference=rms_bwd_reference, make_inputs=rms_bwd_make_inputs, chapter=7,
          title="RMSNorm backward", size_names=("M", "N"), kind="memory", tol=bwd_tol,
          output_names=("dx", "dgamma"), sizes=SIZES,
          flops=lambda s: 9 * s[0] * s[1], bytes=lambda s, b: (3 * s[0] * s[1] + 2 * s[1] + s[0]) * b)
