"""Chapter 2: the hand-derived gradients of y = w*x + b, gradient descent, and the regression_grad op.

Every kernel variant is checked against the float64 reference by tests/test_registry.py. Here we check
the reference itself (against finite differences and an independent least-squares solve), the chapter's
helpers, and that the op's tolerance is tight enough to catch a kernel that drops one sample.
"""
import math

import numpy as np
import pytest

import kernels_src
from kernels_src import parity
from kernels_src.figures import regression as regfig
from kernels_src.ops import scalar_regression as sr
from kernels_src.registry import Variant


def _data(n, seed):
    rng = np.random.default_rng(seed)
    x, y = sr.make_data(n, rng, dtype=np.float64)
    return x, y, rng


def _central(f, v, h=1e-6):
    return (f(v + h) - f(v - h)) / (2 * h)


@pytest.mark.parametrize("seed", range(5))
def test_reference_gradients_match_finite_differences(seed):
    x, y, rng = _data(50, seed)
    w, b = rng.uniform(-2, 3), rng.uniform(-2, 2)
    loss, dw, db = (a[0] for a in sr.reference(w, b, x, y))
    assert loss == pytest.approx(float(np.mean((w * x + b - y) ** 2)), rel=1e-12)
    num_dw = _central(lambda v: sr.reference(v, b, x, y)[0][0], w)
    num_db = _central(lambda v: sr.reference(w, v, x, y)[0][0], b)
    assert dw == pytest.approx(num_dw, rel=1e-7, abs=1e-9)
    assert db == pytest.approx(num_db, rel=1e-7, abs=1e-9)
    # the chapter's float64 helper computes the same two numbers
    g = regfig.grads(w, b, x, y)
    assert g[0] == pytest.approx(dw, rel=1e-12) and g[1] == pytest.approx(db, rel=1e-12)


def test_gradients_vanish_at_the_least_squares_solution():
    x, y, _ = _data(200, 7)
    A = np.column_stack([x, np.ones_like(x)])
    w, b = np.linalg.solve(A.T @ A, A.T @ y)  # normal equations: independent of the code under test
    _, dw, db = (a[0] for a in sr.reference(w, b, x, y))
    assert abs(dw) < 1e-10 and abs(db) < 1e-10


def test_gradient_descent_converges_to_least_squares():
    x, y, _ = _data(500, 3)
    path = regfig.descend(x, y, -1.0, 1.5, lr=0.2, steps=400)
    w_opt, b_opt = np.polyfit(x, y, 1)
    assert path[-1] == pytest.approx([w_opt, b_opt], abs=1e-6)
    losses = regfig.mse(path[:, 0], path[:, 1], x, y)
    assert np.all(np.diff(losses) <= 1e-15), "with a small learning rate the loss must never go up"


def test_learning_rate_stability_threshold():
    """Gradient descent on this quadratic loss converges iff lr < 2 / (largest Hessian eigenvalue)."""
    x, y, _ = _data(500, 4)
    hess = 2 * np.array([[np.mean(x * x), np.mean(x)], [np.mean(x), 1.0]])
    lr_max = 2 / np.linalg.eigvalsh(hess).max()
    ok = regfig.descend(x, y, 0.0, 0.0, lr=0.95 * lr_max, steps=3000)
    bad = regfig.descend(x, y, 0.0, 0.0, lr=1.05 * lr_max, steps=3000)
    assert ok[-1] == pytest.approx(np.polyfit(x, y, 1), abs=1e-4)
    assert abs(bad[-1][0]) > 1e3 or len(bad) < 3001, "above the threshold the iterates must blow up"


def _dropping(k):
    def kernel(loss, dw, db, w, b, x, y):  # forgets the last k samples, as an off-by-k guard would
        n = x.shape[0]
        r = (w * x[: n - k] + b - y[: n - k]).astype(np.float64)
        loss[0] = np.sum(r * r) / n
        dw[0] = 2 * np.sum(r * x[: n - k]) / n
        db[0] = 2 * np.sum(r) / n

    return Variant("regression_grad", "cpu", f"drops_{k}", kernel)


def test_tolerance_catches_dropped_samples():
    """The tolerance is not vacuous. One dropped sample changes the result by ~1/n, which float32
    rounding allowance (4 eps x chain, about 1.5e-5) hides beyond n ~ 65,000; so: one dropped sample must fail
    at every checked n from 2 to 4099, and one dropped block of 256 at every larger n."""
    op = kernels_src.get_op("regression_grad")
    for size in op.sizes["check"]:
        if size[0] > 1:
            k = 1 if size[0] <= 4099 else 256
            rep = parity.check_variant(_dropping(k), op, size)
            assert not rep.ok, f"dropping {k} of {size[0]} samples passed: {rep}"


def test_tolerance_is_documented_and_scales_like_sqrt_n():
    small = sr.tolerance((100,), np.float32)
    big = sr.tolerance((1_000_000,), np.float32)
    assert big[0] / small[0] < 2 * math.sqrt(1e4)
    assert sr.tolerance((10,), np.float64) is None


