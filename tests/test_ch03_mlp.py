"""Chapter 3: the linear layer's gradients, ReLU, and the MLP trained with the reference and with kernels.

The registered kernels are checked against their float64 references in tests/test_registry.py. Here we
check the references themselves against finite differences and the explicit Jacobian, the whole MLP's
backward pass, and that kernel-backed training follows the float64 reference within the stated
tolerance (CPU kernels at full size; GPU kernels at a tiny size in the simulator, full size on a GPU).
"""
import numpy as np
import pytest

import kernels_src
from kernels_src import device, mlp, parity
from kernels_src.ops import linear, relu_mlp
from kernels_src.registry import Variant


def _central_grad(f, a, h=1e-6):
    return mlp.numerical_grad(f, a, h)


@pytest.mark.parametrize("M,K,N", [(1, 1, 1), (3, 5, 2), (7, 4, 6)])
def test_linear_gradients_match_finite_differences(M, K, N):
    """With the probe loss L = sum(G * Y), dL/dY is exactly G, so the three references must be dL/dW,
    dL/dX and dL/db."""
    rng = np.random.default_rng(M * 100 + K * 10 + N)
    X, W, b = rng.standard_normal((M, K)), rng.standard_normal((K, N)), rng.standard_normal(N)
    G = rng.standard_normal((M, N))

    def L():
        return float(np.sum(G * linear.ref_fwd(X, W, b)))

    for got, arr in ((linear.ref_bwd_dw(X, G), W), (linear.ref_bwd_dx(G, W), X), (linear.ref_bwd_db(G), b)):
        assert mlp.rel_error(got, _central_grad(L, arr)) < 1e-7


def test_jacobian_contraction_is_the_matmul():
    """Materialise dY/dW (M,N,K,N) and dY/dX (M,N,M,K) for a tiny layer and contract with G."""
    rng = np.random.default_rng(0)
    M, K, N = 3, 4, 2
    X, W, G = rng.standard_normal((M, K)), rng.standard_normal((K, N)), rng.standard_normal((M, N))
    JW = np.einsum("mk,nj->mnkj", X, np.eye(N))  # dY[m,n]/dW[k,j] = X[m,k] [n == j]
    JX = np.einsum("ip,kn->inpk", np.eye(M), W)  # dY[i,n]/dX[p,k] = [i == p] W[k,n]
    assert np.allclose(np.einsum("mn,mnkj->kj", G, JW), linear.ref_bwd_dw(X, G))
    assert np.allclose(np.einsum("in,inpk->pk", G, JX), linear.ref_bwd_dx(G, W))
    assert JW.size == M * N * K * N


def test_relu_backward_matches_finite_differences():
    rng = np.random.default_rng(1)
    Z = rng.standard_normal((5, 6))
    Z[np.abs(Z) < 1e-3] = 0.5  # stay away from the kink, where the derivative does not exist
    G = rng.standard_normal(Z.shape)
    num = _central_grad(lambda: float(np.sum(G * relu_mlp.ref_relu(Z))), Z)
    assert mlp.rel_error(relu_mlp.ref_relu_bwd(G, Z), num) < 1e-7


def test_mlp_backward_matches_finite_differences():
    X, labels = mlp.make_spirals(n_per_class=10)
    errs = mlp.grad_check(mlp.init_params(hidden=16, seed=3), X, labels)
    assert set(errs) == set(mlp.PARAMS)
    assert max(errs.values()) < 1e-6, errs


def test_grad_check_detects_a_wrong_backward(monkeypatch):
    """The check can fail: a backward pass that forgets the ReLU mask is caught."""
    X, labels = mlp.make_spirals(n_per_class=10)
    monkeypatch.setattr(mlp, "relu_bwd", lambda G, Z: G)
    errs = mlp.grad_check(mlp.init_params(hidden=16, seed=3), X, labels)
    assert errs["W1"] > 1e-3 and errs["W2"] < 1e-6