# ----------------------------------------------------------- the atomic rung's sums do not drift (issue 29)
def _adversarial(n):
    """db = (2/n) sum r_i with r_0 = +2^25, r_{n-1} = -2^25 and every other r_i = 1 (x = 0, b = 0): a float32
    running sum that meets the large term first loses every 1 (2^25 + 1 rounds back to 2^25), so it ends near
    0 instead of 2(n-2)/n. In float64 every partial sum is an exact integer, whatever the order."""
    x = np.zeros(n, np.float32)
    y = np.full(n, -1.0, np.float32)
    y[0], y[-1] = -(2.0 ** 25), 2.0 ** 25
    return np.float32(0.75), np.float32(0.0), x, y


def test_adversarial_input_breaks_a_float32_running_sum():
    """The input below is one where the old kernel's float32 accumulation fails (in sample order)."""
    w, b, x, y = _adversarial(1031)
    r = (w * x + b - y).astype(np.float32)
    running = np.cumsum(np.float32(2.0) * r / np.float32(x.size), dtype=np.float32)[-1]
    want = sr.reference(float(w), float(b), x.astype(np.float64), y.astype(np.float64))[2][0]
    assert abs(running - want) / abs(want) > 0.5


@pytest.mark.skipif(not kernels_src.device.GPU_VARIANTS_RUN, reason="GPU variants are off (KERNELS_DEVICE=cpu)")
def test_atomic_rung_sums_exactly_on_the_adversarial_input():
    """Rung 1 on the real GPU or the simulator: its float64 sums keep every 1, so db is right to within
    float32's final rounding (the float32-atomic kernel it replaced returned about 0 here)."""
    cuda = kernels_src.device.cuda
    n = 1031 if kernels_src.device.SIMULATED else (1 << 24) + 3
    w, b, x, y = _adversarial(n)
    outs = [cuda.to_device(np.full(1, np.nan, np.float32)) for _ in range(3)]
    sr.regression_grad_atomic(*outs, w, b, cuda.to_device(x), cuda.to_device(y))
    got = [o.copy_to_host()[0] for o in outs]
    want = [a[0] for a in sr.reference(float(w), float(b), x.astype(np.float64), y.astype(np.float64))]
    assert got[1] == 0.0  # dw: every x is 0
    for g, r in ((got[0], want[0]), (got[2], want[2])):
        assert np.isfinite(g) and abs(g - r) <= (sr.atomic_error_bound(n) + 2.0 ** -24) * abs(r), (got, want)


def test_atomic_error_bound_holds_where_float32_drifted():
    """At n = 2^22 (the H100 showed 3 % at 2^24): emulate rung 1's summation (float32 r_i, a float64 running
    sum in a random order, one rounding to float32) and the old one (a float32 running sum of the scaled
    terms). The new order stays inside :func:`atomic_error_bound`; the old one is far outside it, so the
    bound is a test that a float32 accumulator fails. The loss's terms are all positive: the drift is
    systematic there."""
    n = 1 << 22
    rng = np.random.default_rng(1)
    w, b, x, y = sr.make_inputs((n,), np.dtype(np.float32), rng)
    want = sr.reference(float(w), float(b), x.astype(np.float64), y.astype(np.float64))[0][0]
    r = (w * x + b - y).astype(np.float32)
    r64 = r.astype(np.float64)[rng.permutation(n)]
    new = np.float32(np.cumsum(r64 * r64)[-1] / n)
    old = np.cumsum(r * r * (np.float32(1.0) / np.float32(n)), dtype=np.float32)[-1]
    bound = sr.atomic_error_bound(n)
    assert abs(new - want) / want <= bound
    assert abs(old - want) / want > 100 * bound


def test_plot_helpers_draw(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x, y = sr.make_data(100, np.random.default_rng(0))
    axes = regfig.plot_state(x, y, -0.5, 1.5, lr=0.1, steps=10)
    assert len(axes[0].lines) >= 2
    plt.close("all")


# ------------------------------------------------------------------ the exercises (solutions/ch02_*)
SLUG = "ch02_regression"


def _grade(answers, tmp_path, questions=None):
    from _grading_support import grade_answers

    return grade_answers(SLUG, answers, tmp_path, questions)


@pytest.mark.slow
def test_exercise_rejects_a_gradient_missing_its_factor_2(tmp_path):
    wrong = '''@njit
def regression_cpu(loss, dw, db, w, b, x, y):
    n = x.shape[0]
    s_rr = 0.0
    s_rx = 0.0
    s_r = 0.0
    for i in range(n):
        r = w * x[i] + b - y[i]
        s_rr += r * r
        s_rx += r * x[i]
        s_r += r
    loss[0] = s_rr / n
    dw[0] = s_rx / n
    db[0] = 2.0 * s_r / n
'''
    rec = _grade({"q1": wrong}, tmp_path, questions=["q1"])
    assert rec.score == 0, rec.results