def test_softmax_xent_gradient():
    rng = np.random.default_rng(2)
    Z = rng.standard_normal((6, 3))
    labels = rng.integers(0, 3, 6)
    _, G = mlp.softmax_xent(Z, labels)
    num = _central_grad(lambda: mlp.softmax_xent(Z, labels)[0], Z)
    assert mlp.rel_error(G, num) < 1e-7


def test_spirals_are_reproducible_and_balanced():
    X1, y1 = mlp.make_spirals(seed=5)
    X2, y2 = mlp.make_spirals(seed=5)
    assert X1.shape == (300, 2) and np.array_equal(X1, X2) and np.array_equal(y1, y2)
    assert np.bincount(y1).tolist() == [100, 100, 100]
    assert np.abs(X1).max() < 1.5


@pytest.mark.parametrize("op,size", [("linear_fwd", (17, 33, 9)), ("linear_bwd_dw", (31, 7, 5)),
                                     ("linear_bwd_dx", (31, 7, 5))])
def test_linear_tolerance_catches_a_missing_term(op, size):
    """A dot product that stops one term early must fail (the tolerance is not vacuous)."""
    ref = kernels_src.get_op(op).reference

    def short(out, *inputs):
        a = [np.asarray(v, dtype=np.float64) for v in inputs]
        if op == "linear_fwd":
            X, W, b = a
            out[...] = X[:, :-1] @ W[:-1] + b
        elif op == "linear_bwd_dw":
            X, G = a
            out[...] = X[:-1].T @ G[:-1]
        else:
            G, W = a
            out[...] = G[:, :-1] @ W[:, :-1].T
        assert out.shape == ref(*a).shape

    rep = parity.check_variant(Variant(op, "cpu", "short", short), kernels_src.get_op(op), size)
    assert not rep.ok


def test_cpu_kernel_training_follows_the_reference():
    """The chapter's claim: 2000 steps of full-batch gradient descent with the float32 CPU kernels stay
    within mlp.LOSS_TOL of the float64 reference at every step, and both learn the spirals."""
    res = mlp.compare_training("cpu", steps=2000)
    assert res["max_abs_gap"] <= mlp.LOSS_TOL, res["max_abs_gap"]
    assert res["losses_reference"][-1] < 0.25 * res["losses_reference"][0]
    assert res["accuracy_reference"] > 0.95 and res["accuracy_kernels"] > 0.95


def test_gpu_kernel_training_follows_the_reference():
    """Simulated: 2 steps at a tiny size (each simulated launch takes ~0.1 s). On a real GPU: full size."""
    if not device.GPU_VARIANTS_RUN:
        pytest.skip(f"GPU variants are off ({device.REASON})")
    if device.SIMULATED:
        X, labels = mlp.make_spirals(n_per_class=4)
        ref = mlp.train(X, labels, backend="numpy", steps=2, hidden=8)
        gpu = mlp.train(X, labels, backend="gpu", steps=2, hidden=8)
        assert np.max(np.abs(np.array(ref.losses) - np.array(gpu.losses))) <= mlp.LOSS_TOL
        for p in mlp.PARAMS:
            assert np.allclose(gpu.params[p], ref.params[p], rtol=1e-4, atol=1e-5), p
    else:
        res = mlp.compare_training("gpu", steps=2000)
        assert res["max_abs_gap"] <= mlp.LOSS_TOL, res["max_abs_gap"]


# ------------------------------------------------------------------ the exercises (solutions/ch03_*)
SLUG = "ch03_linear_backward"


def _grade(answers, tmp_path, questions=None):
    from _grading_support import grade_answers

    return grade_answers(SLUG, answers, tmp_path, questions)


@pytest.mark.slow
def test_exercise_rejects_a_transposed_dw(tmp_path):
    """dW[k, n] built from X[k, m]-style indexing (a confused transpose) must fail."""
    wrong = '''@njit
def dw_cpu(dW, X, G):
    M, K = X.shape
    N = G.shape[1]
    for k in range(K):
        for n in range(N):
            acc = 0.0
            for m in range(min(M, K)):
                acc += X[k % M, m] * G[m, n]
            dW[k, n] = acc
'''
    rec = _grade({"q1": wrong}, tmp_path, questions=["q1"])
    assert rec.score == 0, rec.results
